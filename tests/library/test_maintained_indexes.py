"""memwal.maintained_indexes: list, add and drop the MemWAL's maintained indexes by the spec's rules, committed
through commit_details; what catch-up and GC then do with an added or dropped name."""

from __future__ import annotations

import logging
import uuid

import pytest

from memwal.catchup import catchup_table
from memwal.errors import BadInputError
from memwal.gc import safe_generation
from memwal.index_coverage import with_coverage
from memwal.maintained_indexes import add_maintained, catchup_names, drop_maintained, list_maintained
from memwal.merge import merge_table
from memwal.table import MemWalTable

from support.maintenance import write_generations
from support.tables import create_base, open_base


def _table(loc, maintained=("sidx",)) -> str:
    """Base with BTREE sidx (name), tidx (score) and pk (id: the primary key's BTREE); MemWAL maintaining
    `maintained` (None: maintain_all_indexes); one region's two generations merged (uncovered by every index)."""
    ds = create_base(loc)
    ds.create_scalar_index("name", "BTREE", name="sidx")
    ds.create_scalar_index("score", "BTREE", name="tidx")
    ds.create_scalar_index("id", "BTREE", name="pk")
    kwargs = {} if maintained is None else {"maintained_indexes": list(maintained)}
    open_base(loc).initialize_mem_wal(unsharded=True, **kwargs)
    region = str(uuid.uuid4())
    write_generations(loc, region, [([100 + g], f"g{g}", []) for g in range(2)])
    merge_table(loc.uri)
    return region


def test_list_names_what_is_maintained_and_what_is_not_on_the_base(local_location):
    loc = local_location
    _table(loc, ("sidx", "tidx"))
    open_base(loc).drop_index("sidx")
    out = list_maintained(loc.uri).to_dict()
    assert out["job"] == "indexes" and out["action"] == "list" and not out["changed"]
    assert out["after"] == out["before"] == {"maintained_indexes": ["sidx", "tidx"], "maintain_all_indexes": False,
                                             "maintained": ["sidx", "tidx"], "not_on_base": ["sidx"]}
    assert out["base_indexes"] == ["pk", "tidx"] and out["primary_key_indexes"] == ["pk"]


@pytest.mark.parametrize(("name", "reason"), [
    ("nope", "no such index in table"),
    ("__lance_mem_wal", "the MemWAL index itself"),
    ("pk", "the primary key's BTREE"),
])
def test_add_refuses_what_is_not_a_base_index_to_list(local_location, name, reason):
    loc = local_location
    _table(loc)
    version = open_base(loc).version
    with pytest.raises(BadInputError, match=reason) as info:
        add_maintained(loc.uri, [name])
    assert loc.uri in str(info.value) and repr(name) in str(info.value)
    assert open_base(loc).version == version, "nothing committed"


def test_add_records_a_covering_index_with_no_entry_as_caught_up(local_location):
    """Every index covers every fragment, and Lance's compaction remap dropped every index_catchup entry
    (pylance 14.0.2): added, tidx is recorded caught up to the merged generation."""
    loc = local_location
    region = _table(loc, ("pk",))  # Lance core accepts the key's BTREE in the list; we only refuse adding it
    open_base(loc).optimize.optimize_indices()
    open_base(loc).optimize.compact_files(target_rows_per_fragment=1000, num_threads=1)
    assert MemWalTable(loc.uri).details.index_catchup == {}, "Lance's remap dropped the entries"
    out = add_maintained(loc.uri, ["tidx"]).to_dict()
    assert out["changed"] and out["after"]["maintained_indexes"] == ["pk", "tidx"]
    assert out["index_catchup"] == {"tidx": {region: 2}}
    table = MemWalTable(loc.uri)
    # pylance 14.0.2 also fills in, at the commit, an entry for every other index covering every fragment
    assert table.details.index_catchup == {"tidx": {region: 2}, "sidx": {region: 2}, "pk": {region: 2}}
    assert table.details.merged_generations == {region: 2}, "progress as it was"


def test_gc_waits_for_an_added_index_until_catch_up_covers_it(local_location):
    """sidx does not cover the merged rows and has no entry: none is written (Lance core keeps none at 0),
    GC reads it as 0 by its coverage and waits, and catch-up then records it."""
    loc = local_location
    region = _table(loc, ("tidx",))
    out = add_maintained(loc.uri, ["sidx"]).to_dict()
    assert out["index_catchup"] == {} and "sidx does not cover every live fragment" in " ".join(out["notes"])
    table = MemWalTable(loc.uri)
    assert "sidx" not in table.details.index_catchup
    names = table.maintained_indexes()
    assert names == ["tidx", "sidx"]
    index = with_coverage(table.index, table.dataset, names)
    assert safe_generation(index, region, names, {})[0] == 0
    catchup_table(table)
    table = MemWalTable(loc.uri)
    assert table.details.index_catchup["sidx"] == {region: 2}
    index = with_coverage(table.index, table.dataset, names)
    assert safe_generation(index, region, names, {}) == (2, "merged_generations")


def test_lance_core_keeps_no_index_catchup_entry_at_generation_0(local_location):
    """Why an uncovering added index gets no entry (pylance 14.0.2): a details commit with an entry at 0, or
    an empty one, is stored without it; its optimize_indices (and create_index) records the index."""
    from dataclasses import replace

    loc = local_location
    region = _table(loc, ("sidx",))
    table = MemWalTable(loc.uri)
    table.commit_details(lambda d: replace(d, index_catchup={"sidx": {region: 0}, "tidx": {}}))
    assert MemWalTable(loc.uri).details.index_catchup == {}
    open_base(loc).optimize.optimize_indices(index_names=["tidx"])
    assert MemWalTable(loc.uri).details.index_catchup == {"tidx": {region: 2}}


def test_add_under_maintain_all_indexes_makes_the_list_explicit(local_location):
    """maintain_all_indexes: every base index is maintained. Adding switches it off: the list becomes every
    index maintained so far less the primary key's BTREE (implicit, and still caught up by catch-up)."""
    loc = local_location
    _table(loc, None)
    open_base(loc).create_scalar_index("score", "BITMAP", name="later")  # created after MemWAL init
    before = list_maintained(loc.uri).to_dict()["after"]
    assert before["maintain_all_indexes"] and before["maintained"] == ["later", "pk", "sidx", "tidx"]
    out = add_maintained(loc.uri, ["tidx"]).to_dict()
    assert out["changed"] and out["after"] == {"maintained_indexes": ["later", "sidx", "tidx"],
                                               "maintain_all_indexes": False,
                                               "maintained": ["later", "sidx", "tidx"], "not_on_base": []}
    assert any("maintain_all_indexes was set" in n and "pk" in n for n in out["notes"])
    assert "tidx is already maintained" in out["notes"]
    table = MemWalTable(loc.uri)
    assert not table.details.maintain_all_indexes and table.maintained_indexes() == ["later", "sidx", "tidx"]
    assert catchup_names(table) == ["later", "sidx", "tidx", "pk"], "the key's BTREE is caught up implicitly"


def test_drop_removes_a_listed_name_and_refuses_an_unlisted_one(local_location):
    """The way out of a dropped index: `drop` takes a listed name the base no longer has; catch-up then has
    nothing to skip. A name not listed is an error naming it (nothing committed)."""
    loc = local_location
    _table(loc, ("sidx", "tidx"))
    open_base(loc).drop_index("sidx")
    version = open_base(loc).version
    with pytest.raises(BadInputError, match=r"'nope' is not maintained .* \(maintained: sidx, tidx\)"):
        drop_maintained(loc.uri, ["nope"])
    assert open_base(loc).version == version
    out = drop_maintained(loc.uri, ["sidx"]).to_dict()
    assert out["changed"] and out["after"]["maintained_indexes"] == ["tidx"] and out["table_version"] == version + 1
    assert catchup_table(loc.uri).to_dict()["skipped_indexes"] == []
    out = drop_maintained(loc.uri, ["tidx"]).to_dict()
    assert out["after"] == {"maintained_indexes": [], "maintain_all_indexes": False, "maintained": [],
                            "not_on_base": []}, "nothing maintained (Lance core's maintained_indexes=[])"


def test_dry_run_reports_before_and_after_and_commits_nothing(local_location):
    loc = local_location
    _table(loc, None)
    version = open_base(loc).version
    out = drop_maintained(loc.uri, ["tidx"], dry_run=True).to_dict()
    assert out["dry_run"] and out["changed"] and out["table_version"] == version
    assert out["before"]["maintain_all_indexes"] and out["after"]["maintained_indexes"] == ["sidx"]
    assert open_base(loc).version == version and MemWalTable(loc.uri).details.maintain_all_indexes


def test_a_merge_landing_during_the_change_is_not_regressed(local_location, monkeypatch, caplog):
    """INTEROP.md's measured hazard: a merge by another tool (not taking our lock) commits generation 3 between
    the change's read and its commit, and Lance rebases the details rewrite over it. The change goes through
    commit_details: merged_generations stays 3 and the list change is kept."""
    from memwal import maintained_indexes

    from support.maintenance import merge_without_our_lock

    loc = local_location
    region = _table(loc, ("tidx",))
    write_generations(loc, region, [([200], "g2", [])])
    real = maintained_indexes.covers_every_fragment
    calls: list[int] = []

    def merge_meanwhile(ds, name):
        calls.append(1)
        if len(calls) == 2:  # inside commit_details' loop, after its read
            merge_without_our_lock(loc.uri, None, region)
        return real(ds, name)

    monkeypatch.setattr(maintained_indexes, "covers_every_fragment", merge_meanwhile)
    with caplog.at_level(logging.WARNING, logger="memwal.table"):
        add_maintained(loc.uri, ["sidx"])
    assert any("rebased over a concurrent merge" in m for m in caplog.messages), \
        "the rewrite was rebased over the merge, then repaired"
    table = MemWalTable(loc.uri)
    assert table.details.merged_generations == {region: 3}
    assert table.details.maintained_indexes == ("tidx", "sidx")
