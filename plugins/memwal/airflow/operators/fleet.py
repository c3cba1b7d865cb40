"""The fleet's two operators (`dags/memwal_fleet.py`, docs/airflow.md "Fleet mode"):

- `MemWalFleetProbeOperator`: probes every fleet table and root (`memwal.probe.probe_tables`, with the states the
  last cycle kept), plans (`memwal.airflow.fleet.plan_cycle`: due tables not in flight, longest-waiting first,
  at most `max_tables`) and, only when something is due, triggers one run of the maintenance DAG with the plan
  as its conf. An idle cycle triggers nothing: it is this one task instance. Its XCom is the probe's report
  (`memwal.airflow.fleet.report`): every table's status, due jobs and error.
- `MemWalDueWorkOperator`: mapped over the plan's work units, longest-waiting first: a table on engine
  in_process or auto runs its due jobs in the safe order through `MemWalHook.run_job`, as the per-table
  operators do; a batch of tables on engines spark / spark_connect (packed by
  `memwal.fleet_batch.pack_batches`) runs every table's due jobs in one application (`MemWalHook.run_batch`),
  so the application's start-up is paid once per batch, not per table.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import BaseOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from memwal.airflow.fleet import FleetState
    from memwal.probe import ProbeResult

__all__ = ["MemWalDueWorkOperator", "MemWalFleetProbeOperator"]

log = logging.getLogger(__name__)

_ACTIVE_RUN_STATES = ("queued", "running")


def _load_state(key: str) -> FleetState:
    from airflow.sdk import Variable

    from memwal.airflow.fleet import FleetState

    raw = Variable.get(key, default=None)
    if not raw:
        return FleetState()
    try:
        return FleetState.from_dict(json.loads(raw) if isinstance(raw, str) else raw)
    except (ValueError, KeyError, TypeError) as exc:  # a state that cannot be read costs one full probe, no more
        log.warning("fleet: Variable %s cannot be read (%s): probing every table afresh", key, exc)
        return FleetState()


def _save_state(key: str, state: FleetState) -> None:
    from airflow.sdk import Variable

    Variable.set(key, json.dumps(state.to_dict(), separators=(",", ":")),
                 description="MemWAL fleet: probe states, waits and runs in flight (memwal.airflow.fleet)")


def _storage_options(conn_id: str | None) -> Mapping[str, str] | None:
    from memwal.airflow.hooks.memwal import MemWalHook

    return MemWalHook(memwal_conn_id=conn_id).storage_options if conn_id else None


def _save_status(results: Sequence[ProbeResult], root_entries: Mapping[str, str]) -> None:
    """The per-table rows of the fleet status page (`memwal.airflow.fleet_status`), when that module is here.
    Best effort: the probe's own answer is its XCom, and a failure here is logged, never the probe's."""
    try:
        from memwal.airflow import fleet_status
        from memwal.airflow.fleet import entry_and_name

        rows = [fleet_status.row_of({"table": entry_and_name(r, root_entries)[1],
                                     "error": r.error if r.status == "error" else None},
                                    r.table_uri, probe=fleet_status.probe_answer(r))
                for r in results if r.status != "not_a_table"]
        fleet_status.save(fleet_status.FLEET_PROBE, rows, datetime.now(UTC))
    except ImportError:
        return
    except Exception as exc:
        log.warning("fleet: the status rows could not be saved: %s", exc)


class MemWalFleetProbeOperator(TriggerDagRunOperator):
    """Probe the fleet; trigger `trigger_dag_id` (the maintenance DAG) with the plan only when something is due.

    max_tables: tables one maintenance run takes at most (the rest wait, keeping their place in line);
    max_workers: tables probed at once; state_variable: the Variable the cycle's state is kept in;
    max_batch_tables / max_batch_bytes: a batch's bounds (one Spark application, `memwal.fleet_batch`)."""

    ui_color = "#fff4e0"

    def __init__(self, *, trigger_dag_id: str, max_tables: int = 64, max_workers: int = 16,
                 state_variable: str = "memwal_fleet_state", max_batch_tables: int = 50,
                 max_batch_bytes: int = 1024**3, **kwargs: Any) -> None:
        kwargs.setdefault("conf", None)
        super().__init__(trigger_dag_id=trigger_dag_id, **kwargs)
        self.max_tables = max_tables
        self.max_batch_tables = max_batch_tables
        self.max_batch_bytes = max_batch_bytes
        self.max_workers = max_workers
        self.state_variable = state_variable

    def _in_flight(self, ti: Any, state: FleetState) -> list[str]:
        """The tables of maintenance runs still queued or running (finished runs are dropped from the state)."""
        for run_id in list(state.in_flight):
            try:
                run_state = str(ti.get_dagrun_state(self.trigger_dag_id, run_id))
            except Exception as exc:  # a run that was never created (its trigger failed) or was deleted
                log.info("fleet: maintenance run %s not found (%s): its tables are free", run_id, exc)
                run_state = "missing"
            if run_state.rsplit(".", 1)[-1].lower() not in _ACTIVE_RUN_STATES:
                del state.in_flight[run_id]
        return [u for uris in state.in_flight.values() for u in uris]

    def execute(self, context: Context) -> dict[str, Any]:
        from memwal.airflow.config import config_errors_fail, load_fleet
        from memwal.airflow.fleet import plan_cycle, probe_entries, report, resolve_table, split_batches
        from memwal.fleet_batch import due_bytes
        from memwal.probe import next_states, probe_tables
        from memwal.storage import ObjectStore

        ti = context["ti"]
        now = time.time()
        with config_errors_fail():
            tables, roots, bad = load_fleet()
        errors: dict[str, Exception] = dict(bad)
        state = _load_state(self.state_variable)
        busy = self._in_flight(ti, state)
        entries = probe_entries(tables, roots, _storage_options, errors)
        for name, exc in errors.items():
            log.error("fleet: entry %s is not probed: %s", name, exc)
        results = probe_tables(entries, state.probe_states, self.max_workers, now=now)
        state.probe_states = next_states(results)  # a table no longer found is no longer kept
        root_entries = {}
        for name, r in roots.items():
            try:
                root_entries[ObjectStore(r.root, _storage_options(r.template.conn_id)).uri] = name
            except Exception:  # its probe already reported why it cannot be listed
                root_entries[r.root] = name
        plan, left = plan_cycle(results, state, now, self.max_tables, root_entries)
        answer = report(results, plan, left, busy, errors, root_entries)
        for t in answer["errors"]:
            log.warning("fleet: table %s: probe failed: %s", t["table"], t["error"])
        for t in answer["not_maintained"]:
            log.info("fleet: %s under root %s is not maintained: %s", t["uri"], t["entry"], t["error"])
        for p in plan:
            log.info("fleet: table %s: due %s (waited %.0fs): %s", p["table"], ", ".join(p["jobs"]), p["waited_s"],
                     "; ".join(f"{j}: {why}" for j, why in p["reasons"].items()))
        log.info("fleet: %d table(s) probed, %d due, %d dispatched, %d waiting, %d in flight, %d failed",
                 answer["probed"], answer["due"], len(plan), len(left), len(answer["in_flight"]),
                 len(answer["errors"]))
        _save_status(results, root_entries)
        if not plan:
            _save_state(self.state_variable, state)
            return answer
        run_id = f"memwal_fleet__{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
        state.in_flight[run_id] = [p["uri"] for p in plan]
        _save_state(self.state_variable, state)  # before the trigger: a probe that dies next keeps them in flight
        answer["run_id"] = run_id
        ti.xcom_push(key="return_value", value=answer)
        cfgs = {p["uri"]: resolve_table(p, tables, roots, bad) for p in plan}
        place = {p["uri"]: i for i, p in enumerate(plan)}
        alone, batches = split_batches(plan, cfgs, {r.table_uri: due_bytes(r.due) for r in results},
                                       max_tables=self.max_batch_tables, max_bytes=self.max_batch_bytes)
        work = sorted([*alone, *batches], key=lambda u: place[(u if isinstance(u, Mapping) else u[0])["uri"]])
        self.conf, self.trigger_run_id = {"work": work}, run_id
        super().execute(context)  # raises the trigger request the task runner carries out
        return answer


def _chain(op: BaseOperator, item: Mapping[str, Any], context: Context) -> dict[str, Any]:
    """One planned table's due jobs, in the safe order, through `MemWalHook.run_job` on the table's engine.
    The first job that fails (exit 3 pushes its summary first) fails the task."""
    from memwal.airflow.config import config_errors_fail, load_fleet
    from memwal.airflow.fleet import resolve_table
    from memwal.airflow.hooks.memwal import MemWalHook, MemWalTaskError
    from memwal.probe import JOB_ORDER

    context["memwal_table"] = item["table"]  # type: ignore[typeddict-unknown-key]  # the mapped label
    with config_errors_fail():
        tables, roots, errors = load_fleet()
        cfg = resolve_table(item, tables, roots, errors)
    hook = MemWalHook.for_table(cfg)
    jobs = [j for j in JOB_ORDER if j in set(item["jobs"])]
    out: dict[str, Any] = {"table": cfg.name, "uri": cfg.uri, "jobs": jobs, "summaries": {}}
    for job in jobs:
        op.log.info("table %s: %s (%s)", cfg.name, job, (item.get("reasons") or {}).get(job, "due"))
        run = hook.run_job(job, cfg, options=cfg.job_options(), engine=cfg.engine,
                           spark_conn_id=cfg.spark_conn_id, spark_conf=cfg.spark_conf,
                           spark_connect_conn_id=cfg.spark_connect_conn_id, auto_spark_engine=cfg.auto_spark_engine)
        out["summaries"][job] = {**run.summary, "table": cfg.name}
        if run.returncode != 0:
            context["ti"].xcom_push(key="return_value", value=out)
            raise MemWalTaskError(f"memwal {job} on table {cfg.name!r} ({cfg.uri}): "
                                  f"{run.reason or f'exit {run.returncode}'} (the chain stops here; the retry "
                                  "runs it again)")
    return out


def _batch(op: BaseOperator, items: Sequence[Mapping[str, Any]], context: Context) -> dict[str, Any]:
    """A batch of planned tables (one group: engine, connections, Spark properties) in ONE application
    (`MemWalHook.run_batch`): each table's due jobs in the safe order, each table's failure its own result;
    the task fails (after pushing every table's result) when a table failed."""
    from memwal.airflow.config import config_errors_fail, load_fleet
    from memwal.airflow.fleet import resolve_table
    from memwal.airflow.hooks.memwal import MemWalHook, MemWalTaskError
    from memwal.fleet_batch import TableDue

    names = [str(i["table"]) for i in items]
    label = f"{names[0]} +{len(names) - 1}" if len(names) > 1 else names[0]
    context["memwal_table"] = label  # type: ignore[typeddict-unknown-key]
    with config_errors_fail():
        tables, roots, errors = load_fleet()
        cfgs = [resolve_table(i, tables, roots, errors) for i in items]
    first = cfgs[0]
    entries = [TableDue(c.uri, tuple(i["jobs"]), int(i.get("bytes") or 0), c.job_options(), name=c.name)
               for c, i in zip(cfgs, items, strict=True)]
    op.log.info("batch of %d table(s) on %s: %s", len(entries), first.engine,
                ", ".join(f"{e.name} ({', '.join(e.jobs)})" for e in entries))
    results = MemWalHook.for_table(first).run_batch(
        entries, engine=first.engine, spark_conn_id=first.spark_conn_id, spark_conf=first.spark_conf,
        spark_connect_conn_id=first.spark_connect_conn_id)
    out = {"tables": [{**r, "table": c.name} for c, r in zip(cfgs, results, strict=True)]}
    failed = [t for t in out["tables"] if t.get("status") != "ok"]
    if failed:
        context["ti"].xcom_push(key="return_value", value=out)
        which = "; ".join(f"{t['table']}: {t.get('error') or t.get('status')}" for t in failed)
        raise MemWalTaskError(f"memwal batch: {len(failed)} of {len(entries)} table(s) failed: {which} "
                              "(the retry runs the batch again)")
    return out


class MemWalDueWorkOperator(BaseOperator):
    """One unit of a fleet maintenance run (mapped over the plan's `work`, longest-waiting first): a table (a
    mapping: its due jobs in the safe order through `MemWalHook.run_job`, as the per-table operators run them)
    or a batch (a list: tables on engines spark / spark_connect whose due jobs run in ONE application,
    `MemWalHook.run_batch`). A failure fails the task; its retry runs the unit again (every job resumes from what
    the table records, and a job no longer due does nothing)."""

    template_fields: Sequence[str] = ("item",)
    ui_color = "#e8f0fe"

    def __init__(self, *, item: Mapping[str, Any] | Sequence[Mapping[str, Any]] | str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.item = item

    def execute(self, context: Context) -> dict[str, Any]:
        item = json.loads(self.item) if isinstance(self.item, str) else self.item
        if isinstance(item, Mapping):
            return _chain(self, dict(item), context)
        return _batch(self, [dict(i) for i in item], context)
