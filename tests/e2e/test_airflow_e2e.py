"""End to end on a real Airflow 3.3.2 (see conftest.py for the deployment): DAG runs triggered through the
REST API v2 with a token as the UI does, Spark applications on a standalone cluster, tables on S3 written by
Lance core; each test checks the table against the model of every write.

The tests run in file order and share one deployment; the canary-secret search runs last, over everything
the earlier runs left (task logs, XComs, rendered fields, component logs, the metadata DB, argv).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest
from e2e_support import REPO, Deployment, LanceCoreTable
from local_airflow import postgres_available

from memwal.lock import index_lock
from memwal.storage import ObjectStore

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.s3]

log = logging.getLogger("e2e")

MERGE = "memwal_merge"
COMMITTING = "read and deduplicated; committing"  # memwal.merge's log line right before a commit
MONITOR = "memwal_lag_monitor"
RUN_TIMEOUT = 300.0


def maintenance(table: str) -> str:
    return f"memwal_maintenance__{table}"


def region_generations(summary: dict) -> dict[str, list[int]]:
    """region id -> generations a merge summary says it merged (regions that merged nothing left out)."""
    return {r["region_id"]: list(r["generations"]) for r in summary.get("regions", []) if r.get("generations")}


def expect_success(dep: Deployment, dag_id: str, run_id: str, timeout: float = RUN_TIMEOUT) -> None:
    state = dep.af.wait_for_run(dag_id, run_id, timeout=timeout)
    assert state == "success", f"{dag_id} run {run_id} ended {state}: {dep.af.task_states(dag_id, run_id)}"


def mapped_xcoms(dep: Deployment, dag_id: str, run_id: str, task_id: str) -> list[dict]:
    """The return values of every mapped instance of a task."""
    tis = [ti for ti in dep.af.task_instances(dag_id, run_id) if ti["task_id"] == task_id]
    return [dep.af.xcom(dag_id, run_id, task_id, map_index=ti["map_index"]) for ti in tis
            if ti["state"] == "success"]


def test_metadata_database_is_postgresql_when_one_answers(deployment: Deployment):
    """The deployment runs on a fresh PostgreSQL database when one answers; otherwise on SQLite, said here."""
    if not postgres_available():
        pytest.skip(f"no PostgreSQL answers on 127.0.0.1:5432: this run's Airflow used {deployment.af.backend}")
    if deployment.af.database == "sqlite":
        pytest.skip("MEMWAL_E2E_DATABASE=sqlite: this run's Airflow used SQLite")
    assert deployment.af.backend == "postgresql"
    assert deployment.af._sql_conn.startswith("postgresql+psycopg2://"), "the components use the fresh database"


def test_merge_triggered_through_rest_api_merges_and_emits_asset_event(deployment: Deployment):
    """orders: 2 regions x 8 generations written by Lance core's writer (upserts over each other, deletes).
    memwal_merge triggered as the UI does: POST dagRuns with a token; it runs a Spark application.
    Rule: the base table equals the model, merged_generations is each region's last generation, the XCom
    summary and the table's asset event say which generations were merged."""
    af, t = deployment.af, deployment.tables["orders"]
    flushed = t.flushed()
    assert len(flushed) == 2 and all(len(g) >= 4 for g in flushed.values()), flushed
    assert t.merged_generations() == {}, "nothing merged before the DAG runs"

    run = af.trigger_dag(MERGE, conf={"table": "orders"})
    expect_success(deployment, MERGE, run)

    assert t.base() == t.model, "after the merge the base table equals the model of every write"
    assert t.merged_generations() == {r: max(g) for r, g in flushed.items()}
    summary = af.xcom(MERGE, run, "merge")
    assert summary["job"] == "merge" and summary["failed_regions"] == []
    assert summary.get("spark_application_id"), "the merge ran as a Spark application"
    assert summary["spark_master"] == deployment.spark.url
    assert region_generations(summary) == flushed
    assert summary["generations_merged"] == sum(len(g) for g in flushed.values())

    events = af.asset_events(source_dag_id=MERGE, source_run_id=run)
    assert [e["name"] for e in events] == ["memwal__orders"], events
    extra = events[0]["extra"]
    assert {r: v["generations"] for r, v in extra["regions"].items()} == flushed
    assert extra["generations_merged"] == summary["generations_merged"]
    assert extra["table_version_after"] == summary["table_version_after"]


def test_merge_and_maintenance_at_once_apply_every_generation_once(deployment: Deployment):
    """clicks: 2 regions x 8 generations. memwal_merge (both regions) and memwal_maintenance__clicks are
    triggered together, in-process (the table's engine); the test holds the MemWAL index lock (which every
    merge commit takes) until both merge tasks are committing, so their commits contend. Rule: both succeed,
    at least one commit was refused or overtaken (counted in the summaries), every
    generation is merged by exactly one of them (their summaries partition the generations), and the base
    table equals the model (nothing applied twice)."""
    af, t = deployment.af, deployment.tables["clicks"]
    flushed = t.flushed()
    regions = sorted(flushed)
    for dag_id in (MERGE, maintenance("clicks")):
        af.wait_for_dag(dag_id)
        af.set_paused(dag_id, False)

    def committing(dag_id: str, run_id: str) -> bool:
        """A merge task of the run has read and deduplicated its generations and is committing (its log says
        so right before it takes the MemWAL index lock): observed on the task log files, not timed."""
        return any(COMMITTING in p.read_text(errors="replace") for p in af.logs_dir.rglob("*.log")
                   if f"dag_id={dag_id}" in str(p) and f"run_id={run_id}" in str(p) and "task_id=merge" in str(p))

    with index_lock(ObjectStore(t.uri, t.storage_options)):
        merge_run = af.trigger_dag(MERGE, conf={"table": "clicks", "regions": regions}, unpause=False)
        maint_run = af.trigger_dag(maintenance("clicks"), unpause=False)
        # Both have planned the same generations before either can commit: the later commit is certain to be
        # refused (stale marker) or overtaken, so contention is asserted below, not logged.
        af.wait_until(lambda: committing(MERGE, merge_run) and committing(maintenance("clicks"), maint_run),
                      RUN_TIMEOUT,
                      lambda: f"{af.task_states(MERGE, merge_run)} {af.task_states(maintenance('clicks'), maint_run)}",
                      interval=0.5)
    expect_success(deployment, MERGE, merge_run)
    expect_success(deployment, maintenance("clicks"), maint_run)

    merge_summary = af.xcom(MERGE, merge_run, "merge")
    assert merge_summary["failed_regions"] == []
    by_merge = region_generations(merge_summary)
    by_maintenance: dict[str, list[int]] = {}
    maintenance_summaries = mapped_xcoms(deployment, maintenance("clicks"), maint_run, "merge")
    for summary in maintenance_summaries:
        assert summary["failed_regions"] == []
        for region, gens in region_generations(summary).items():
            by_maintenance.setdefault(region, []).extend(gens)
    conflicts = sum(r.get("conflicts", 0) for s in [merge_summary, *maintenance_summaries]
                    for r in s.get("regions", []))
    log.info("clicks: memwal_merge merged %s, the maintenance DAG merged %s; %d commits refused or overtaken",
             by_merge, by_maintenance, conflicts)
    assert conflicts >= 1, "the two merges contended: the later commit of the same generations was refused"
    for region in regions:
        mine, theirs = by_merge.get(region, []), by_maintenance.get(region, [])
        assert not set(mine) & set(theirs), f"region {region}: generations {set(mine) & set(theirs)} merged twice"
        assert sorted(mine + theirs) == flushed[region], (
            f"region {region}: the two summaries together must name every generation once "
            f"(merge {mine}, maintenance {theirs}, flushed {flushed[region]})")
    assert t.base() == t.model, "nothing applied twice, nothing lost"
    assert t.merged_generations() == {r: max(g) for r, g in flushed.items()}
    events = af.asset_events(source_dag_id=maintenance("clicks"), source_run_id=maint_run)
    assert bool(events) == bool(by_maintenance), "the maintenance merges emit the table's asset event when they merge"
    assert all(e["name"] == "memwal__clicks" for e in events), events
    states = af.task_states(maintenance("clicks"), maint_run)
    for task in ("index_catchup", "snapshot_refresh", "gc"):
        assert states[task] == "success", states


def test_lagging_table_alerts_starts_maintenance_from_its_asset_and_resolves(deployment: Deployment):
    """events: 2 regions x 6 unmerged generations, threshold max_unmerged_generations 2. Rule: the lag monitor
    sends one firing alert to the webhook; the lag asset's watcher (the event trigger in the triggerer) starts
    memwal_maintenance__events, which merges the backlog; the next monitor run sends one resolved alert."""
    af, t, hook = deployment.af, deployment.tables["events"], deployment.webhook

    def alerts(state: str) -> list[dict]:
        """The `memwal` part of every webhook POST for table events in `state`; each is Slack-shaped too."""
        out = []
        for m in hook.messages():
            alert = m["body"].get("memwal") or {}
            if alert.get("table") == "events" and alert.get("state") == state:
                assert m["body"]["text"].startswith(f"[{state.upper()}]"), m["body"]
                assert m["body"]["attachments"][0]["fields"], m["body"]
                out.append(alert)
        return out

    # The monitor's schedule here is @once: unpausing it starts its one scheduled run, the first check.
    af.wait_for_dag(MONITOR)
    af.set_paused(MONITOR, False)
    first = af.wait_until(lambda: next(iter(af.dag_runs(MONITOR)), None), RUN_TIMEOUT, lambda: "no lag monitor run")
    expect_success(deployment, MONITOR, first["dag_run_id"])
    firing = alerts("firing")
    assert len(firing) == 1, f"one firing alert for table events, got {hook.messages()}"
    assert {b["region_id"] for b in firing[0]["breaches"]} == set(t.regions)
    assert all(b["metric"] == "unmerged_generations" for b in firing[0]["breaches"])
    assert alerts("resolved") == []

    # The lag asset's watcher fires; the maintenance DAG runs from that asset event.
    dag_id = maintenance("events")
    af.set_paused(dag_id, False)
    af.reparse(dag_id)  # Airflow registers an asset's watcher when a DAG scheduled on it is parsed unpaused
    run = af.wait_until(lambda: next((r for r in af.dag_runs(dag_id) if r["run_type"] == "asset_triggered"), None),
                        RUN_TIMEOUT, lambda: f"no asset-triggered run of {dag_id}: {af.dag_runs(dag_id)}")
    expect_success(deployment, dag_id, run["dag_run_id"])
    upstream = af.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}/upstreamAssetEvents")
    names = [e["name"] for e in upstream["asset_events"]]
    assert "memwal_lag__events" in names, upstream
    lag_event = next(e for e in upstream["asset_events"] if e["name"] == "memwal_lag__events")
    payload = lag_event["extra"].get("payload", lag_event["extra"])
    assert payload["breached"] is True and payload["table"] == "events"
    assert t.base() == t.model
    assert t.merged_generations() == {r: max(g) for r, g in t.flushed().items()}

    second = af.trigger_dag(MONITOR)
    expect_success(deployment, MONITOR, second)
    assert len(alerts("resolved")) == 1, f"one resolved alert after the merge, got {hook.messages()}"
    assert len(alerts("firing")) == 1, "the firing alert is not sent again"
    cycle = af.xcom(MONITOR, second, "check_tables")  # one task checks every table
    assert "events" not in cycle["breached"] and "events" not in cycle["failed"], cycle
    assert cycle["alerts"].get("events") == "resolved", cycle


def test_spark_driver_killed_mid_merge_is_finished_by_the_task_retry(deployment: Deployment):
    """crashy: 2 regions x 8 generations, at most 2 generations per commit. The Spark driver of the first
    attempt is SIGKILLed inside its second merge commit (MEMWAL_FAULT=merge.before_commit, SKIP=1). Rule: the
    task fails that try, its retry resumes from merged_generations and finishes; the table equals the model."""
    af, t = deployment.af, deployment.tables["crashy"]
    flushed = t.flushed()
    total = sum(len(g) for g in flushed.values())
    deployment.arm_driver_fault()
    run = af.trigger_dag(MERGE, conf={"table": "crashy"})
    expect_success(deployment, MERGE, run, timeout=RUN_TIMEOUT + 120)

    assert len(deployment.killed_drivers()) == 1, "exactly one driver was killed by the fault point"
    tries = af.task_tries(MERGE, run, "merge")
    assert [x["state"] for x in sorted(tries, key=lambda x: x["try_number"])] == ["failed", "success"], tries
    first_log = af.task_log(MERGE, run, "merge", try_number=1)
    assert "ended before the job reported a result" in first_log, "the first try failed because its driver died"
    summary = af.xcom(MERGE, run, "merge")
    assert 0 < summary["generations_merged"] < total, (
        f"the retry merged what the killed driver had not committed ({summary['generations_merged']} of {total})")
    assert t.base() == t.model, "the retry finished the merge: the table equals the model"
    assert t.merged_generations() == {r: max(g) for r, g in flushed.items()}


def test_maintenance_dag_on_spark_connect(deployment: Deployment):
    """linked (engine spark_connect): its maintenance DAG on the deployment's Spark Connect server. Rule: the
    run succeeds, the base table equals the model, every region's last generation is merged; each merge
    deduplicated on the server with its driver in the task process (ran_on), and retention and GC ran in
    process (driver-only work starts no Spark)."""
    af, t = deployment.af, deployment.tables["linked"]
    flushed = t.flushed()
    dag_id = maintenance("linked")
    af.wait_for_dag(dag_id)
    run = af.trigger_dag(dag_id)
    expect_success(deployment, dag_id, run)
    assert t.base() == t.model, "after the maintenance run the base table equals the model"
    assert t.merged_generations() == {r: max(g) for r, g in flushed.items()}
    merges = [s for s in mapped_xcoms(deployment, dag_id, run, "merge") if s.get("generations_merged")]
    assert merges and all(s["ran_on"] == {"plan": "in_process", "driver": "in_process", "dedup": "spark_connect"}
                          for s in merges), merges
    assert all(s["spark_connect_url"].rstrip("/") == deployment.connect.url for s in merges), merges
    for task in ("retention", "gc"):
        summary = af.xcom(dag_id, run, task)
        assert summary["engine"] == "in_process" and summary["ran_on"][task] == "in_process", summary


FLEET = "memwal_fleet"
FLEET_MAINTAIN = "memwal_fleet_maintain"


def fleet_cycle(dep: Deployment) -> tuple[str, dict]:
    """One probe cycle, triggered through the REST API (the schedule is off here): its run id and report."""
    run = dep.af.trigger_dag(FLEET)
    expect_success(dep, FLEET, run)
    return run, dep.af.xcom(FLEET, run, "probe")


def fleet_table(dep: Deployment, name: str, copy_of: str | None = None) -> LanceCoreTable:
    """A table under the fleet root (a copy of `copy_of` first, when given) with the model of its base rows."""
    path = dep.fleet_root / f"{name}.lance"
    if copy_of:
        shutil.copytree(dep.fleet_root / f"{copy_of}.lance", path)
    t = LanceCoreTable(str(path), None)
    t.model = {i: (f"base{i}", i / 2) for i in range(20)}  # what LanceCoreTable.create wrote
    return t


def test_fleet_idle_cycle_is_one_task_and_only_due_tables_run_their_due_jobs(deployment: Deployment):
    """100 idle tables under the `fleet` root. Rule: an idle cycle is one task instance (the probe) and no
    maintenance run; three tables written by Lance core's writer get one maintenance run holding just them,
    each running merge then snapshot (its due jobs, in order) and equal to its model after; a table copied under
    the root is probed and maintained on the next cycle."""
    af = deployment.af
    names = sorted(p.name[: -len(".lance")] for p in deployment.fleet_root.glob("*.lance"))
    assert len(names) >= 100
    af.wait_for_dag(FLEET_MAINTAIN)
    af.set_paused(FLEET_MAINTAIN, False)

    run, answer = fleet_cycle(deployment)
    assert [ti["task_id"] for ti in af.task_instances(FLEET, run)] == ["probe"], "an idle cycle is one task"
    assert (answer["probed"], answer["due"], answer["dispatched"], answer["errors"]) == (len(names), 0, [], [])
    assert af.dag_runs(FLEET_MAINTAIN) == [], "nothing due: no maintenance run"

    written = {n: fleet_table(deployment, n) for n in ("t007", "t042", "t099")}
    for n, t in written.items():
        t.write_generations(None, rounds=1, offset=100, tag=f"{n}-")
    run, answer = fleet_cycle(deployment)
    dispatched = {d["table"]: d["jobs"] for d in answer["dispatched"]}
    assert dispatched == {f"fleet.{n}": ["merge", "snapshot"] for n in written}, answer["dispatched"]
    assert [ti["task_id"] for ti in af.task_instances(FLEET, run)] == ["probe"]
    expect_success(deployment, FLEET_MAINTAIN, answer["run_id"])
    chains = mapped_xcoms(deployment, FLEET_MAINTAIN, answer["run_id"], "maintain")
    assert {c["table"]: list(c["summaries"]) for c in chains} == dispatched, "only the due jobs, in order"
    for n, t in written.items():
        [chain] = [c for c in chains if c["table"] == f"fleet.{n}"]
        assert chain["summaries"]["merge"]["generations_merged"] == sum(len(g) for g in t.flushed().values())
        assert t.base() == t.model and t.merged_generations() == {r: max(g) for r, g in t.flushed().items()}
    assert [r["dag_run_id"] for r in af.dag_runs(FLEET_MAINTAIN)] == [answer["run_id"]]

    added = fleet_table(deployment, "t999", copy_of="t000")
    added.write_generations(None, rounds=1, offset=100, tag="added-")
    run, answer = fleet_cycle(deployment)
    assert answer["probed"] == len(names) + 1
    dispatched = {d["table"]: d["jobs"] for d in answer["dispatched"]}
    assert dispatched.get("fleet.t999", [])[:1] == ["merge"], answer["dispatched"]
    assert set(dispatched) <= {"fleet.t999", *(f"fleet.{n}" for n in written)}, "no idle table gets work"
    expect_success(deployment, FLEET_MAINTAIN, answer["run_id"])
    assert added.base() == added.model


def places_containing(dep: Deployment, needle: str) -> dict[str, list[str]]:
    """Where `needle` occurs, by kind: spark-submit argv (the recording wrapper), process command lines
    (sampled from /proc), DAG run conf, rendered template fields, task logs (every try, as the UI reads them
    through the REST API), XCom values, asset events, files (every log under AIRFLOW_HOME: the components'
    and the task logs on disk; the DAG folder; the tables file), the Spark master's, worker's and executors'
    logs, and rows of the metadata database."""
    af = dep.af
    found: dict[str, list[str]] = {k: [] for k in (
        "argv", "process", "conf", "rendered", "log", "xcom", "asset_event", "file", "spark_log", "metadata_db")}
    found["spark_log"] = [str(p) for p in dep.spark.log_files() + dep.connect_log_files()
                          if needle.encode() in p.read_bytes()]
    found["argv"] = [json.dumps(a) for a in dep.recorder.argvs() if needle in json.dumps(a)]
    found["process"] = [" ".join(a) for a in dep.sampler.argvs() + list(dep.sampler.leaks.values())
                        if needle in " ".join(a)]
    for dag in af.request("GET", "/api/v2/dags", params={"limit": 100})["dags"]:
        dag_id = dag["dag_id"]
        for run in af.dag_runs(dag_id):
            run_id = run["dag_run_id"]
            if needle in json.dumps(run.get("conf")):
                found["conf"].append(f"{dag_id}/{run_id}")
            for ti in af.task_instances(dag_id, run_id):
                where = f"{dag_id}/{run_id}/{ti['task_id']}[{ti['map_index']}]"
                if needle in json.dumps(ti.get("rendered_fields")):
                    found["rendered"].append(where)
                for try_number in range(1, (ti.get("try_number") or 0) + 1):
                    if needle in af.task_log(dag_id, run_id, ti["task_id"], try_number, ti["map_index"]):
                        found["log"].append(f"{where} try {try_number}")
            for entry in af.xcom_entries(dag_id, run_id):
                value = af.xcom(dag_id, run_id, entry["task_id"], entry["key"], entry["map_index"])
                if needle in json.dumps(value, default=str):
                    found["xcom"].append(f"{dag_id}/{run_id}/{entry['task_id']}.{entry['key']}")
    found["asset_event"] = [str(e["id"]) for e in af.asset_events() if needle in json.dumps(e, default=str)]
    files = [p for p in Path(af.home).rglob("*") if p.is_file() and p.name != "passwords.json"]
    files += [p for p in (REPO / "dags").rglob("*") if p.is_file()] + [dep.tables_file]
    found["file"] = [str(p) for p in files if needle.encode() in p.read_bytes()]
    found["metadata_db"] = metadata_tables_containing(af, needle)
    return found


def test_canary_secret_appears_nowhere(deployment: Deployment):
    """The storage connection's secret key is a unique canary, used by every DAG run above (Spark and
    in-process; every Spark job received it in its storage options file, recorded by hash). Rule: it appears
    in no task log (as the UI reads them and on disk), XCom value, rendered template field, asset event, DAG
    file, spark-submit argv (recorded by a wrapper and sampled from /proc), component log (scheduler,
    api-server, dag-processor, triggerer), Spark master, worker or executor log, or row of the metadata
    database; nor does the webhook URL (a secret by docs/airflow.md). Controls: the same search finds the tables'
    bucket name (which is no secret) in each of those places that the runs write it to, and every Spark
    application's id in the master's, worker's and executors' logs, so an empty result means absent, not
    unsearched; the secret reached every Spark job and the webhook URL reached the notifier."""
    af = deployment.af
    argvs = deployment.recorder.argvs()
    assert len(argvs) >= 3, f"the earlier tests ran spark-submit through the recorder: {argvs}"
    assert all(any(a.startswith("--storage-options-json") for a in argv) for argv in argvs), (
        "on Spark the storage options go by file")
    canary_sha256 = hashlib.sha256(deployment.canary.encode()).hexdigest()
    assert {r["secret_sha256"] for r in deployment.recorder.records()} == {canary_sha256}, (
        "the connection's secret (the canary) reached every Spark job, in its storage options file")
    # Every DAG's runs in one call (`~`), not a listing per DAG of the first page of /dags.
    runs = af.request("GET", "/api/v2/dags/~/dagRuns", params={"limit": 1})["total_entries"]
    assert runs >= 6, "the earlier tests' DAG runs are there to search"
    for name in ("scheduler", "api-server", "dag-processor", "triggerer"):
        assert (af.logs_dir / f"{name}.log").stat().st_size > 0, f"the {name} log was written"

    bucket = deployment.tables["orders"].uri.split("/")[2]
    control = places_containing(deployment, bucket)
    for kind in ("argv", "process", "log", "xcom", "asset_event", "file", "metadata_db"):
        assert control[kind], f"control: the bucket name is found in {kind} (the search there works)"
    assert places_containing(deployment, "crashy")["rendered"], "control: rendered fields are searched"
    # Control for the Spark logs (executors receive the storage options): every application that ran on the
    # standalone cluster is named in the master's log, the worker's and its executors' own logs.
    apps = [a["id"] for a in deployment.spark.state().get("completedapps", [])]
    assert apps, "the earlier tests ran Spark applications on the standalone cluster"
    for app in apps:
        hits = places_containing(deployment, app)["spark_log"]
        assert any(h.endswith("master.log") for h in hits) and any(h.endswith("worker.log") for h in hits), hits
        assert any(f"/{app}/" in h and h.endswith(("stderr", "stdout")) for h in hits), (
            f"control: executor logs of {app} are searched: {hits}")

    # Control for the Spark Connect server's logs: its event log holds the plans of the `linked` jobs.
    assert places_containing(deployment, "map_partitions")["spark_log"], "control: the Connect logs are searched"
    leaks = {kind: hits for kind, hits in places_containing(deployment, deployment.canary).items() if hits}
    assert not leaks, f"the canary secret leaked into: {leaks}"
    # The webhook URL is a secret too (docs/airflow.md, Alerts). Control: it reached the notifier (alerts arrived).
    assert deployment.webhook.messages(), "the lag alerts reached the webhook, through the connection's URL"
    leaks = {kind: hits for kind, hits in places_containing(deployment, deployment.webhook.url).items() if hits}
    assert not leaks, f"the webhook URL leaked into: {leaks}"


def metadata_tables_containing(af, needle: str) -> list[str]:
    """Tables of the Airflow metadata database with a row whose text contains `needle`."""
    import sqlalchemy as sa

    engine = sa.create_engine(af._sql_conn)
    hits = []
    try:
        with engine.connect() as conn:
            for name in sa.inspect(conn).get_table_names():
                quoted = conn.dialect.identifier_preparer.quote(name)
                if af.backend == "postgresql":
                    rows = conn.execute(sa.text(f"SELECT t::text FROM {quoted} t"))
                else:
                    rows = conn.execute(sa.text(f"SELECT * FROM {quoted}"))
                if any(needle in repr(tuple(r)) or needle in str(tuple(r)) for r in rows):
                    hits.append(name)
    finally:
        engine.dispose()
    return hits
