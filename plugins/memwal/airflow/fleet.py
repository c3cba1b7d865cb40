"""Fleet mode: one probe of every fleet table and root (`memwal.probe.probe_tables`) decides which tables have due
jobs; only those get work, longest-waiting first. Pure logic, no Airflow import: the operators in
`memwal.airflow.operators.fleet` run it, `dags/memwal_fleet.py` wires it.

What a cycle keeps for the next (`FleetState`, JSON in the Airflow Variable `memwal_fleet_state`; no secrets:
table URIs, listing keys, figures):
- each table's `ProbeState` (an unchanged table is decided again from two LISTs);
- `due_since`: since when each due, not yet dispatched table waits. First sighting: the probe's time, or
  earlier by the age of its oldest unmerged generation (the lag it has waited already), never before the
  table's last dispatch (so a table just served cannot jump ahead of the ones that waited meanwhile).
  A table left out of a dispatch keeps its `due_since`: its wait grows until it is first in line;
- `in_flight`: maintenance run id -> the tables it maintains; a table of a run still going is not dispatched
  again (one chain per table at a time, never two merges of a table at once);
- `last_dispatched`: table -> when its last chain was dispatched.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memwal.airflow.config import RootConfig, TableConfig, TableConfigError
    from memwal.probe import ProbeEntry, ProbeResult, ProbeState

__all__ = ["BATCH_ENGINES", "FleetState", "batch_group", "due_entries", "entry_and_name", "order_due", "plan_cycle",
           "probe_entries", "report", "resolve_table", "split_batches"]

STATE_VARIABLE = "memwal_fleet_state"
# Engines whose tables share one application per batch (`memwal.fleet_batch`, `MemWalHook.run_batch`): a Spark
# application's start-up (13-18 s) is paid once per batch, not per table.
BATCH_ENGINES = ("spark", "spark_connect")


@dataclass
class FleetState:
    """What one fleet probe hands to the next (see the module docstring); JSON-ready."""

    probe_states: dict[str, ProbeState] = field(default_factory=dict)
    due_since: dict[str, float] = field(default_factory=dict)
    in_flight: dict[str, list[str]] = field(default_factory=dict)
    last_dispatched: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"probe_states": {u: s.to_dict() for u, s in self.probe_states.items()},
                "due_since": dict(self.due_since), "in_flight": {r: list(u) for r, u in self.in_flight.items()},
                "last_dispatched": dict(self.last_dispatched)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> FleetState:
        from memwal.probe import ProbeState

        data = data or {}
        return cls({u: ProbeState.from_dict(s) for u, s in (data.get("probe_states") or {}).items()},
                   {u: float(t) for u, t in (data.get("due_since") or {}).items()},
                   {r: list(u) for r, u in (data.get("in_flight") or {}).items()},
                   {u: float(t) for u, t in (data.get("last_dispatched") or {}).items()})


def probe_entries(tables: Mapping[str, TableConfig], roots: Mapping[str, RootConfig],
                  storage_options: Callable[[str | None], Mapping[str, str] | None],
                  errors: dict[str, Exception] | None = None) -> list[ProbeEntry]:
    """The probe's entries: each fleet table (kind table) and each root (kind root), with the policy its
    settings give; `storage_options(conn_id)` reads a connection (once per conn_id). An entry whose connection
    cannot be read (missing, malformed) is left out and its error put in `errors` under its name: the others
    are probed."""
    from memwal.probe import ProbeEntry, ProbePolicy

    cache: dict[str | None, Mapping[str, str] | Exception | None] = {}

    def add(out: list[ProbeEntry], name: str, cfg: TableConfig, uri: str, kind: str) -> None:
        if cfg.conn_id not in cache:
            try:
                cache[cfg.conn_id] = storage_options(cfg.conn_id) if cfg.conn_id else None
            except Exception as exc:
                cache[cfg.conn_id] = exc
        opts = cache[cfg.conn_id]
        if isinstance(opts, Exception):
            if errors is not None:
                errors[name] = opts
            return
        out.append(ProbeEntry(uri, opts, ProbePolicy(options=cfg.job_options()), name, kind=kind))

    out: list[ProbeEntry] = []
    for name, cfg in tables.items():
        add(out, name, cfg, cfg.uri, "table")
    for name, r in roots.items():
        add(out, name, r.template, r.root, "root")
    return out


def resolve_table(item: Mapping[str, Any], tables: Mapping[str, TableConfig],
                  roots: Mapping[str, RootConfig], errors: Mapping[str, TableConfigError]) -> TableConfig:
    """The settings of one planned table: its own entry, or its root's defaults at its URI. A table whose
    entry is gone or bad now raises TableConfigError naming it."""
    from memwal.airflow.config import TableConfigError

    entry = str(item["entry"])
    if entry in errors:
        raise errors[entry]
    if item.get("root"):
        if entry not in roots:
            raise TableConfigError("tables file", entry, "root", "no longer a root entry in the tables file")
        return roots[entry].table(str(item["uri"]))
    if entry not in tables:
        raise TableConfigError("tables file", entry, "fleet", "no longer a fleet table in the tables file")
    return tables[entry]


def _lag_s(result: ProbeResult) -> float:
    """How long the table's due work has waited already: its oldest unmerged generation's age (0: unknown)."""
    for d in result.due:
        if d.job == "merge" and d.figures.get("oldest_unmerged_age_s"):
            return float(d.figures["oldest_unmerged_age_s"])
    return 0.0


def due_entries(results: Iterable[ProbeResult], state: FleetState, now: float,
                in_flight: Iterable[str]) -> dict[str, ProbeResult]:
    """The due tables not in flight, each with its `due_since` set in `state` (kept when already waiting,
    else from its lag, never before its last dispatch); a table no longer due loses its place."""
    busy = set(in_flight)
    due = {r.table_uri: r for r in results if r.status in ("ok", "error") and r.due and r.state is not None
           and r.table_uri not in busy}
    for uri in list(state.due_since):
        if uri not in due and uri not in busy:
            del state.due_since[uri]
    for uri, r in due.items():
        if uri not in state.due_since:
            state.due_since[uri] = max(now - _lag_s(r), state.last_dispatched.get(uri, float("-inf")))
    return due


def order_due(due_since: Mapping[str, float], uris: Iterable[str]) -> list[str]:
    """Longest-waiting first (earliest `due_since`), ties by URI: a stable, total order."""
    return sorted(uris, key=lambda u: (due_since.get(u, float("inf")), u))


def entry_and_name(result: ProbeResult, root_entries: Mapping[str, str]) -> tuple[str, str]:
    """(the tables-file entry, the table's name) of a probe result: a named table's own, or for a table under
    a root, the root's entry (`root_entries`: root URI as the probe gives it -> entry name) and
    `<entry>.<directory>`."""
    from memwal.airflow.config import root_table_name

    if result.root is None:
        name = result.name or result.table_uri
        return name, name
    entry = root_entries.get(result.root, result.root)
    return entry, root_table_name(entry, result.table_uri)


def plan_cycle(results: Sequence[ProbeResult], state: FleetState, now: float, max_tables: int,
               root_entries: Mapping[str, str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """(the tables to maintain now, in order: at most `max_tables`, each with its due jobs in the safe order;
    the due tables left for a later cycle, keeping their place). Updates `state`'s `due_since` and
    `last_dispatched`; the caller records the run in `state.in_flight` once it has a run id."""
    busy = {u for uris in state.in_flight.values() for u in uris}
    seen = {r.table_uri for r in results}
    state.last_dispatched = {u: t for u, t in state.last_dispatched.items() if u in seen}  # removed tables go
    due = due_entries(results, state, now, busy)
    ordered = order_due(state.due_since, due)
    chosen, left = ordered[:max_tables], ordered[max_tables:]
    plan = []
    for uri in chosen:
        r = due[uri]
        entry, name = entry_and_name(r, root_entries or {})
        plan.append({"table": name, "uri": uri, "entry": entry, "root": r.root, "jobs": r.jobs,
                     "reasons": {d.job: d.reason for d in r.due},
                     "waited_s": round(now - state.due_since[uri], 1)})
        state.last_dispatched[uri] = now
        del state.due_since[uri]
    return plan, left


def report(results: Sequence[ProbeResult], plan: Sequence[Mapping[str, Any]], left: Sequence[str],
           in_flight: Iterable[str], config_errors: Mapping[str, Exception], root_entries: Mapping[str, str],
           ) -> dict[str, Any]:
    """The probe's answer (its XCom and log): counts, what was dispatched, what waits, and per table with due
    work or not ok its status, due jobs and error. A table whose probe failed is listed under `errors`, naming
    it; a directory under a root that is not a MemWAL table under `not_maintained`."""
    tables = []
    for r in results:
        entry, name = entry_and_name(r, root_entries)
        tables.append({"table": name, "entry": entry, "uri": r.table_uri, "root": r.root, "status": r.status,
                       "due": r.jobs, "error": r.error, "changed": r.changed})
    return {
        "probed": sum(r.state is not None for r in results),
        "due": sum(bool(t["due"]) for t in tables),
        "dispatched": [{k: p[k] for k in ("table", "uri", "jobs", "waited_s")} for p in plan],
        "waiting": list(left),
        "in_flight": sorted(set(in_flight)),
        "errors": [t for t in tables if t["status"] == "error"],
        "not_maintained": [t for t in tables if t["status"] in ("not_memwal", "not_a_table")],
        "config_errors": {name: str(exc) for name, exc in config_errors.items()},
        # the tables worth a look (due work or not ok); the idle ones are counted, so that the XCom of an idle
        # cycle stays small whatever the fleet (every table's row: `memwal.airflow.fleet_status`)
        "idle": sum(t["status"] == "ok" and not t["due"] for t in tables),
        "tables": [t for t in tables if t["due"] or t["status"] != "ok"],
    }


def batch_group(cfg: TableConfig) -> str | None:
    """Tables that may share an application: the same engine, storage connection, Spark connections and Spark
    properties (a batch has one of each). None: the table's chain runs alone (engines in_process and auto)."""
    if cfg.engine not in BATCH_ENGINES:
        return None
    return json.dumps([cfg.engine, cfg.conn_id, cfg.spark_conn_id, cfg.spark_connect_conn_id,
                       sorted(cfg.spark_conf.items())])


def split_batches(plan: Sequence[Mapping[str, Any]], cfgs: Mapping[str, TableConfig], due_bytes: Mapping[str, int],
                  *, max_tables: int, max_bytes: int) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """(the plan's tables whose chain runs alone, the batches of the others: one application each, packed by
    `memwal.fleet_batch.pack_batches` by bytes within a `batch_group`). Both in the plan's order (longest-waiting
    first): batches by the place of their longest-waiting table, tables inside a batch by theirs."""
    from memwal.fleet_batch import TableDue, pack_batches

    place = {p["uri"]: i for i, p in enumerate(plan)}
    alone = [dict(p) for p in plan if batch_group(cfgs[p["uri"]]) is None]
    dues = [TableDue(p["uri"], tuple(p["jobs"]), int(due_bytes.get(p["uri"], 0)), name=p["table"],
                     group=batch_group(cfgs[p["uri"]])) for p in plan if batch_group(cfgs[p["uri"]]) is not None]
    packed = [sorted((d.uri for d in batch), key=place.__getitem__)
              for batch in pack_batches(dues, max_bytes=max_bytes, max_tables=max_tables)]
    packed.sort(key=lambda uris: place[uris[0]])
    items = {p["uri"]: p for p in plan}
    return alone, [[{**items[u], "bytes": int(due_bytes.get(u, 0))} for u in uris] for uris in packed]
