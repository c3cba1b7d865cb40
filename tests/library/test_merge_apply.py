"""The merge's fragment apply (memwal.merge_apply): rows located by key, deletion vectors and new fragments
written in tasks, one Update, then the marker commit. Each interleaving is forced at a fault point or a
progress check; each test ends with the exact-view checks of tests/library/test_merge_passes.py (the LSM view
equals the model at EVERY table version, merged_generations never goes back, the merged base is the
model), and the result equals the two-pass merge's on the same generations."""

import uuid

import lance
import pyarrow as pa
import pytest

from memwal import merge_apply
from memwal.mem_wal_index import load_index
from memwal.merge import MergeConfig

from support.apply_runner import pickling_runner, use_fragment_apply
from support.maintenance import merge_region, merge_without_our_lock, write_generations
from support.merge_passes import exact_everywhere, lsm_view, passes_table
from support.tables import lance_core_scan, open_base, rows, view

ONE = MergeConfig(max_generations_per_commit=1, apply="fragments")
TWO = MergeConfig(max_generations_per_commit=2, apply="fragments")
GENS = [([20, 21, 5], "g1", [3, 4]), ([3, 7], "g2", [20]), ([21, 0], "g3", [9])]


class Crash(BaseException):
    """The process dies here (not an OSError: the merge loop does not retry it)."""


@pytest.fixture(autouse=True, params=["index", "scan"])
def lookup_path(request, monkeypatch) -> str:
    """Every case on both lookup paths (keys through the index, fragments' key column scanned) and both
    join paths of the marker commit (tiny tables would always scan)."""
    monkeypatch.setattr(merge_apply, "use_index", lambda ds, keys, pk=(): request.param == "index")
    return request.param


@pytest.fixture(autouse=True)
def fragment_apply(monkeypatch):
    use_fragment_apply(monkeypatch)


def _at(monkeypatch, point: str, action) -> list[str]:
    """Run action(n) the n-th time the apply reaches the fault point `point`."""
    real, hits = merge_apply.fault_point, []

    def hooked(name: str) -> None:
        real(name)
        if name == point:
            hits.append(name)
            action(len(hits))

    monkeypatch.setattr(merge_apply, "fault_point", hooked)
    return hits


def _passes_result(tmp_path, gens, fragment_rows: int) -> dict:
    """The same generations merged by the two-pass merge into a fresh table: what the apply must equal."""
    from types import SimpleNamespace

    loc = SimpleNamespace(uri=str(tmp_path / f"passes-{uuid.uuid4().hex}"), storage_options=None)
    loc.store = lambda: None
    region = passes_table(loc, gens, fragment_rows)
    merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=1, apply="passes"))
    return view(open_base(loc).to_table())


@pytest.mark.parametrize("fragment_rows", [3, 1024])
def test_the_apply_equals_the_two_pass_merge(local_location, tmp_path, monkeypatch, fragment_rows):
    loc = local_location
    region = passes_table(loc, GENS, fragment_rows)
    model, v0 = lsm_view(loc), open_base(loc).version
    assert merge_region(loc.uri, None, region, ONE).generations == [1, 2, 3]
    exact_everywhere(loc, v0, model)
    monkeypatch.undo()
    assert view(open_base(loc).to_table()) == _passes_result(tmp_path, GENS, fragment_rows) == model


def test_a_reader_between_the_update_and_the_marker_sees_the_exact_view(local_location, monkeypatch):
    """Update committed (replacement rows and deletions in the base, merged_generations unmoved) | readers,
    ours and Lance core's | the marker commit. The generations still shadow those keys: exact."""
    loc = local_location
    region = passes_table(loc, GENS, fragment_rows=3)
    model, v0 = lsm_view(loc), open_base(loc).version
    seen = []

    def read(n: int) -> None:
        base = view(open_base(loc).to_table())
        seen.append((n, load_index(loc.uri).merged_generations.get(region, 0), 4 in base, base.get(5)))
        assert lsm_view(loc) == model, "our reader between the Update and the marker differs from the model"
        assert view(lance_core_scan(loc)) == model, "Lance core's reader between the commits differs"

    _at(monkeypatch, "merge.between_update_and_marker", read)
    assert merge_region(loc.uri, None, region, ONE).generations == [1, 2, 3]
    # after gen 1's Update: 4 deleted and 5 replaced in the base, the marker still at 0
    assert seen[0] == (1, 0, False, ("g15", 2.5)), seen
    assert [s[1] for s in seen] == [0, 1, 2], seen
    exact_everywhere(loc, v0, model)


def test_a_crash_between_the_update_and_the_marker_reruns_to_the_same_result(local_location, tmp_path,
                                                                               monkeypatch):
    """The process dies after gen 2's Update; the rerun plans gen 2 again, finds its replaced keys at their new
    addresses and writes them again, deletes nothing twice, and moves the marker once."""
    loc = local_location
    region = passes_table(loc, GENS, fragment_rows=3)
    model, v0 = lsm_view(loc), open_base(loc).version

    def die(n: int) -> None:
        if n == 2:
            raise Crash

    _at(monkeypatch, "merge.between_update_and_marker", die)
    with pytest.raises(Crash):
        merge_region(loc.uri, None, region, ONE)
    assert load_index(loc.uri).merged_generations == {region: 1}
    assert 20 not in view(open_base(loc).to_table()), "gen 2's Update (deleting 20) was committed"
    assert lsm_view(loc) == model and view(lance_core_scan(loc)) == model
    use_fragment_apply(monkeypatch)  # the rerun (a new process: no fault)
    monkeypatch.setattr(merge_apply, "fault_point", lambda name: None)
    rerun = merge_region(loc.uri, None, region, ONE)
    assert rerun.generations == [2, 3] and rerun.generations_merged_by_others == 0
    exact_everywhere(loc, v0, model)
    assert view(open_base(loc).to_table()) == _passes_result(tmp_path, GENS, 3)


def test_a_compaction_between_the_apply_and_the_update_makes_it_replan(local_location, monkeypatch):
    """Tasks wrote deletion vectors for fragments of version v | a compaction rewrites those fragments |
    our Update (read version v) is refused by Lance; nothing of it is visible; we replan on the compacted
    version and commit once."""
    loc = local_location
    region = passes_table(loc, GENS[:1], fragment_rows=3)
    model, v0 = lsm_view(loc), open_base(loc).version
    versions = []

    def compact(n: int) -> None:
        if n == 1:
            open_base(loc).optimize.compact_files(target_rows_per_fragment=1000)
            versions.append(open_base(loc).version)

    hits = _at(monkeypatch, "merge.apply_before_commit", compact)
    ours = merge_region(loc.uri, None, region, ONE)
    assert ours.generations == [1] and len(hits) == 2, "the Update was refused and the apply replanned once"
    assert view(open_base(loc, versions[0]).to_table()) == view(open_base(loc, v0).to_table())
    exact_everywhere(loc, v0, model)


def test_a_row_delete_on_a_planned_fragment_makes_the_update_replan(local_location, monkeypatch):
    """Tasks wrote the deletion vector of the fragment [3..5] for gen 1's delete of 4 | a user's Lance delete of
    base key 5 (another row of that fragment) commits | our Update would overwrite that fragment's deletion
    vector: Lance refuses it; we replan on the latest version and both deletions stand."""
    loc = local_location
    region = passes_table(loc, [([20], "g1", [4])], fragment_rows=3)
    v0 = open_base(loc).version

    def delete_five(n: int) -> None:
        if n == 1:
            open_base(loc).delete("id = 5")

    hits = _at(monkeypatch, "merge.apply_before_commit", delete_five)
    assert merge_region(loc.uri, None, region, ONE).generations == [1]
    assert len(hits) == 2, "the Update was refused and the apply replanned once"
    got = view(open_base(loc).to_table())
    assert 4 not in got and 5 not in got and got[20] == ("g120", 10.0) and 3 in got
    assert open_base(loc).version == v0 + 3, "the user's delete, our Update, our marker: nothing else"


def _after_final_check(monkeypatch, action) -> None:
    """Run action() right after the progress check just before our first Update commit."""
    real, calls = merge_apply.check_progress, []

    def hooked(table, since):
        real(table, since)
        calls.append(1)
        if len(calls) == 2:  # the apply's first check, then the one right before its Update
            action()

    monkeypatch.setattr(merge_apply, "check_progress", hooked)


def test_a_merger_without_our_lock_updating_our_keys_after_our_check_is_refused(local_location, monkeypatch):
    """
    we plan gen 1 (updates base key 5) and check progress | a merger that does not take our lock merges gen
    1 | our Update, which deletes 5's old row, shares its fragment with the other merger's: Lance refuses
    it; we replan, see progress moved and find nothing left to merge.
    """
    loc = local_location
    region = passes_table(loc, [([5], "g1", [])])
    model, v0 = lsm_view(loc), open_base(loc).version

    def other() -> None:
        merge_without_our_lock(loc.uri, None, region, config=MergeConfig(apply="passes"))

    _after_final_check(monkeypatch, other)
    ours = merge_region(loc.uri, None, region, ONE)
    assert ours.generations == [] and ours.generations_merged_by_others == 1 and ours.conflicts == 1
    exact_everywhere(loc, v0, model)


def test_a_merger_without_our_lock_inserting_fresh_keys_after_our_check(local_location, monkeypatch):
    """
    we plan gens 1..2 (gen 1 inserts fresh 20, gen 2 updates base key 5) and check progress | a merger
    that does not take our lock merges gen 1 only (20 into a new fragment, marker 1) | our Update (5 only:
    20 is fresh, it belongs to our marker commit) shares no fragment with it and commits; 5's newest version
    is in gen 2, still unmerged: exact | our marker commit sees progress moved: replan from 1; gen 2
    replaces 5 again with the same row.
    """
    loc = local_location
    region = passes_table(loc, [([20], "g1", []), ([5], "g2", [])])
    model, v0 = lsm_view(loc), open_base(loc).version

    def other() -> None:
        merge_without_our_lock(loc.uri, None, region, config=MergeConfig(apply="passes"), up_to_generation=1)

    _after_final_check(monkeypatch, other)
    ours = merge_region(loc.uri, None, region, TWO)
    assert ours.conflicts == 1 and ours.generations == [2] and ours.generations_merged_by_others == 1
    exact_everywhere(loc, v0, model)


def test_a_task_failing_on_its_first_attempt_commits_nothing_and_the_merge_retries(local_location, monkeypatch):
    """An executor lost mid-apply: the first apply's first task wrote its fragment, the next raised.
    Nothing was committed by that attempt (no table version), the merge retries it and ends exact."""
    loc = local_location
    region = passes_table(loc, GENS, fragment_rows=3)
    model, v0 = lsm_view(loc), open_base(loc).version
    calls = []

    def flaky(fn, tasks, /):
        calls.append(fn.__name__)
        if fn in (merge_apply.apply_fragments, merge_apply.scan_apply) and calls.count(fn.__name__) == 1:
            assert len(tasks) >= 2
            fn(tasks[0])
            raise RuntimeError("executor lost")
        return pickling_runner(fn, tasks)

    use_fragment_apply(monkeypatch, flaky)
    version_before = open_base(loc).version
    real_run = merge_apply._run

    def spy(runner, fn, tasks, what):
        try:
            return real_run(runner, fn, tasks, what)
        except merge_apply.ApplyTaskError:
            assert open_base(loc).version == version_before, "a failed apply committed something"
            raise

    monkeypatch.setattr(merge_apply, "_run", spy)
    ours = merge_region(loc.uri, None, region, ONE)
    assert ours.generations == [1, 2, 3] and ours.conflicts == 1
    exact_everywhere(loc, v0, model)


def test_stable_row_ids_keep_their_ids_as_lance_merge_insert_does(local_location, monkeypatch):
    """A table with stable row ids: Lance's merge-insert keeps an updated row's _rowid, so such tables take
    the two passes (Lance's merge-insert) and their rows keep their ids."""
    loc = local_location
    lance.write_dataset(rows(range(10), "base"), loc.uri, max_rows_per_file=3, enable_stable_row_ids=True)
    open_base(loc).create_scalar_index("id", "BTREE")
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    write_generations(loc, region, GENS)
    model, v0 = lsm_view(loc), open_base(loc).version
    ids = {r["id"]: r["_rowid"] for r in open_base(loc).to_table(with_row_id=True).to_pylist()}
    applied = []
    real = merge_apply.plan_apply
    monkeypatch.setattr(merge_apply, "plan_apply", lambda *a, **k: applied.append(1) or real(*a, **k))
    assert merge_region(loc.uri, None, region, ONE).generations == [1, 2, 3]
    assert not applied, "a stable-row-id table went through the fragment apply"
    after = {r["id"]: r["_rowid"] for r in open_base(loc).to_table(with_row_id=True).to_pylist()}
    assert after[5] == ids[5] and after[7] == ids[7], "updated rows keep their stable row id"
    exact_everywhere(loc, v0, model)


def test_the_apply_locates_rows_through_the_lookup_and_deletes_by_offset(local_location):
    """plan_apply maps keys to (fragment, offset) at the planned version; fresh keys go to the marker."""
    from memwal.table import MemWalTable

    loc = local_location
    passes_table(loc, [], fragment_rows=3)  # [0..2] [3..5] [6..8] [9]
    table = MemWalTable(loc.uri)
    upserts = rows([1, 7, 9, 30], "u")
    plan = merge_apply.plan_apply(table, upserts, pa.table({"id": pa.array([4, 40], pa.int64())}),
                                  pickling_runner, parallelism=2)
    assert {f: o.tolist() for f, o in plan.offsets.items()} == {0: [1], 1: [1], 2: [1], 3: [0]}
    assert plan.replacements.column("id").to_pylist() == [1, 7, 9]
    assert plan.fresh.column("id").to_pylist() == [30] and plan.deleted_found == 1


def _staging_dedup(opened: list, order: str | None = None):
    """A dedup hook that stages its upserts (two files per batch) and its deleted keys (one) as Arrow IPC
    files in the table's store, as the Spark dedup does, and records any driver-side open of the upserts in
    `opened`. order: the upsert files' rows sorted by key ("ascending", "descending"), or as the dedup
    returned them (None)."""
    from memwal.merge import MergeInput, local_dedup

    def dedup(refs, pk, schema, store):
        done = local_dedup(refs, pk, schema, store)
        upserts = done.open_upserts()
        if order:
            upserts = upserts.sort_by([(pk[0], order)])
        prefix = f"_mem_wal/_staging/test-{uuid.uuid4()}"
        paths = []

        def stage(name: str, part: pa.Table) -> str:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_file(sink, part.schema) as w:
                w.write_table(part)
            store.put(f"{prefix}/{name}", sink.getvalue().to_pybytes())
            return f"{prefix}/{name}"

        for i, part in enumerate((upserts.slice(0, upserts.num_rows // 2), upserts.slice(upserts.num_rows // 2))):
            if part.num_rows:
                paths.append(stage(f"part-{i}.arrow", part))
        deleted = done.deleted_keys
        staged_deleted = (stage("deleted.arrow", deleted),) if deleted.num_rows else ()

        def open_upserts():
            opened.append(refs[0].region_id)
            return upserts

        return MergeInput(open_upserts, deleted.slice(0, 0), done.rows_read,
                          cleanup=lambda: store.delete_prefix(prefix), staged=tuple(paths),
                          staged_rows=upserts.num_rows, staged_deleted=staged_deleted,
                          staged_deleted_rows=deleted.num_rows)

    return dedup


@pytest.mark.parametrize("regions", [1, 2])
def test_staged_upserts_are_read_by_the_tasks_never_by_the_driver(local_location, tmp_path, regions):
    """Upserts staged as files (the Spark dedup's): the tasks read them, the driver never opens them (it
    keeps their keys), the marker commit streams the fresh ones; one commit may carry several regions."""
    from memwal.merge import merge_table

    from support.maintenance import build_table

    loc = local_location
    region_ids = [passes_table(loc, GENS, fragment_rows=3)] if regions == 1 else build_table(loc, regions=2)
    model, v0 = lsm_view(loc), open_base(loc).version
    opened: list = []
    summary = merge_table(loc.uri, config=MergeConfig(max_generations_per_commit=8, apply="fragments"),
                          dedup=_staging_dedup(opened))
    assert not summary.failed_regions and summary.commits == regions, summary
    assert opened == [], "the driver opened staged upserts"
    assert sorted(r.region_id for r in summary.regions if r.rows_upserted) == sorted(region_ids)
    exact_everywhere(loc, v0, model)


def test_an_unknown_apply_mode_is_refused_naming_it():
    from memwal.cli import _parse
    from memwal.errors import BadInputError

    with pytest.raises(BadInputError, match=r"merge apply: must be one of auto, passes, fragments, not 'bulk'"):
        MergeConfig(apply="bulk")
    with pytest.raises(SystemExit):
        _parse(["merge", "/t", "--apply", "bulk"])
    assert merge_apply.choose_apply("auto") is merge_apply.passes, "in process, auto is the two passes"
    assert merge_apply.choose_apply("auto", pickling_runner) is not merge_apply.passes, "with a runner: fragments"


def _task_aware_runner(in_task: list):
    """pickling_runner that records, while its tasks run, that code is running in a task."""

    def runner(fn, tasks, /):
        in_task.append(True)
        try:
            return pickling_runner(fn, tasks)
        finally:
            in_task.pop()

    return runner


def test_a_large_backlog_is_applied_without_the_driver_reading_a_staged_file(local_location, monkeypatch):
    """The scan path (a backlog large against the table): the fragments' tasks read the staged upserts and
    deleted keys and find them; the driver reads no staged file, not even their keys, and keeps no upsert
    and no deleted key; the fresh keys reach the marker commit through the tasks' scratch files, which are
    gone afterwards."""
    from memwal.merge import merge_table

    loc = local_location
    monkeypatch.setattr(merge_apply, "use_index", lambda ds, keys, pk=(): False)
    passes_table(loc, GENS, fragment_rows=3)
    model, v0 = lsm_view(loc), open_base(loc).version
    in_task, driver_reads, opened = [], [], []
    use_fragment_apply(monkeypatch, _task_aware_runner(in_task), parallelism=3)
    real_read = merge_apply.read_staged

    def read(store, path):
        if not in_task and "/apply-" not in path:  # the marker commit streams the fresh rows the tasks wrote
            driver_reads.append(path)
        return real_read(store, path)

    monkeypatch.setattr(merge_apply, "read_staged", read)
    summary = merge_table(loc.uri, config=MergeConfig(max_generations_per_commit=8, apply="fragments"),
                          dedup=_staging_dedup(opened))
    assert not summary.failed_regions and summary.commits == 1, summary
    assert opened == [] and driver_reads == [], f"the driver read staged upserts: {driver_reads}"
    exact_everywhere(loc, v0, model)
    assert not [p for p in loc.store().list("_mem_wal/_staging") if "/apply-" in p.path], "scratch files left"


@pytest.mark.parametrize("parallelism", [1, 5])
def test_an_upserted_key_with_rows_in_two_fragments_is_refused_before_anything_is_committed(
        local_location, monkeypatch, parallelism):
    """A base table whose primary key is not unique: key 5 in two fragments, found by one scan task or by
    two (one fragment each) that never see each other's rows. The driver sees the key counted twice and
    refuses the merge, naming the table and the key; no table version is written."""
    from memwal.merge import merge_table

    loc = local_location
    monkeypatch.setattr(merge_apply, "use_index", lambda ds, keys, pk=(): False)
    passes_table(loc, [([5, 30], "g1", [])], fragment_rows=3)  # fragments [0..2] [3..5] [6..8] [9]
    lance.write_dataset(rows([5], "dup"), loc.uri, mode="append")  # a fifth fragment: key 5 again
    use_fragment_apply(monkeypatch, parallelism=parallelism)
    before = open_base(loc).version
    with pytest.raises(ValueError, match=rf"table {loc.uri}: .*several rows in the base table \(primary key 'id'\)"):
        merge_table(loc.uri, config=MergeConfig(apply="fragments"))
    assert open_base(loc).version == before, "a refused apply committed something"


def test_a_deleted_key_with_rows_in_two_fragments_loses_both_rows(local_location, monkeypatch):
    """The scan path: a deleted key found at two base rows (a primary key that is not unique) deletes both,
    as a delete of that key must."""
    from memwal.merge import merge_table

    loc = local_location
    monkeypatch.setattr(merge_apply, "use_index", lambda ds, keys, pk=(): False)
    passes_table(loc, [([1], "g1", [5])], fragment_rows=3)
    lance.write_dataset(rows([5], "dup"), loc.uri, mode="append")
    use_fragment_apply(monkeypatch, parallelism=2)
    summary = merge_table(loc.uri, config=MergeConfig(apply="fragments"))
    assert not summary.failed_regions, summary
    got = view(open_base(loc).to_table())
    assert 5 not in got and got[1] == view(rows([1], "g1"))[1] and len(got) == 9, got


@pytest.mark.parametrize(("gens", "fresh_round"), [
    ([([1, 4, 8], "g1", [2])], False),  # every upsert replaces a base row, each found once: no second round
    ([([1, 4, 30], "g1", [2])], True),  # a fresh key: the second round finds it for the marker commit
])
def test_the_fresh_upsert_round_runs_only_when_an_upsert_may_be_fresh(local_location, monkeypatch, gens,
                                                                      fresh_round):
    """The scan path: when the tasks found every upsert key once (counts and key fingerprints add up), no
    upsert is fresh and none was found twice, so the round that looks for fresh upserts is skipped."""
    from memwal.merge import merge_table

    loc = local_location
    monkeypatch.setattr(merge_apply, "use_index", lambda ds, keys, pk=(): False)
    passes_table(loc, gens, fragment_rows=3)
    model, v0 = lsm_view(loc), open_base(loc).version
    use_fragment_apply(monkeypatch, parallelism=3)
    rounds = []

    def spy(runner, fn, tasks, what):
        rounds.append((fn.__name__, len(tasks)))
        return real_run(runner, fn, tasks, what)

    real_run = merge_apply._run
    monkeypatch.setattr(merge_apply, "_run", spy)
    summary = merge_table(loc.uri, config=MergeConfig(apply="fragments"))
    assert not summary.failed_regions, summary
    assert (("fresh_upserts", 1) in rounds) == fresh_round, rounds
    exact_everywhere(loc, v0, model)


@pytest.mark.parametrize("order", ["ascending", "descending"])
@pytest.mark.parametrize("parallelism", [1, 2])
def test_the_scan_goes_run_by_run_with_staged_files_in_or_out_of_key_order(local_location, monkeypatch, order,
                                                                           parallelism):
    """The scan path with runs of a few fragments per task: staged files in key order have each run's
    replacement rows streamed from the files' slices within the run's key range; out of order, the task
    matches them once at the end. Both give the exact view (fresh keys, updates and deletes in one batch)."""
    from memwal.merge import merge_table

    loc = local_location
    monkeypatch.setattr(merge_apply, "use_index", lambda ds, keys, pk=(): False)
    monkeypatch.setattr(merge_apply, "SCAN_CHUNK_ROWS", 4)  # runs of one or two 3-row fragments
    passes_table(loc, [([1, 4, 8, 12, 20, 21, 3, 0], "g1", [2, 9, 13]), ([4, 21, 5], "g2", [0])], fragment_rows=3)
    model, v0 = lsm_view(loc), open_base(loc).version
    use_fragment_apply(monkeypatch, parallelism=parallelism)
    streamed, real = [], merge_apply._replacements

    def spy(parts, keys, ascending, upserted, schema):
        streamed.append(all(ascending))
        return real(parts, keys, ascending, upserted, schema)

    monkeypatch.setattr(merge_apply, "_replacements", spy)
    summary = merge_table(loc.uri, config=MergeConfig(max_generations_per_commit=8, apply="fragments"),
                          dedup=_staging_dedup([], order))
    assert not summary.failed_regions and summary.commits == 1, summary
    exact_everywhere(loc, v0, model)
    if order == "ascending":
        assert len(streamed) > parallelism and all(streamed), streamed  # one call per run, each streamed
    else:
        assert streamed == [False] * len(streamed) and len(streamed) == parallelism, streamed


def test_offsets_deleted_through_the_binding_equal_lance_delete_rows(tmp_path):
    """`_delete_offsets` (pylance's binding, handed an array.array) deletes exactly what the public
    `LanceFragment.delete_rows` deletes, and empties a fragment the same way."""
    import numpy as np

    data = pa.table({"id": pa.array(range(10), pa.int64())})
    results = []
    for how in ("binding", "public"):
        uri = str(tmp_path / how)
        lance.write_dataset(data, uri, max_rows_per_file=5)
        ds = lance.dataset(uri)
        first, second = ds.get_fragments()
        if how == "binding":
            metas = [merge_apply._delete_offsets(first, np.array([0, 3], np.uint64)),
                     merge_apply._delete_offsets(second, np.arange(5, dtype=np.uint64))]
        else:
            metas = [first.delete_rows([0, 3]), second.delete_rows(list(range(5)))]
        assert metas[1] is None, "a fragment with every row deleted is removed"
        op = lance.LanceOperation.Update(removed_fragment_ids=[second.fragment_id], updated_fragments=[metas[0]])
        results.append(lance.LanceDataset.commit(uri, op, read_version=ds.version).to_table()["id"].to_pylist())
    assert results[0] == results[1] == [1, 2, 4]


@pytest.mark.parametrize("tasks", [1, 2, 3, 7])
def test_the_tasks_shares_of_the_upsert_fingerprint_add_up_to_the_whole(tasks):
    """Each scan task mixes its share of the upsert keys; over files of any sizes the shares sum to the
    fingerprint of every key, so a key found twice in place of another still never adds up."""
    files = [pa.array([5, 1, 9], pa.int64()), pa.array([], pa.int64()), pa.array([2, 8, 3, 4, 7], pa.int64())]
    whole = merge_apply._fingerprint(pa.concat_arrays(files))
    shares = [merge_apply._share_fingerprint(files, (i, tasks)) for i in range(tasks)]
    assert sum(shares) % 2**64 == whole
    twice = merge_apply._fingerprint(pa.array([5, 1, 9, 2, 8, 3, 4, 4], pa.int64()))
    assert twice != whole
