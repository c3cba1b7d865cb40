"""Operators for the six MemWAL jobs: merge, index catch-up, snapshot refresh, GC, compaction, retention.

Each resolves its table from the tables configuration at run time (`memwal.airflow.config.get_table`,
the Variable override included), runs the job through `MemWalHook` on the table's engine (spark: the
existing `spark_jobs/` entry point through the Spark provider's SparkSubmitHook; spark_connect: the driver
logic in the worker, the executor work on a Spark Connect server; auto: by the work's size; in_process: the
same library code in the worker; a job without executor work runs in the worker whatever the engine,
`memwal.engines`), and returns the job's JSON summary (XCom `return_value`). Exit status 3
(some regions or indexes failed) pushes the summary first, then fails the task with the one-line reason.
Every job is idempotent and resumes from what the table records (merged_generations, index catch-up
progress), so every task is safe to retry.

The merge operator emits an asset event on the table's asset (`memwal.airflow.assets.table_asset`)
through its AssetAlias outlet when it merged anything, its extra carrying the merge summary. Airflow drops
the asset events of a task that fails, so what a failed attempt merged (exit 3 after some commits) is kept
in the task state store and announced by the event of the retry that succeeds.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import AssetAlias, BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from memwal.airflow.config import ENGINES
from memwal.airflow.hooks.memwal import JobRun, MemWalHook, MemWalTaskError
from memwal.airflow.params import flag, optional_int, string_list
from memwal.job_config import JobOptions
from memwal.job_specs import SPECS

if TYPE_CHECKING:
    from airflow.sdk import Context

    from memwal.airflow.config import TableConfig

__all__ = [
    "MemWalCatchupOperator",
    "MemWalCompactionOperator",
    "MemWalGcOperator",
    "MemWalJobOperator",
    "MemWalMergeOperator",
    "MemWalRetentionOperator",
    "MemWalSnapshotOperator",
    "combine_event_extras",
    "merge_event_extra",
    "merged_label",
]

log = logging.getLogger(__name__)



def _names(name: str, value: Any) -> tuple[str, ...] | None:
    names = string_list(name, value)
    return tuple(names) if names else None


# How an operator's keyword argument of a job option is read (templated fields render to text).
_OPERATOR_VALUES = {"int": optional_int, "flag": lambda name, value: flag(value), "list": _names}


class MemWalJobOperator(BaseOperator):
    """Base: run `job` on a configured table; subclasses add the job's options."""

    job: ClassVar[str] = ""
    template_fields: Sequence[str] = ("table", "regions", "engine")
    ui_color = "#e8f0fe"

    def __init__(self, *, table: str, regions: Sequence[str] | str | None = None, engine: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.table = table
        self.regions = regions
        self.engine = engine

    def job_options(self, cfg: TableConfig) -> JobOptions:
        """The table's options for the job (`TableConfig.job_options`), overridden by this operator's keyword
        arguments named as the job's options are (`memwal.job_spec.option(operator=...)`)."""
        spec = SPECS[self.job]
        return spec.with_overrides(cfg.job_options(), {
            name: _OPERATOR_VALUES[kind](name, getattr(self, name, None))
            for name, kind in spec.operator_fields().items()})

    # what subclasses override

    def after_job(self, context: Context, cfg: TableConfig, run: JobRun) -> None:
        """Called with the summary of a job that ran (exit 0 or 3), before the task's outcome."""

    @cached_property
    def cfg(self) -> TableConfig:
        """The table's configuration, resolved at run time (after templating)."""
        from memwal.airflow.config import config_errors_fail, get_table

        with config_errors_fail():
            return get_table(str(self.table).strip())

    @cached_property
    def hook(self) -> MemWalHook:
        """One hook per operator (the table's connection and its opened table)."""
        return MemWalHook.for_table(self.cfg)

    def resolved_engine(self, cfg: TableConfig) -> str:
        engine = (self.engine or "").strip() if isinstance(self.engine, str) else self.engine
        if not engine or engine in ("default", "None"):
            return cfg.engine
        if engine not in ENGINES:
            raise AirflowFailException(f"engine {engine!r} is not {', '.join(ENGINES)} or default")
        return engine

    def execute(self, context: Context) -> dict[str, Any]:
        cfg = self.cfg
        what = f"table {cfg.name!r} ({cfg.uri})"
        regions = self.hook.validate_regions(cfg, string_list("regions", self.regions)) if self.job in (
            "merge", "gc") else None
        run = self.hook.run_job(
            self.job, cfg, regions=regions, options=self.job_options(cfg), engine=self.resolved_engine(cfg),
            spark_conn_id=cfg.spark_conn_id, spark_conf=cfg.spark_conf,
            spark_connect_conn_id=cfg.spark_connect_conn_id, auto_spark_engine=cfg.auto_spark_engine,
        )
        summary = dict(run.summary)
        summary.setdefault("table", cfg.name)
        self.after_job(context, cfg, JobRun(run.job, summary, run.returncode, run.reason))
        if run.returncode != 0:
            context["ti"].xcom_push(key="return_value", value=summary)
            raise MemWalTaskError(f"memwal {self.job} on {what}: {run.reason or f'exit {run.returncode}'} "
                                  "(summary pushed to XCom; the retry resumes)")
        return summary

    def on_kill(self) -> None:
        if "hook" in self.__dict__:  # only a hook this task built
            self.hook.on_kill()


def merge_event_extra(cfg: TableConfig, summary: dict[str, Any]) -> dict[str, Any]:
    """The asset event's extra of a merge: per region the generations merged, and the row counts."""
    return {
        "table": cfg.name,
        "table_uri": summary.get("table_uri", cfg.uri),
        "table_version_before": summary.get("table_version_before"),
        "table_version_after": summary.get("table_version_after"),
        "generations_merged": summary.get("generations_merged", 0),
        "rows_upserted": summary.get("rows_upserted", 0),
        "rows_deleted": summary.get("rows_deleted", 0),
        "regions": {
            r["region_id"]: {
                "generations": r.get("generations", []),
                "merged_generation_before": r.get("merged_generation_before"),
                "merged_generation_after": r.get("merged_generation_after"),
                "rows_upserted": r.get("rows_upserted", 0),
                "rows_deleted": r.get("rows_deleted", 0),
            }
            for r in summary.get("regions", [])
            if r.get("generations")
        },
    }


def combine_event_extras(earlier: dict[str, Any] | None, later: dict[str, Any]) -> dict[str, Any]:
    """One merge event's extra covering an earlier attempt's (failed, unannounced) merges and a later
    attempt's: per region the generations of both in order, the first `before`, the last `after`; the
    totals summed; the table versions from the first `before` to the last `after`."""
    if not earlier:
        return later
    regions = {rid: dict(r) for rid, r in earlier.get("regions", {}).items()}
    for rid, r in later.get("regions", {}).items():
        if rid not in regions:
            regions[rid] = dict(r)
            continue
        first = regions[rid]
        regions[rid] = {"generations": [*first.get("generations", []), *r.get("generations", [])],
                        "merged_generation_before": first.get("merged_generation_before"),
                        "merged_generation_after": r.get("merged_generation_after"),
                        **{k: first.get(k, 0) + r.get(k, 0) for k in ("rows_upserted", "rows_deleted")}}
    return {**later, "table_version_before": earlier.get("table_version_before"), "regions": regions,
            **{k: earlier.get(k, 0) + later.get(k, 0) for k in ("generations_merged", "rows_upserted",
                                                                  "rows_deleted")}}


def merged_label(summary: dict[str, Any]) -> str:
    """`region <id>: generations a..b` per region merged (or `nothing to merge`), for task labels."""
    parts = []
    for r in summary.get("regions", []):
        gens = r.get("generations") or []
        if gens:
            parts.append(f"region {r['region_id']}: generations {gens[0]}..{gens[-1]}")
        elif r.get("error"):
            parts.append(f"region {r['region_id']}: failed")
    return "; ".join(parts) or "nothing to merge"


class MemWalMergeOperator(MemWalJobOperator):
    """Merge flushed generations (ascending per region) into the base table; emits a table asset event.

    `up_to_generation` needs exactly one region. `max_generations_per_run` / `max_bytes_per_run` bound
    what this one task merges (backfill chunks): the bound is applied to what is pending when the task
    starts, so a retry or a concurrent merger never makes a chunk larger.
    """

    job = "merge"
    template_fields: Sequence[str] = (
        "table", "regions", "engine", "up_to_generation", "max_generations_per_commit", "max_bytes_per_commit",
        "max_generations_per_run", "max_bytes_per_run",
    )

    def __init__(self, *, up_to_generation: int | str | None = None, max_generations_per_commit: int | None = None,
                 max_bytes_per_commit: int | None = None, max_generations_per_run: int | str | None = None,
                 max_bytes_per_run: int | str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("outlets", [AssetAlias(MERGED_ALIAS)])
        super().__init__(**kwargs)
        self.up_to_generation = up_to_generation
        self.max_generations_per_commit = max_generations_per_commit
        self.max_bytes_per_commit = max_bytes_per_commit
        self.max_generations_per_run = max_generations_per_run
        self.max_bytes_per_run = max_bytes_per_run


    def execute(self, context: Context) -> dict[str, Any]:
        gens = optional_int("max_generations_per_run", self.max_generations_per_run)
        nbytes = optional_int("max_bytes_per_run", self.max_bytes_per_run)
        if gens or nbytes:
            bounded = self._bounded_up_to(gens, nbytes)
            if bounded is None:
                cfg = self.cfg
                self.log.info("table %s: nothing pending within this chunk; already merged", cfg.name)
                context["memwal_merged_label"] = "nothing to merge"
                return {"job": "merge", "table": cfg.name, "table_uri": cfg.uri, "generations_merged": 0,
                        "commits": 0, "rows_upserted": 0, "rows_deleted": 0, "failed_regions": [], "regions": []}
            self.up_to_generation = bounded
        return super().execute(context)

    def _bounded_up_to(self, gens: int | None, nbytes: int | None) -> int | None:
        """The highest generation this chunk may merge from where its region stands now (None: nothing)."""
        from memwal.planning import leading_batch

        regions = self.hook.validate_regions(self.cfg, string_list("regions", self.regions)) or []
        if len(regions) != 1:
            raise AirflowFailException("a bounded merge chunk (max_generations_per_run / max_bytes_per_run) needs "
                                       "exactly one region")
        limit = optional_int("up_to_generation", self.up_to_generation)
        pending = self.hook.pending_work(self.cfg, regions, limit)
        if not pending or not pending[0]["generations"]:
            return None
        return pending[0]["generations"][leading_batch(pending[0]["generation_bytes"], gens, nbytes) - 1]

    def after_job(self, context: Context, cfg: TableConfig, run: JobRun) -> None:
        """The table's asset event. Airflow records a task's asset events only when it succeeds, so a merge
        that fails part-way (exit 3: a lock timeout after some regions committed) keeps what it merged in
        the task state store, which its retries share; the attempt that succeeds announces it with its own."""
        context["memwal_merged_label"] = merged_label(run.summary)  # a mapped task's label (map_index_template)
        store = context.get("task_state_store")
        retry = getattr(context.get("ti"), "try_number", 1) > 1
        earlier = _state(store, "get", UNANNOUNCED_KEY) if store is not None and retry else None
        extra = combine_event_extras(earlier, merge_event_extra(cfg, run.summary))
        if run.returncode != 0:
            if extra["generations_merged"] and store is not None:
                _state(store, "set", UNANNOUNCED_KEY, extra)
                self.log.warning("table %s: merged %s before failing; Airflow emits no asset event from a failed "
                                 "task, so the retry's event announces them", cfg.name, merged_label(run.summary))
            return
        if extra["generations_merged"]:
            from memwal.airflow.assets import table_asset

            for outlet in self.outlets or []:
                if isinstance(outlet, AssetAlias):
                    context["outlet_events"][outlet].add(table_asset(cfg), extra=extra)
        if earlier:
            _state(store, "delete", UNANNOUNCED_KEY)


MERGED_ALIAS = "memwal_merged"
# task state store key: the event extra of what failed attempts of this merge task merged, not yet announced
UNANNOUNCED_KEY = "memwal_unannounced_merge"


def _state(store: Any, action: str, *args: Any) -> Any:
    """A task state store call; a store that cannot be reached loses only the carry-over, never the task."""
    try:
        return getattr(store, action)(*args)
    except Exception as exc:
        log.warning("task state store %s %s failed: %s", action, args[0], exc)
        return None


class MemWalCatchupOperator(MemWalJobOperator):
    """Index catch-up: optimise every maintained index (or `indexes`), folding segments past the table's
    `index_policy`; with `rebuild=True`, recreate them from scratch first (vector indexes retrained)."""

    job = "catchup"
    template_fields: Sequence[str] = ("table", "engine", "indexes", "rebuild")

    def __init__(self, *, indexes: Sequence[str] | str | None = None, rebuild: bool | str = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.indexes = indexes
        self.rebuild = rebuild


    def execute(self, context: Context) -> dict[str, Any]:
        if flag(self.rebuild):
            rebuilt = self.hook.rebuild_indexes(self.cfg, string_list("indexes", self.indexes))
            self.log.info("table %s: rebuilt indexes %s from scratch", self.cfg.name, ", ".join(rebuilt) or "(none)")
        return super().execute(context)


class MemWalSnapshotOperator(MemWalJobOperator):
    """Snapshot refresh of the MemWAL index (region manifests read in parallel)."""

    job = "snapshot"
    template_fields: Sequence[str] = ("table", "engine")



class MemWalGcOperator(MemWalJobOperator):
    """GC of merged, index-covered generations no retained table version needs. `dry_run` (or the table's
    `gc.enabled: false`) lists what would go and deletes nothing."""

    job = "gc"
    template_fields: Sequence[str] = ("table", "regions", "engine", "dry_run")

    def __init__(self, *, dry_run: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dry_run = dry_run



class MemWalCompactionOperator(MemWalJobOperator):
    """Compaction of the base table when due (the table's `compaction:` policy); the tasks run on the
    executors with the spark engine. `force` compacts even when not due; `compaction.enabled: false` skips."""

    job = "compaction"
    template_fields: Sequence[str] = ("table", "engine", "force")

    def __init__(self, *, force: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.force = force


    def execute(self, context: Context) -> dict[str, Any]:
        cfg = self.cfg
        if not cfg.compaction.enabled:
            self.log.info("table %s: compaction.enabled is false; nothing compacted", cfg.name)
            return {"job": "compaction", "table": cfg.name, "table_uri": cfg.uri, "enabled": False,
                    "compacted": False, "due": []}
        return super().execute(context)


class MemWalRetentionOperator(MemWalJobOperator):
    """Version retention under the table's `retention:` policy (older than, keep at least N; tags kept).
    `dry_run` lists what it would remove and removes nothing; `retention.enabled: false` plans nothing."""

    job = "retention"
    template_fields: Sequence[str] = ("table", "engine", "dry_run")

    def __init__(self, *, dry_run: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dry_run = dry_run
