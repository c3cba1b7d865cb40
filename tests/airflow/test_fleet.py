"""Fleet mode's logic (memwal.airflow.fleet) and root entries in the tables file (memwal.airflow.config): the
order due tables are served in (longest-waiting first, none starves when fewer fit than are due), the plan a
probe of real tables gives for due and idle tables, a failing table reported without stopping the others, and
a root's tables found, added and removed between cycles."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from memwal.airflow.config import RootConfig, TableConfigError, parse_fleet, parse_tables
from memwal.airflow.fleet import FleetState, order_due, plan_cycle, probe_entries, report, resolve_table
from memwal.probe import DueJob, ProbeResult, ProbeState, next_states, probe_tables

from support.maintenance import build_table

NOW = 1_000_000.0


def _result(uri: str, jobs=("merge",), lag: float | None = None, status: str = "ok") -> ProbeResult:
    due = [DueJob(j, f"{j} due", {"oldest_unmerged_age_s": lag} if j == "merge" else {}) for j in jobs]
    state = ProbeState(uri, (1,), {}, "k", {}, tuple(jobs), NOW)
    return ProbeResult(uri, status, due=due, state=state, name=uri.rsplit("/", 1)[-1])


# --- order and starvation ----------------------------------------------------------------------------------


def test_longest_waiting_lag_goes_first_on_first_sight():
    """Seen due in the same probe: the table whose oldest unmerged generation is oldest goes first; a table with
    no merge lag waits from now (after both)."""
    state = FleetState()
    results = [_result("/t/a", lag=10), _result("/t/b", lag=500), _result("/t/c", jobs=("gc",))]
    plan, left = plan_cycle(results, state, NOW, max_tables=2)
    assert [p["uri"] for p in plan] == ["/t/b", "/t/a"]
    assert [p["waited_s"] for p in plan] == [500, 10]
    assert left == ["/t/c"] and state.due_since == {"/t/c": NOW}, "the one left keeps its place"


def test_no_table_starves_when_fewer_fit_than_are_due():
    """10 tables always due, 3 served per cycle, a served table due again at once; three of them report a huge
    lag every cycle (a backlog a bounded merge does not drain): they must not jump the line each time. Every
    table is served within ceil(10/3) + 1 cycles."""
    uris = [f"/t/{i:02d}" for i in range(10)]
    state = FleetState()
    served: dict[str, list[int]] = {u: [] for u in uris}
    for cycle in range(12):
        now = NOW + 60 * cycle
        results = [_result(u, lag=1e6 if i < 3 else 10 + i) for i, u in enumerate(uris)]
        plan, left = plan_cycle(results, state, now, max_tables=3)
        assert len(plan) == 3 and len(left) == 7
        for p in plan:
            served[p["uri"]].append(cycle)
        assert set(left) == set(state.due_since), "every table left out keeps its wait"
    for u, cycles in served.items():
        gaps = [b - a for a, b in zip([-1, *cycles], cycles, strict=False)]
        assert cycles and max(gaps) <= 4, f"{u} was served in cycles {cycles}"


def test_a_waiting_table_keeps_its_place_and_in_flight_tables_are_not_planned():
    state = FleetState(due_since={"/t/old": NOW - 3600})
    state.in_flight["run1"] = ["/t/busy"]
    results = [_result("/t/new", lag=60), _result("/t/old"), _result("/t/busy", lag=9999)]
    plan, _ = plan_cycle(results, state, NOW, max_tables=10)
    assert [p["uri"] for p in plan] == ["/t/old", "/t/new"], "a chain still running is not scheduled again"
    assert plan[0]["waited_s"] == 3600
    assert order_due({"b": 1.0, "a": 1.0, "c": 0.5}, ["a", "b", "c"]) == ["c", "a", "b"], "ties by URI"
    # a table that stopped being due loses its place
    plan, _ = plan_cycle([_result("/t/x")], FleetState(due_since={"/t/gone": 0.0}), NOW, 5)
    assert [p["uri"] for p in plan] == ["/t/x"]


def test_fleet_state_survives_json():
    state = FleetState({"/t/a": ProbeState("/t/a", (1, 2), {"r": 3}, "k", {"x": 1}, ("merge",), 5.0)},
                       {"/t/a": 1.0}, {"run": ["/t/a"]}, {"/t/b": 2.0})
    again = FleetState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again == state


# --- root entries in the tables file -------------------------------------------------------------------


def test_root_entry_takes_the_defaults_and_is_not_a_table(tmp_path):
    data = {"defaults": {"engine": "spark", "gc": {"grace_period_s": 60}},
            "tables": {"orders": {"uri": "orders.lance"},
                       "lake": {"root": "lake/", "engine": "in_process", "max_depth": 2},
                       "fleet_one": {"uri": "/x/one.lance", "fleet": True}}}
    tables, roots, bad = parse_fleet(data, "t.yaml", tmp_path)
    assert bad == {} and set(tables) == {"orders", "fleet_one"} and list(roots) == ["lake"]
    lake = roots["lake"]
    assert lake.root == str(tmp_path / "lake") and lake.max_depth == 2
    assert lake.template.engine == "in_process" and lake.template.gc.grace_period_s == 60
    t = lake.table(f"{lake.root}/clicks.lance")
    assert (t.name, t.uri, t.fleet, t.engine) == ("lake.clicks", f"{lake.root}/clicks.lance", True, "in_process")
    assert lake.table_name("s3://b/db/we ird.lance") == "lake.we_ird"
    assert list(parse_tables(data, "t.yaml", tmp_path)[0]) == ["orders", "fleet_one"], "roots are not tables"
    assert tables["fleet_one"].fleet and not tables["orders"].fleet


@pytest.mark.parametrize("entry, key, words", [
    ({"root": "/r", "uri": "/t"}, "uri", "not both"),
    ({"root": "gs://bucket/db"}, "root", "use a path, file:// or s3://"),
    ({"root": ""}, "root", "not a non-empty string"),
    ({"root": "/r", "max_depth": 0}, "max_depth", "is not >= 1"),
    ({"root": "/r", "engine": "sparky"}, "engine", "'sparky' is not one of"),
    ({"uri": "/t", "fleet": "yes"}, "fleet", "not true or false"),
])
def test_a_bad_root_entry_names_itself_and_the_key(entry, key, words):
    _, roots, bad = parse_fleet({"tables": {"fine": {"root": "/fine"}, "broken": entry}}, "t.yaml")
    assert list(roots) == ["fine"] and list(bad) == ["broken"]
    err = bad["broken"]
    assert isinstance(err, TableConfigError) and err.key == key and words in str(err), str(err)
    assert "table 'broken'" in str(err)


def test_resolve_table_for_a_root_table_and_a_gone_entry(tmp_path):
    tables, roots, bad = parse_fleet({"tables": {"lake": {"root": str(tmp_path)}}}, "t.yaml")
    item = {"entry": "lake", "root": str(tmp_path), "uri": f"{tmp_path}/a.lance"}
    assert resolve_table(item, tables, roots, bad).name == "lake.a"
    with pytest.raises(TableConfigError, match=r"'lake'.*no longer a root entry"):
        resolve_table(item, tables, {}, bad)


# --- the plan of a probe of real tables ------------------------------------------------------------------


def _root_entries(roots: dict[str, RootConfig]) -> dict[str, str]:
    return {r.root: name for name, r in roots.items()}


def test_probe_plan_for_due_idle_and_not_memwal_tables_under_a_root(local_location, tmp_path):
    """A root (a LanceDB database) with a due table, an idle one (merged, snapshotted, collected), a table LanceDB
    made without MemWAL and a plain directory: the plan holds the due table only, with its due jobs in the safe
    order; the other two are reported, not failed;
    a table copied under the root is planned on the next cycle, a removed one is no longer probed."""
    from memwal.gc import gc_table
    from memwal.merge import merge_table
    from memwal.snapshot import refresh_snapshot

    root = local_location.child("root")
    os.makedirs(root.uri)
    due_loc, idle_loc = root.child("due.lance"), root.child("idle.lance")
    build_table(due_loc, regions=1, generations=2)
    build_table(idle_loc, regions=1, generations=1)
    merge_table(idle_loc.uri)
    refresh_snapshot(idle_loc.uri)
    gc_table(idle_loc.uri)
    os.mkdir(f"{root.uri}/plain")
    import lancedb
    import pyarrow as pa

    lancedb.connect(root.uri).create_table("nowal", pa.table({"id": [1, 2]}))  # LanceDB's: no MemWAL index
    tables, roots, bad = parse_fleet({"tables": {"lake": {"root": root.uri, "engine": "in_process",
                                                          "gc": {"grace_period_s": 0}}}}, "t.yaml")
    entries = probe_entries(tables, roots, lambda conn: None)
    state = FleetState()
    results = probe_tables(entries, state.probe_states, now=NOW)
    by_uri = {r.table_uri: r for r in results}
    assert by_uri[idle_loc.uri].jobs == [], by_uri[idle_loc.uri].due
    plan, left = plan_cycle(results, state, NOW, 10, _root_entries(roots))
    assert [(p["table"], p["jobs"]) for p in plan] == [("lake.due", ["merge", "snapshot"])]
    assert plan[0]["entry"] == "lake" and plan[0]["root"] == root.uri and left == []
    answer = report(results, plan, left, [], bad, _root_entries(roots))
    assert answer["probed"] == 3 and answer["due"] == 1 and answer["errors"] == [], "three Lance tables probed"
    assert answer["idle"] == 1 and [t["table"] for t in answer["tables"]] == ["lake.due", "lake.nowal", "lake.plain"], \
        "idle tables are counted, not listed"
    assert sorted((t["uri"], t["status"]) for t in answer["not_maintained"]) == [
        (f"{root.uri}/nowal.lance", "not_memwal"), (f"{root.uri}/plain", "not_a_table")]
    json.dumps(answer)  # the XCom is JSON

    # next cycle: the due table's chain is in flight; a table copied under the root is found and planned
    state.probe_states = next_states(results)
    state.in_flight["run1"] = [due_loc.uri]
    shutil.copytree(due_loc.uri, f"{root.uri}/copy.lance")
    results = probe_tables(entries, state.probe_states, now=NOW + 60)
    plan, _ = plan_cycle(results, state, NOW + 60, 10, _root_entries(roots))
    assert [p["table"] for p in plan] == ["lake.copy"]
    # a removed table is no longer probed
    shutil.rmtree(f"{root.uri}/copy.lance")
    results = probe_tables(entries, next_states(results), now=NOW + 120)
    assert f"{root.uri}/copy.lance" not in {r.table_uri for r in results}


def test_a_failing_table_is_reported_and_the_others_planned(local_location, monkeypatch, caplog):
    """One table's probe raises a storage error: the report lists it by name with the error, the log says so,
    and the other table is still planned."""
    import memwal.probe as probe

    good, broken = local_location.child("good"), local_location.child("broken")
    build_table(good, regions=1, generations=1)
    build_table(broken, regions=1, generations=1)
    real = probe._read_facts

    def failing(table, *args, **kwargs):
        if table.uri == broken.uri:
            raise OSError(f"permission denied: {broken.uri}/_versions/3.manifest")
        return real(table, *args, **kwargs)

    monkeypatch.setattr(probe, "_read_facts", failing)
    tables, roots, bad = parse_fleet({"tables": {
        "good": {"uri": good.uri, "fleet": True}, "broken": {"uri": broken.uri, "fleet": True},
        "bad_entry": {"uri": "/x", "engine": "nope"}}}, "t.yaml")
    results = probe_tables(probe_entries(tables, roots, lambda conn: None), now=NOW)
    plan, left = plan_cycle(results, FleetState(), NOW, 10)
    answer = report(results, plan, left, [], bad, {})
    assert [p["table"] for p in plan] == ["good"]
    [err] = answer["errors"]
    assert err["table"] == "broken" and "permission denied" in err["error"] and broken.uri in err["error"]
    assert "bad_entry" in answer["config_errors"] and "engine" in answer["config_errors"]["bad_entry"]
    assert f"table {broken.uri}: permission denied" in caplog.text


# --- the probe task (the operator, outside a DAG run: the Variable and the task instance faked) -------------


class _FakeTi:
    """What the probe task asks its task instance: the state of maintenance runs, and its XCom pushes."""

    def __init__(self, run_states: dict[str, str]):
        self.run_states, self.pushed = run_states, {}

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
        if run_id not in self.run_states:
            raise RuntimeError(f"dag run {run_id} not found")
        return self.run_states[run_id]

    def xcom_push(self, key: str, value) -> None:
        self.pushed[key] = value


def test_probe_task_triggers_only_when_due_and_never_twice_for_a_table_in_flight(local_location, monkeypatch,
                                                                                 tmp_path):
    """Idle fleet: the probe returns its answer and triggers nothing. A due table: it triggers the maintenance
    DAG with the plan as conf and records the run; while that run is queued or running the table is not planned
    again (the probe triggers nothing), once it ended the table is planned again if still due."""
    from airflow.sdk.exceptions import DagRunTriggerException

    from memwal.airflow.operators import fleet as ops

    root = local_location.child("root")
    os.makedirs(root.uri)
    build_table(root.child("a.lance"), regions=1, generations=1)
    tables_file = tmp_path / "tables.yaml"
    tables_file.write_text(json.dumps({"tables": {"lake": {"root": root.uri, "engine": "in_process"}}}))
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables_file))
    monkeypatch.delenv("AIRFLOW_VAR_MEMWAL_TABLES", raising=False)
    saved: dict[str, str] = {}
    monkeypatch.setattr(ops, "_load_state", lambda key: FleetState.from_dict(json.loads(saved.get(key, "{}"))))
    monkeypatch.setattr(ops, "_save_state", lambda key, state: saved.__setitem__(key, json.dumps(state.to_dict())))
    probe = ops.MemWalFleetProbeOperator(task_id="probe", trigger_dag_id="maintain", max_tables=4)

    ti = _FakeTi({})
    with pytest.raises(DagRunTriggerException) as raised:
        probe.execute({"ti": ti, "run_id": "r1"})
    trigger = raised.value
    assert trigger.trigger_dag_id == "maintain"
    [item] = trigger.conf["work"]
    assert (item["table"], item["jobs"], item["entry"]) == ("lake.a", ["merge", "snapshot"], "lake")
    answer = ti.pushed["return_value"]
    assert answer["run_id"] == trigger.dag_run_id and answer["dispatched"][0]["table"] == "lake.a"
    assert json.loads(saved["memwal_fleet_state"])["in_flight"] == {trigger.dag_run_id: [item["uri"]]}

    for state in ("queued", "running"):  # its chain is not done: not planned again, nothing triggered
        answer = probe.execute({"ti": _FakeTi({trigger.dag_run_id: state}), "run_id": "r2"})
        assert answer["due"] == 1 and answer["dispatched"] == [] and answer["in_flight"] == [item["uri"]]
    with pytest.raises(DagRunTriggerException):  # that run ended, the table is still due: planned again
        probe.execute({"ti": _FakeTi({trigger.dag_run_id: "success"}), "run_id": "r3"})
    assert list(json.loads(saved["memwal_fleet_state"])["in_flight"]) != [trigger.dag_run_id]

    from memwal.merge import merge_table
    from memwal.snapshot import refresh_snapshot

    merge_table(item["uri"])
    refresh_snapshot(item["uri"])
    [run_id] = json.loads(saved["memwal_fleet_state"])["in_flight"]
    idle = probe.execute({"ti": _FakeTi({run_id: "failed"}), "run_id": "r4"})
    assert idle["dispatched"] == [] and idle["in_flight"] == [], "nothing due: the probe's answer, no trigger"


# --- Spark tables share one application per batch ------------------------------------------------------------


def test_split_batches_groups_spark_tables_and_keeps_the_longest_waiting_order():
    """in_process / auto tables run alone; spark and spark_connect tables are packed into batches within a group
    (engine, connections, Spark properties) by bytes; batches run in the order of their longest-waiting table."""
    from memwal.airflow.fleet import batch_group, split_batches

    _, roots, _ = parse_fleet({"tables": {
        "s": {"root": "/s", "engine": "spark"}, "s2": {"root": "/s2", "engine": "spark", "spark_conn_id": "other"},
        "c": {"root": "/c", "engine": "spark_connect"}, "p": {"root": "/p", "engine": "in_process"},
        "a": {"root": "/a", "engine": "auto"}}}, "t.yaml")
    order = ["/p/1", "/s/1", "/c/1", "/s2/1", "/s/2", "/a/1", "/s/3"]
    cfgs = {u: roots[u.split("/")[1]].table(u) for u in order}
    plan = [{"uri": u, "table": cfgs[u].name, "jobs": ["merge"]} for u in order]
    sizes = {"/s/1": 10, "/s/2": 500, "/s/3": 20}
    alone, batches = split_batches(plan, cfgs, sizes, max_tables=2, max_bytes=10**6)
    assert [p["uri"] for p in alone] == ["/p/1", "/a/1"]
    # packed largest first (/s/2 then /s/3 fill one batch of 2), then ordered by each batch's longest-waiting table
    assert [[i["uri"] for i in b] for b in batches] == [["/s/1"], ["/c/1"], ["/s2/1"], ["/s/2", "/s/3"]]
    assert batches[3][0]["bytes"] == 500
    assert batch_group(cfgs["/s/1"]) != batch_group(cfgs["/s2/1"]) and batch_group(cfgs["/p/1"]) is None


def test_batch_operator_runs_the_batch_in_one_call_and_fails_naming_a_failed_table(monkeypatch, tmp_path):
    from memwal.airflow.hooks.memwal import MemWalHook, MemWalTaskError
    from memwal.airflow.operators.fleet import MemWalDueWorkOperator

    tables_file = tmp_path / "tables.yaml"
    tables_file.write_text(json.dumps({"tables": {"lake": {"root": "/lake", "engine": "spark",
                                                           "max_generations_per_commit": 3}}}))
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables_file))
    monkeypatch.delenv("AIRFLOW_VAR_MEMWAL_TABLES", raising=False)
    calls = []

    def run_batch(self, entries, **kwargs):
        calls.append((list(entries), kwargs))
        return [{"table_uri": e.uri, "status": "failed" if e.uri.endswith("b.lance") else "ok",
                 "error": f"table {e.uri}: merge failed" if e.uri.endswith("b.lance") else None} for e in entries]

    monkeypatch.setattr(MemWalHook, "run_batch", run_batch)
    items = [{"table": f"lake.{n}", "uri": f"/lake/{n}.lance", "entry": "lake", "root": "/lake",
              "jobs": ["snapshot", "merge"], "bytes": 7} for n in ("a", "b")]
    ti = _FakeTi({})
    with pytest.raises(MemWalTaskError, match=r"1 of 2 table\(s\) failed: lake.b: table /lake/b.lance: merge"):
        MemWalDueWorkOperator(task_id="b", item=items).execute({"ti": ti})
    [(entries, kwargs)] = calls
    assert [(e.uri, e.jobs, e.bytes, e.name) for e in entries] == [
        ("/lake/a.lance", ("merge", "snapshot"), 7, "lake.a"), ("/lake/b.lance", ("merge", "snapshot"), 7, "lake.b")]
    assert entries[0].options.merge.max_generations_per_commit == 3, "the root's settings reach the batch"
    assert kwargs["engine"] == "spark"
    assert [t["status"] for t in ti.pushed["return_value"]["tables"]] == ["ok", "failed"]


def test_an_entry_whose_connection_cannot_be_read_is_reported_and_the_others_probed(local_location, monkeypatch,
                                                                                     tmp_path):
    """A root whose `conn_id` names no connection: the probe task reports it under config_errors, naming the
    entry and the connection, and still plans the other root's due table."""
    from airflow.sdk.exceptions import AirflowFailException, DagRunTriggerException

    from memwal.airflow.operators import fleet as ops

    good = local_location.child("good")
    os.makedirs(good.uri)
    build_table(good.child("a.lance"), regions=1, generations=1)
    tables_file = tmp_path / "tables.yaml"
    tables_file.write_text(json.dumps({"tables": {
        "good": {"root": good.uri, "engine": "in_process"},
        "lake": {"root": "s3://lake/db", "conn_id": "nope", "engine": "in_process"}}}))
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables_file))
    monkeypatch.delenv("AIRFLOW_VAR_MEMWAL_TABLES", raising=False)

    def options(conn_id):
        raise AirflowFailException(f"connection {conn_id!r} (a table's conn_id) is not defined")

    monkeypatch.setattr(ops, "_storage_options", options)
    monkeypatch.setattr(ops, "_load_state", lambda key: FleetState())
    monkeypatch.setattr(ops, "_save_state", lambda key, state: None)
    ti = _FakeTi({})
    with pytest.raises(DagRunTriggerException) as raised:
        ops.MemWalFleetProbeOperator(task_id="probe", trigger_dag_id="m").execute({"ti": ti, "run_id": "r"})
    assert [w["table"] for w in raised.value.conf["work"]] == ["good.a"]
    assert "connection 'nope'" in ti.pushed["return_value"]["config_errors"]["lake"]
