"""The MemWAL DAGs, built from the tables configuration; the files under dags/ only call these.

- `maintenance_dag(cfg)`: `memwal_maintenance__<table>`, on the table's schedule and on its lag asset:
  find regions with pending work -> merge, mapped over at most `max_merge_applications` region batches
  (one Spark application each; ascending generations inside a region) -> index catch-up -> compaction
  (when due) -> version retention -> snapshot refresh -> GC. This order is the safe one: compaction runs
  once the indexes are caught up (its index remap keeps them so), retention before GC so that GC may free
  what the removed versions held.
- `merge_dag(tables)`: `memwal_merge`, manual, a Params form (table, regions, up_to_generation, engine,
  dry_run).
- `backfill_dag(tables)`: `memwal_backfill`, manual: the backlog in bounded chunks (generations or bytes
  per Spark application) as mapped tasks, then index catch-up (or rebuild), compaction when due (a backfill
  leaves many fragments) and snapshot refresh.

Nothing here does I/O when a DAG is built: tasks read the tables configuration (with the Variable
override) and the table when they run. The pool `memwal_spark` (create it: `airflow pools set
memwal_spark 4 "MemWAL Spark applications"`) bounds concurrent Spark applications across all tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG, AssetAlias, AssetOrTimeSchedule, CronTriggerTimetable, Param, task
from airflow.sdk.exceptions import AirflowFailException

from memwal.airflow.config import TableConfig, TableConfigError
from memwal.airflow.operators.memwal import (
    MERGED_ALIAS,
    MemWalCatchupOperator,
    MemWalCompactionOperator,
    MemWalGcOperator,
    MemWalMergeOperator,
    MemWalRetentionOperator,
    MemWalSnapshotOperator,
)

__all__ = [
    "BACKFILL_DAG_ID",
    "MERGE_DAG_ID",
    "SPARK_POOL",
    "backfill_dag",
    "invalid_table_dag",
    "maintenance_dag",
    "maintenance_dag_id",
    "merge_dag",
]

SPARK_POOL = "memwal_spark"
MERGE_DAG_ID = "memwal_merge"
BACKFILL_DAG_ID = "memwal_backfill"
START = datetime(2025, 1, 1, tzinfo=UTC)
UUID_PATTERN = r"^\s*[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\s*$"
SIZE_PATTERN = r"^\s*\d+\s*([kKmMgGtT]?)(i?[bB]?)\s*$"
DEFAULT_ARGS = {"owner": "memwal", "retries": 2, "retry_delay": timedelta(seconds=60),
                "retry_exponential_backoff": 2.0}


def maintenance_dag_id(table: str) -> str:
    return f"memwal_maintenance__{table}"


def _pool(cfg: TableConfig) -> str | None:
    return SPARK_POOL if cfg.engine != "in_process" else None


def _schedule(cfg: TableConfig) -> Any:
    """The table's clock and its lag asset (when `memwal.airflow.assets.lag_asset` is available)."""
    from memwal.airflow import assets

    lag = getattr(assets, "lag_asset", None)
    clock = CronTriggerTimetable(cfg.schedule, timezone="UTC") if cfg.schedule else None
    if lag is None:
        return clock
    if clock is None:
        return [lag(cfg)]
    return AssetOrTimeSchedule(timetable=clock, assets=lag(cfg))


# --- tasks shared by the DAGs (run time: config with the Variable, then the table) -----------------------


def _table(name: str) -> TableConfig:
    from memwal.airflow.config import get_table

    try:
        return get_table(str(name).strip())
    except TableConfigError as exc:
        raise AirflowFailException(str(exc)) from None


def _hook(cfg: TableConfig):
    from memwal.airflow.hooks.memwal import MemWalHook

    return MemWalHook.for_table(cfg)


@task(task_id="find_pending_regions")
def find_pending_regions(table: str) -> list[list[str]]:
    """Regions with unmerged generations, in at most max_merge_applications batches (one merge each)."""
    from memwal.airflow.planning import region_batches

    cfg = _table(table)
    pending = _hook(cfg).pending_work(cfg)
    for p in pending:
        print(f"region {p['region_id']}: generations {p['generations'][:1]}..{p['generations'][-1:]} "
              f"({len(p['generations'])}), {p['rows']} rows, {p['bytes']} bytes"
              + (f", error: {p['error']}" if p.get("error") else ""))
    batches = region_batches(pending, cfg.max_merge_applications)
    print(f"table {cfg.name}: {len(pending)} regions with pending work in {len(batches)} merge batches")
    return batches


@task(task_id="plan", multiple_outputs=True)
def plan_merge(params: dict | None = None) -> dict[str, Any]:
    """Validate the form (table, regions that exist, up_to_generation) and the plan of the merge:
    generations, rows and bytes per region. With dry_run this plan is the result."""
    params = params or {}
    cfg = _table(params.get("table", ""))
    hook = _hook(cfg)
    regions = hook.validate_regions(cfg, [r for r in params.get("regions") or [] if str(r).strip()])
    up_to = params.get("up_to_generation")
    if up_to is not None and len(regions or []) != 1:
        raise AirflowFailException("up_to_generation needs exactly one region (regions: one UUID)")
    engine = params.get("engine") or "default"
    pending = hook.pending_work(cfg, regions, up_to)
    plan = [{k: p[k] for k in ("region_id", "merged_generation", "generations", "rows", "bytes") if k in p}
            | ({"error": p["error"]} if p.get("error") else {}) for p in pending]
    return {"table": cfg.name, "regions": regions or [], "up_to_generation": up_to,
            "engine": cfg.engine if engine == "default" else engine, "dry_run": bool(params.get("dry_run")),
            "plan": plan, "generations": sum(len(p["generations"]) for p in plan),
            "rows": sum(p["rows"] for p in plan), "bytes": sum(p["bytes"] for p in plan)}


@task.short_circuit(task_id="unless_dry_run")
def unless_dry_run(dry_run: bool) -> bool:
    """A dry run stops here: the plan (XCom of `plan`) is the result."""
    if dry_run:
        print("dry run: nothing merged; the plan is the XCom of task `plan`")
    return not dry_run


@task(task_id="plan")
def plan_backfill(params: dict | None = None, ti: Any = None) -> list[dict[str, Any]]:
    """The backlog (from merged_generations now: a rerun resumes) as bounded chunks, in order: returns
    the chunks to map over and pushes table, plan, targets, dry_run and max_bytes as XComs of their own."""
    from memwal.airflow.planning import backfill_chunks
    from memwal.jobs import byte_size

    params = params or {}
    cfg = _table(params.get("table", ""))
    hook = _hook(cfg)
    regions = hook.validate_regions(cfg, [r for r in params.get("regions") or [] if str(r).strip()])
    max_gens = params.get("max_generations_per_application") or None
    size = params.get("max_bytes_per_application")
    try:
        max_bytes = byte_size(str(size)) if size not in (None, "") else None
    except Exception as exc:
        raise AirflowFailException(f"max_bytes_per_application: {exc}") from None
    if not max_gens and not max_bytes:
        raise AirflowFailException("set max_generations_per_application or max_bytes_per_application")
    pending = hook.pending_work(cfg, regions)
    chunks = backfill_chunks(pending, max_gens, max_bytes)
    targets = {p["region_id"]: p["generations"][-1] for p in pending if p["generations"]}
    for i, c in enumerate(chunks):
        print(f"chunk {i}: region {c['regions'][0]} generations {c['generations'][0]}..{c['generations'][1]}, "
              f"{c['bytes']} bytes")
    print(f"table {cfg.name}: {sum(len(p['generations']) for p in pending)} generations in {len(chunks)} chunks")
    for key, value in {"table": cfg.name, "plan": chunks, "targets": targets,
                       "dry_run": bool(params.get("dry_run")), "max_bytes": max_bytes}.items():
        ti.xcom_push(key=key, value=value)
    # Each mapped task merges the next bounded run of generations of its region from where the region
    # stands when it starts, up to the plan's target: any order, a retry or a concurrent merger keeps
    # every chunk within its bound and the chunks together drain the backlog.
    return [{"regions": c["regions"], "up_to_generation": targets[c["regions"][0]]} for c in chunks]


@task(task_id="verify_backlog_drained", trigger_rule="none_failed")
def verify_backlog_drained(table: str, targets: Mapping[str, int]) -> dict[str, Any]:
    """Every region merged up to what the plan found; else fail saying how to resume."""
    cfg = _table(table)
    index = _hook(cfg).table(cfg).index
    behind = {r: (index.details.merged_generation(r), g) for r, g in targets.items()
              if index.details.merged_generation(r) < g}
    if behind:
        detail = "; ".join(f"region {r} at {m} of {g}" for r, (m, g) in sorted(behind.items()))
        raise AirflowFailException(f"table {cfg.name!r}: backlog not drained ({detail}): rerun memwal_backfill, "
                                   "it resumes from merged_generations")
    merged = {r: index.details.merged_generation(r) for r in targets}
    print(f"table {cfg.name}: every planned region merged up to its target: {merged}")
    return {"table": cfg.name, "merged_generations": merged}


# --- the DAGs -------------------------------------------------------------------------------------------


def maintenance_dag(cfg: TableConfig) -> DAG:
    """`memwal_maintenance__<table>`: merge (mapped over region batches), catch-up, compaction when due,
    version retention, snapshot, GC."""
    pool = _pool(cfg)
    pool_kw = {"pool": pool} if pool else {}
    with DAG(
        dag_id=maintenance_dag_id(cfg.name),
        description=f"MemWAL maintenance of table {cfg.name}: merge, index catch-up, compaction, version "
                    "retention, snapshot refresh, GC",
        schedule=_schedule(cfg),
        start_date=START,
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        tags=["memwal", f"memwal_table:{cfg.name}"],
        doc_md=(f"Maintenance of MemWAL table **{cfg.name}** (`{cfg.uri}`), engine `{cfg.engine}`: regions with "
                f"pending work are merged in at most {cfg.max_merge_applications} batches (one merge each), then "
                "index catch-up, compaction when due, version retention, snapshot refresh and GC. Runs on its "
                "schedule and when the table's lag asset fires. Every task is safe to retry."),
    ) as dag:
        batches = find_pending_regions(cfg.name)
        merge = MemWalMergeOperator.partial(
            task_id="merge", table=cfg.name, outlets=[AssetAlias(f"{MERGED_ALIAS}__{cfg.name}")],
            map_index_template="{{ memwal_merged_label }}", **pool_kw,
        ).expand(regions=batches)
        catchup = MemWalCatchupOperator(task_id="index_catchup", table=cfg.name, trigger_rule="none_failed",
                                        **pool_kw)
        compaction = MemWalCompactionOperator(task_id="compaction", table=cfg.name, **pool_kw)
        retention = MemWalRetentionOperator(task_id="retention", table=cfg.name, **pool_kw)
        snapshot = MemWalSnapshotOperator(task_id="snapshot_refresh", table=cfg.name, **pool_kw)
        gc = MemWalGcOperator(task_id="gc", table=cfg.name, **pool_kw)
        merge >> catchup >> compaction >> retention >> snapshot >> gc
    return dag


def _table_param(tables: Mapping[str, TableConfig], description: str) -> Param:
    names = sorted(tables)
    if not names:
        return Param("", type="string", title="table", description=description + " (no tables configured)")
    return Param(names[0], type="string", enum=names, title="table", description=description)


def _regions_param() -> Param:
    return Param([], type="array", items={"type": "string", "pattern": UUID_PATTERN}, title="regions",
                 description="Region ids (UUIDs), one per line; empty: every region. Each must exist.")


def _engine_param() -> Param:
    return Param("default", type="string", enum=["default", "spark", "spark_connect", "auto", "in_process"],
                 title="engine", description="default: the table's engine from the tables file")


def merge_dag(tables: Mapping[str, TableConfig]) -> DAG:
    """`memwal_merge`: a merge from the trigger form; dry_run returns the plan only."""
    with DAG(
        dag_id=MERGE_DAG_ID,
        description="Merge flushed MemWAL generations of one table now (a form; dry run shows the plan)",
        schedule=None,
        start_date=START,
        catchup=False,
        default_args={**DEFAULT_ARGS, "retries": 1},
        render_template_as_native_obj=True,
        tags=["memwal"],
        params={
            "table": _table_param(tables, "A configured table (dags/memwal_tables.yaml)"),
            "regions": _regions_param(),
            "up_to_generation": Param(None, type=["null", "integer"], minimum=1, title="up to generation",
                                      description="Merge no generation above this one (needs exactly one region)"),
            "engine": _engine_param(),
            "dry_run": Param(False, type="boolean", title="dry run",
                             description="Only plan: which generations, rows and bytes per region"),
        },
        doc_md="Merge one configured table's flushed generations now. `dry_run` returns the plan (XCom of "
               "`plan`). The merge summary is the XCom of `merge`; the table's asset gets an event.",
    ) as dag:
        plan = plan_merge()
        go = unless_dry_run(plan["dry_run"])
        merge = MemWalMergeOperator(
            task_id="merge", table=plan["table"], regions=plan["regions"], up_to_generation=plan["up_to_generation"],
            engine=plan["engine"], pool=SPARK_POOL,
        )
        go >> merge
    return dag


def backfill_dag(tables: Mapping[str, TableConfig]) -> DAG:
    """`memwal_backfill`: drain a backlog in bounded chunks (mapped), then catch-up and snapshot."""
    with DAG(
        dag_id=BACKFILL_DAG_ID,
        description="Drain a MemWAL backlog in bounded chunks, then index catch-up (or rebuild), compaction "
                    "when due and snapshot",
        schedule=None,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        render_template_as_native_obj=True,
        tags=["memwal"],
        params={
            "table": _table_param(tables, "A configured table (dags/memwal_tables.yaml)"),
            "regions": _regions_param(),
            "max_generations_per_application": Param(
                32, type=["null", "integer"], minimum=1, title="max generations per application",
                description="Generations one chunk (one Spark application) merges at most"),
            "max_bytes_per_application": Param(
                "4GiB", type=["null", "string"], pattern=SIZE_PATTERN, title="max bytes per application",
                description="Bytes of generation data one chunk merges at most, e.g. 4GiB, 512MiB"),
            "engine": _engine_param(),
            "rebuild_indexes": Param(False, type="boolean", title="rebuild indexes",
                                     description="Recreate the maintained scalar indexes from scratch"),
            "dry_run": Param(False, type="boolean", title="dry run", description="Only plan the chunks"),
        },
        doc_md="Drain a large backlog: chunks of at most N generations / B bytes per region, one merge (Spark "
               "application) each, in order (mapped task `merge_chunk`, labelled by region and generation). "
               "A rerun resumes from merged_generations; safe beside the maintenance DAG.",
    ) as dag:
        plan = plan_backfill()
        go = unless_dry_run(plan["dry_run"])
        merge = MemWalMergeOperator.partial(
            task_id="merge_chunk", table=plan["table"], engine="{{ params.engine }}", pool=SPARK_POOL,
            max_active_tis_per_dagrun=1, max_generations_per_run="{{ params.max_generations_per_application }}",
            max_bytes_per_run="{{ ti.xcom_pull(task_ids='plan', key='max_bytes') }}",
            map_index_template="{{ memwal_merged_label }}",
        ).expand_kwargs(plan)
        verify = verify_backlog_drained(plan["table"], plan["targets"])
        catchup = MemWalCatchupOperator(task_id="index_catchup", table=plan["table"], engine="{{ params.engine }}",
                                        rebuild="{{ params.rebuild_indexes }}", pool=SPARK_POOL)
        compaction = MemWalCompactionOperator(task_id="compaction", table=plan["table"],
                                              engine="{{ params.engine }}", pool=SPARK_POOL)
        snapshot = MemWalSnapshotOperator(task_id="snapshot_refresh", table=plan["table"],
                                          engine="{{ params.engine }}", pool=SPARK_POOL)
        go >> merge >> verify >> catchup >> compaction >> snapshot
    return dag


class _InvalidTableDag(DAG):
    """Stands in for a table whose entry is invalid: bagging it (DAG.validate) raises the entry's
    TableConfigError, which Airflow records as the DAG file's import error, while the other tables'
    DAGs from the same file still load."""

    memwal_error: Exception | None = None

    def validate(self) -> None:
        raise self.memwal_error or TableConfigError("tables file", self.dag_id, None, "invalid entry")


def invalid_table_dag(name: str, error: Exception) -> DAG:
    """A DAG object whose validation fails with `error` (see _InvalidTableDag)."""
    dag = _InvalidTableDag(dag_id=maintenance_dag_id(name), schedule=None, start_date=START)
    dag.memwal_error = error
    return dag
