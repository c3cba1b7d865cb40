"""Where a job runs: the engines, the cheap plan made in the caller's process before any Spark starts, and
the choice it leads to. Shared by the Airflow hook and the `memwal` command; nothing here imports Spark.

Engines: `in_process` (the caller's process), `spark` (spark-submit: one Spark application per job),
`spark_connect` (the driver logic here, the executor work through a Spark Connect session) and `auto`
(in process when the plan finds little work, else the table's Spark engine).

Whatever the engine, a job with no executor work runs in process: retention and GC always (driver-only
work), a merge with no batch to deduplicate, compaction that is not due, catch-up with no rows to index,
a snapshot of few regions. The summary records where each part ran (`ran_on`), the engine chosen and why
(`engine`, `engine_reason`) and what the plan found (`plan`).

`dispatch` is the one path plan -> choose -> run -> record, for the `memwal` command and the Airflow hook
alike. The runners are injected (`Runner`): the library imports neither Spark nor Airflow, so the caller
passes them, or `load_runner` finds the installed ones by engine name (entry point group `memwal.runners`:
`spark_jobs` registers `spark` and `spark_connect`).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from memwal.job_plans import WorkPlan

if TYPE_CHECKING:
    from memwal.job_config import JobOptions
    from memwal.table import MemWalTable

__all__ = ["ENGINES", "RUNNER_ENTRY_POINTS", "SPARK_ENGINES", "AutoThresholds", "EngineChoice", "Runner", "WorkPlan",
           "choose_engine", "dispatch", "in_process", "load_runner", "own_entry_points", "plan_work",
           "record_choice"]

log = logging.getLogger(__name__)

ENGINES = ("in_process", "spark", "spark_connect", "auto")
SPARK_ENGINES = ("spark", "spark_connect")

# The part of each job that runs on executors when it runs on Spark (the rest: plan and commit, the driver).
EXECUTOR_PART = {"merge": "dedup", "compaction": "rewrite", "catchup": "index_build", "snapshot": "read_manifests",
                 "gc": "gc", "retention": "retention"}


@dataclass(frozen=True)
class AutoThresholds:
    """`engine: auto` takes the table's Spark engine when the plan finds at least one of these (else in
    process): merge backlog bytes, fragments a due compaction rewrites, rows catch-up indexes, regions a
    snapshot reads. bench/engines.py part 5 measures the merge's crossover: on a 2-core machine the local
    Connect server never won (its executors share the task's cores); these defaults are where one task
    process's time and memory become the limit (bench/README.md), to lower on a real cluster."""

    backlog_bytes: int = 256 * 1024 * 1024
    fragments: int = 64
    index_rows: int = 2_000_000
    regions: int = 256


@dataclass(frozen=True)
class EngineChoice:
    engine: str  # in_process, spark or spark_connect: where the job runs
    reason: str


def plan_work(job: str, table: MemWalTable, options: JobOptions, regions: Sequence[str] | None = None) -> WorkPlan:
    """The job's work as its planner (its JobSpec's `plan`) would see it now: metadata only, no data read."""
    from memwal.job_specs import spec

    started = time.monotonic()
    plan = spec(job).plan(table, options, regions)
    plan.plan_s = time.monotonic() - started
    return plan


def choose_engine(engine: str, plan: WorkPlan, *, spark_engine: str = "spark_connect",
                  thresholds: AutoThresholds | None = None) -> EngineChoice:
    """Where the job runs. `spark_engine`: what `auto` uses for large work (the table's Spark engine)."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r} is not one of {', '.join(ENGINES)}")
    if engine == "in_process":
        return EngineChoice("in_process", "the table's engine is in_process")
    if not plan.executor_work:
        return EngineChoice("in_process", f"no executor work: {plan.reason}")
    if engine in SPARK_ENGINES:
        return EngineChoice(engine, plan.reason)
    t = thresholds or AutoThresholds()
    f = plan.facts
    large = [what for what, value, limit in (
        ("backlog bytes", f.get("backlog_bytes", 0), t.backlog_bytes),
        ("fragments", f.get("fragments", 0) if plan.job == "compaction" else 0, t.fragments),
        ("rows to index", f.get("rows_to_index", 0), t.index_rows),
        ("regions", f.get("regions", 0), t.regions),
    ) if value >= limit]
    if large:
        return EngineChoice(spark_engine, f"auto: large work ({', '.join(large)} at or over the threshold): "
                            f"{plan.reason}")
    return EngineChoice("in_process", f"auto: small work (under every threshold): {plan.reason}")


def record_choice(summary: dict[str, Any], plan: WorkPlan, choice: EngineChoice, requested: str) -> dict[str, Any]:
    """Add to a job's summary where each part ran and why (in place; returned)."""
    where = choice.engine
    part = EXECUTOR_PART.get(plan.job, plan.job)
    driver = "spark" if where == "spark" else "in_process"  # spark-submit's driver runs apart
    summary["ran_on"] = {"plan": "in_process", "driver": driver, part: where}
    summary["engine_requested"] = requested
    summary["engine"] = where
    summary["engine_reason"] = choice.reason
    summary["plan"] = plan.to_dict()
    return summary


class Runner(Protocol):
    """Runs one job on one engine and returns its JSON-ready summary; raises when the job did not run."""

    def __call__(self, job: str, table: MemWalTable, options: JobOptions,
                 regions: Sequence[str] | None) -> dict[str, Any]: ...


def in_process(job: str, table: MemWalTable, options: JobOptions, regions: Sequence[str] | None) -> dict[str, Any]:
    """The `in_process` runner: the job in the caller's process (`memwal.jobs.run_job`)."""
    from memwal.jobs import run_job

    return run_job(job, table, options, regions)


RUNNER_ENTRY_POINTS = "memwal.runners"  # name: an engine; value: a factory taking that engine's settings
OWN_DISTRIBUTION = "memwal_platform"  # the distribution whose spark_jobs registers spark and spark_connect


def load_runner(engine: str, **settings: Any) -> Runner:
    """The installed runner of a Spark engine, built with its settings (e.g. `master=`, `conf=` for spark,
    `url=` for spark_connect): found by name in the `memwal.runners` entry points, so the library names no
    module above it. The platform's own distribution's are read from its metadata file directly
    (`own_entry_points`); only an engine it does not register costs the scan of every installed one."""
    value = own_entry_points(RUNNER_ENTRY_POINTS).get(engine)
    if value is not None:
        module, _, attr = value.partition(":")
        factory: Any = importlib.import_module(module.strip())
        for part in attr.strip().split("."):
            factory = getattr(factory, part)
        return factory(**settings)
    from importlib.metadata import entry_points

    from memwal.errors import MemWalError

    found = sorted(entry_points(group=RUNNER_ENTRY_POINTS, name=engine), key=lambda ep: ep.value)
    if not found:
        raise MemWalError(f"engine {engine!r} has no runner installed (entry point group {RUNNER_ENTRY_POINTS}: "
                          "memwal-platform's spark_jobs registers spark and spark_connect; reinstall it)")
    return found[0].load()(**settings)


def own_entry_points(group: str) -> dict[str, str]:
    """`group`'s entry points (name: `module:attr`) in the metadata of this platform's distribution, the first
    found along sys.path as importlib.metadata finds it; empty when there is none. Read directly because a
    task pays at start-up for `importlib.metadata` (its import and its scan of every installed distribution:
    0.05-0.15 s, bench/README.md) for what one small file says."""
    for entry in sys.path:
        folder = entry or "."
        try:
            names = sorted(os.listdir(folder))
        except OSError:  # a zip, a missing directory
            continue
        for name in names:
            stem, _, suffix = name.rpartition(".")
            if suffix in ("dist-info", "egg-info") and stem.split("-")[0].lower() == OWN_DISTRIBUTION:
                return _entry_points_of(os.path.join(folder, name, "entry_points.txt"), group)
    return {}


def _entry_points_of(path: str, group: str) -> dict[str, str]:
    """One group of an entry_points.txt (INI: `[group]`, then `name = module:attr [extras]` lines)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    found: dict[str, str] = {}
    section = None
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == group and "=" in line:
            name, _, value = line.partition("=")
            found[name.strip()] = value.split("[")[0].strip()
    return found


def dispatch(job: str, table: MemWalTable, options: JobOptions, regions: Sequence[str] | None = None, *,
             engine: str, runners: Mapping[str, Runner], spark_engine: str = "spark_connect",
             thresholds: AutoThresholds | None = None,
             on_choice: Callable[[WorkPlan, EngineChoice], None] | None = None) -> dict[str, Any]:
    """Plan the job here, choose its engine, run it on that engine's runner (`runners[engine]`; in process
    by default) and record where and why in its summary. `spark_engine`: what `auto` takes for large work;
    `on_choice`: told the plan and the choice before the job runs (the hook logs them). An error of the plan
    or of the runner propagates as raised; a runner missing for the chosen engine is a ValueError."""
    plan = plan_work(job, table, options, regions)
    choice = choose_engine(engine, plan, spark_engine=spark_engine, thresholds=thresholds)
    log.debug("memwal %s on %s: engine %s (%s): %s", job, table.uri, choice.engine, engine, choice.reason)
    if on_choice is not None:
        on_choice(plan, choice)
    runner = runners.get(choice.engine) or (in_process if choice.engine == "in_process" else None)
    if runner is None:
        raise ValueError(f"memwal {job}: engine {choice.engine!r} was chosen but no runner was given for it")
    summary = runner(job, table, options, regions)
    return record_choice(summary, plan, choice, engine)
