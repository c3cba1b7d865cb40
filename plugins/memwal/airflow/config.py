"""The tables file: which MemWAL tables Airflow maintains, and how. Adding a table needs no DAG code.

    # dags/memwal_tables.yaml (or the file named by $MEMWAL_TABLES_FILE)
    defaults:                      # optional; merged under every table (nested mappings key by key)
      engine: spark
    tables:
      orders:
        uri: s3://lake/orders.lance     # a relative path is relative to this file's directory
        conn_id: memwal_lake            # `memwal` connection with the storage credentials (optional)
        schedule: "*/30 * * * *"        # cron or @preset; null: only on the lag asset / manual
        engine: spark                   # spark | spark_connect | auto | in_process (memwal.engines)
        spark_conn_id: spark_default    # engine spark: a `spark` connection (spark-submit's master)
        spark_connect_conn_id: spark_connect_default  # spark_connect (and auto): a `spark_connect` one
        auto_spark_engine: spark_connect  # engine auto: where large work goes (spark_connect | spark)
        spark_conf: {spark.executor.memory: 4g}
        max_generations_per_commit: 8
        max_bytes_per_commit: 512MiB
        apply: auto                     # a merge commit's apply: auto | fragments | passes (memwal.merge_apply)
        max_merge_applications: 4       # Spark applications per maintenance run (regions are batched)
        thresholds: {max_unmerged_generations: 20, max_oldest_unmerged_age_s: 900}
        gc: {enabled: true, keep_manifest_versions: 10, grace_period_s: 3600}
        retention: {older_than_s: 604800, keep_versions: 10}   # base-table versions (memwal.retention)
        compaction: {target_rows_per_fragment: 1048576, max_fragments: 64, max_small_fragments: 16,
                     max_deleted_ratio: 0.1, max_tasks_per_round: null}  # when due (memwal.compaction)
        index_policy: {max_segments: 4, max_segments_per_index: {vec_idx: 2}}  # null: unbounded (catch-up)
        lag_poll_interval_s: 60         # how often the lag asset's trigger polls the table
        alerts: {webhook_conn_id: pager, notifiers: [mycompany.alerts.PagerDutyNotifier]}  # memwal.airflow.alerts

      events_db:                        # a root: every Lance table under it, found anew by each fleet probe
        root: s3://lake/events/         # a directory, S3 prefix or LanceDB database (its <name>.lance dirs)
        max_depth: 1                    # directory levels searched below the root (1: its children)
        engine: in_process              # any table key but uri: the defaults of every table under the root

`fleet: true` on a table (or in `defaults`) hands it to the fleet DAG (`dags/memwal_fleet.py`, docs/airflow.md
"Fleet mode") instead of a `memwal_maintenance__<table>` DAG of its own; a root's tables are always the fleet's
(`load_fleet`). A table found under root `events_db` at `.../clicks.lance` is named `events_db.clicks`.

The Airflow Variable `memwal_tables` (the same structure, JSON or YAML) overrides the file: its
`defaults` and each of its tables are merged over the file's, key by key. DAG files parse the file only
(`load_tables(use_variable=False)`: no Variable, no I/O beyond reading the file); tasks call
`get_table(name)`, which applies the Variable, so settings can change without touching DAG files while
the set of tables and their schedules come from the file.

A bad entry raises TableConfigError naming the table and the key; `load_tables_and_errors` returns the
good tables together with the errors of the bad ones, so one bad table does not take the others down.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from memwal import option_values
from memwal.engines import ENGINES
from memwal.job_config import DEFAULT_INLINE_THRESHOLD, GcConfig, JobOptions, MergeConfig
from memwal.job_specs import SPECS
from memwal.lag import THRESHOLD_KEYS, threshold_checks
from memwal.maintenance_config import CompactionConfig, IndexPolicy, RetentionConfig

__all__ = [
    "DEFAULT_TABLES_FILE",
    "ENGINES",
    "TABLES_FILE_ENV",
    "TABLES_VARIABLE",
    "GcSettings",
    "RootConfig",
    "TableConfig",
    "TableConfigError",
    "Thresholds",
    "config_errors_fail",
    "get_table",
    "load_fleet",
    "load_tables",
    "load_tables_and_errors",
    "parse_fleet",
    "parse_tables",
    "root_table_name",
    "tables_file",
]

TABLES_FILE_ENV = "MEMWAL_TABLES_FILE"
TABLES_VARIABLE = "memwal_tables"
DEFAULT_TABLES_FILE = Path(__file__).resolve().parents[3] / "dags" / "memwal_tables.yaml"
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")
_PRESETS = ("@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly",
            "@annually")


class TableConfigError(ValueError):
    """A table entry in the tables file (or the `memwal_tables` Variable) is invalid. Fix the named key."""

    def __init__(self, source: str, table: str | None, key: str | None, problem: str):
        where = f"table {table!r}" if table else "the tables configuration"
        at = f", key {key!r}" if key else ""
        super().__init__(f"{source}: {where}{at}: {problem}")
        self.source = source
        self.table = table
        self.key = key
        self.problem = problem


@dataclass(frozen=True)
class Thresholds:
    """Lag limits per region that the lag monitor alerts on and the lag asset fires on; None: not checked."""

    max_unmerged_generations: int | None = None
    max_unmerged_bytes: int | None = None
    max_oldest_unmerged_age_s: float | None = None
    max_index_lag: int | None = None
    max_snapshot_age_s: float | None = None
    max_fragments: int | None = None
    max_small_fragments: int | None = None
    max_deleted_ratio: float | None = None
    max_table_versions: int | None = None
    max_mem_wal_bytes: int | None = None
    max_index_segments: int | None = None
    max_unindexed_rows: int | None = None


GcSettings = GcConfig  # the tables file's `gc:` (`enabled: false` makes the GC task a dry run)


@dataclass(frozen=True)
class TableConfig:
    """One maintained table. `uri` is absolute (or s3://); `conn_id` names a `memwal` connection."""

    name: str
    uri: str
    conn_id: str | None = None
    schedule: str | None = "@hourly"
    thresholds: Thresholds = field(default_factory=Thresholds)
    engine: str = "spark"
    spark_conn_id: str = "spark_default"
    spark_connect_conn_id: str = "spark_connect_default"
    auto_spark_engine: str = "spark_connect"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    max_generations_per_commit: int = MergeConfig.max_generations_per_commit
    max_bytes_per_commit: int = MergeConfig.max_bytes_per_commit
    apply: str = MergeConfig.apply
    max_merge_applications: int = 4
    snapshot_inline_threshold: int = DEFAULT_INLINE_THRESHOLD
    gc: GcConfig = field(default_factory=GcConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    index_policy: IndexPolicy = field(default_factory=IndexPolicy)
    lag_poll_interval_s: float | None = None
    alerts: Mapping[str, Any] | None = None
    fleet: bool = False

    def __post_init__(self) -> None:
        if self.retention.delete_unverified:  # built in code, not parsed: the DAGs must never run it either
            raise TableConfigError("TableConfig", self.name, "retention.delete_unverified",
                                   _REFUSED["retention.delete_unverified"])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (no secrets live here: credentials stay in the connection)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["thresholds"] = {f.name: getattr(self.thresholds, f.name) for f in fields(Thresholds)}
        for key in _NESTED:
            section = getattr(self, key)
            out[key] = {f.name: _plain(getattr(section, f.name)) for f in fields(section)}
        out["spark_conf"] = dict(self.spark_conf)
        out["alerts"] = None if self.alerts is None else dict(self.alerts)
        return out

    def job_options(self) -> JobOptions:
        """The jobs' options this table's settings give (each job's spec says which keys are its own); a job
        whose section is `enabled: false` and has a dry run runs dry."""
        options = JobOptions()
        for spec in SPECS.values():
            if spec.table_key is not None:  # its own mapping: the section as parsed
                section = getattr(self, spec.table_key)
                if not getattr(section, "enabled", True) and hasattr(section, "dry_run"):
                    section = replace(section, dry_run=True)
                options = replace(options, **{spec.section: section})
            else:  # its keys are fields of the table's
                options = spec.with_overrides(options, {
                    name: getattr(self, key) for key, (_, name, _) in spec.table_keys().items()})
        return options


def _plain(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value


# --- parsing ------------------------------------------------------------------------------------------


def _int(v: Any, minimum: int = 1) -> int:
    return option_values.count(v, minimum)


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{v!r} is not a non-empty string")
    return v.strip()


def _opt_str(v: Any) -> str | None:
    return None if v is None else _str(v)


def _schedule(v: Any) -> str | None:
    if v is None:
        return None
    text = _str(v)
    if text.startswith("@"):
        if text not in _PRESETS:
            raise ValueError(f"{text!r} is not one of {', '.join(_PRESETS)}")
        return text
    from croniter import croniter

    if not croniter.is_valid(text):
        raise ValueError(f"{text!r} is not a cron expression (e.g. '*/30 * * * *') or @preset")
    return text


def _engine(v: Any) -> str:
    if v not in ENGINES:
        raise ValueError(f"{v!r} is not one of {', '.join(ENGINES)}")
    return v


def _spark_engine(v: Any) -> str:
    if v not in ("spark", "spark_connect"):
        raise ValueError(f"{v!r} is not spark or spark_connect")
    return v


def _spark_conf(v: Any) -> dict[str, str]:
    from memwal.storage import is_secret_option, url_credentials  # here: the other keys need no obstore

    if not isinstance(v, Mapping):
        raise ValueError(f"{v!r} is not a mapping of Spark properties")
    out = {}
    for k, val in v.items():
        if not isinstance(k, str) or not k.startswith("spark."):
            raise ValueError(f"{k!r} is not a Spark property (spark.*)")
        if is_secret_option(k) or url_credentials(str(val)):  # never echo the value
            raise ValueError(
                f"{k!r} holds a secret, and spark_conf goes on spark-submit's command line, which every user of "
                "the host can read: put the table's storage credentials in its `memwal` connection (conn_id; "
                "they reach the job in a private file) and Spark's own secrets in spark-defaults.conf")
        out[k] = str(val).lower() if isinstance(val, bool) else str(val)
    return out


def _alerts(v: Any) -> dict[str, Any]:
    """The `alerts` mapping (its entries are checked by memwal.airflow.alerts when notifiers are built)."""
    if not isinstance(v, Mapping):
        raise ValueError(f"{v!r} is not a mapping (keys: webhook_conn_id, notifiers)")
    unknown = set(v) - {"webhook_conn_id", "notifiers"}
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)} (known: webhook_conn_id, notifiers)")
    notifiers = v.get("notifiers")
    if notifiers is not None and not isinstance(notifiers, list):
        raise ValueError("notifiers must be a list of dotted paths or {class: ..., kwargs: {...}}")
    return dict(v)


def _positive_number(v: Any) -> float:
    return option_values.seconds(v, positive=True)


def _opt(parse):
    return lambda v: None if v is None else parse(v)


def _table_parsers(job: str) -> dict[str, Any]:
    """A job's tables-file keys and their parsers (from its spec)."""
    return {key: parse for key, (_, _, parse) in SPECS[job].table_keys().items()}


# the lag thresholds: the checks of `memwal.lag.validate_thresholds` (the sensor's and the triggers' too)
_THRESHOLDS = {key: _opt(threshold_checks()[key]) for key in THRESHOLD_KEYS}
_TABLE = {
    "uri": _str,
    "conn_id": _opt_str,
    "schedule": _schedule,
    "engine": _engine,
    "spark_conn_id": _str,
    "spark_connect_conn_id": _str,
    "auto_spark_engine": _spark_engine,
    "spark_conf": _spark_conf,
    **_table_parsers("merge"),
    "max_merge_applications": _int,
    **_table_parsers("snapshot"),
    "lag_poll_interval_s": _opt(_positive_number),
    "alerts": _opt(_alerts),
    "fleet": option_values.boolean,
}
_ROOT_KEYS = ("root", "max_depth")  # a root entry's own keys; every other key but `uri` is a table key
# the jobs whose settings nest under a key of their own, in the order the file's docs list them
_NESTED = {"thresholds": (_THRESHOLDS, Thresholds), **{
    SPECS[job].table_key: (_table_parsers(job), SPECS[job].section_type)
    for job in ("gc", "retention", "compaction", "catchup")}}

# Keys of the library's policies a tables file may not switch on, and why (a per-table default would make
# them routine).
_REFUSED = {
    "retention.delete_unverified": (
        "not allowed in the tables file: Lance would then delete every file no table version references, "
        "however young, including the data files a merge, compaction or index update has written and not yet "
        "committed (that data then reads as missing); run `memwal retention TABLE --delete-unverified --dry-run` "
        "and then without --dry-run by hand, while nothing else writes the table"),
}


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _resolve_uri(uri: str, base_dir: Path | None) -> str:
    if "://" in uri:
        return uri if not uri.startswith("file://") else os.path.abspath(uri[len("file://"):])
    path = Path(uri).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return os.path.abspath(path)


def _table(name: str, entry: Any, source: str, base_dir: Path | None) -> TableConfig:
    if not isinstance(entry, Mapping):
        raise TableConfigError(source, name, None, f"the entry is {type(entry).__name__}, not a mapping")
    kwargs: dict[str, Any] = {"name": name}
    for key, value in entry.items():
        if key in _NESTED:
            spec, cls = _NESTED[key]
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise TableConfigError(source, name, key, f"{value!r} is not a mapping")
            nested = {}
            for sub, sub_value in value.items():
                if f"{key}.{sub}" in _REFUSED:
                    if sub_value is False:  # what the README once listed as the default: harmless
                        continue
                    raise TableConfigError(source, name, f"{key}.{sub}", _REFUSED[f"{key}.{sub}"])
                if sub not in spec:
                    raise TableConfigError(source, name, f"{key}.{sub}", f"unknown key (known: {', '.join(spec)})")
                try:
                    nested[sub] = spec[sub](sub_value)
                except ValueError as exc:
                    raise TableConfigError(source, name, f"{key}.{sub}", str(exc)) from None
            try:
                kwargs[key] = cls(**nested)
            except ValueError as exc:
                raise TableConfigError(source, name, key, str(exc)) from None
        elif key in _TABLE:
            try:
                kwargs[key] = _TABLE[key](value)
            except ValueError as exc:
                raise TableConfigError(source, name, key, str(exc)) from None
        else:
            known = ", ".join([*_TABLE, *_NESTED])
            raise TableConfigError(source, name, str(key), f"unknown key (known: {known})")
    if "uri" not in kwargs:
        raise TableConfigError(source, name, "uri", "missing (the table's location: a path or s3://bucket/prefix)")
    kwargs["uri"] = _resolve_uri(kwargs["uri"], base_dir)
    if "://" in kwargs["uri"] and not kwargs["uri"].startswith(("s3://", "s3a://")):
        raise TableConfigError(source, name, "uri", f"{kwargs['uri']!r}: use a path, file:// or s3://")
    return TableConfig(**kwargs)


@dataclass(frozen=True)
class RootConfig:
    """A root entry: every Lance table under `root` (a directory, an S3 prefix or a LanceDB database), found
    anew by each fleet probe (`memwal.table_roots.list_root`, down to `max_depth` levels) and maintained with
    `template`'s settings (the entry's keys over the defaults; its uri is the root)."""

    name: str
    root: str
    template: TableConfig
    max_depth: int = 1

    def table_name(self, uri: str) -> str:
        return root_table_name(self.name, uri)

    def table(self, uri: str) -> TableConfig:
        """The settings of the table at `uri` under this root."""
        return replace(self.template, name=self.table_name(uri), uri=uri, fleet=True)


def root_table_name(entry: str, uri: str) -> str:
    """The name of the table at `uri` under root entry `entry`: `<entry>.<directory>` (without `.lance`;
    characters a table name cannot hold become `_`)."""
    base = uri.rstrip("/").rsplit("/", 1)[-1]
    base = base[: -len(".lance")] if base.endswith(".lance") else base
    return f"{entry}.{re.sub(r'[^A-Za-z0-9_.-]', '_', base) or '_'}"[:200]


def _root(name: str, entry: Mapping[str, Any], source: str, base_dir: Path | None) -> RootConfig:
    if "uri" in entry:
        raise TableConfigError(source, name, "uri", "an entry names one table (uri) or a root (root), not both")
    try:
        root = _str(entry["root"])
    except ValueError as exc:
        raise TableConfigError(source, name, "root", str(exc)) from None
    try:
        depth = _int(entry.get("max_depth", 1))
    except ValueError as exc:
        raise TableConfigError(source, name, "max_depth", str(exc)) from None
    rest = {k: v for k, v in entry.items() if k not in _ROOT_KEYS}
    try:
        template = _table(name, {**rest, "uri": root}, source, base_dir)
    except TableConfigError as exc:
        if exc.key == "uri":  # the root's location problem, named as the root's key
            raise TableConfigError(source, name, "root", exc.problem) from None
        raise
    return RootConfig(name, template.uri, replace(template, fleet=True), depth)


def parse_fleet(
    data: Any, source: str, base_dir: Path | None = None
) -> tuple[dict[str, TableConfig], dict[str, RootConfig], dict[str, TableConfigError]]:
    """(good tables, good roots, errors per bad entry name) from the parsed file. An entry with `root:` is a
    root, any other a table. A malformed file as a whole raises."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise TableConfigError(source, None, None, "expected a mapping with a `tables:` key")
    unknown = set(data) - {"tables", "defaults"}
    if unknown:
        raise TableConfigError(source, None, sorted(unknown)[0], "unknown top-level key (use `tables:`, `defaults:`)")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        raise TableConfigError(source, None, "defaults", "expected a mapping")
    entries = data.get("tables") or {}
    if not isinstance(entries, Mapping):
        raise TableConfigError(source, None, "tables", "expected a mapping of table name to settings")
    good: dict[str, TableConfig] = {}
    roots: dict[str, RootConfig] = {}
    bad: dict[str, TableConfigError] = {}
    for name, entry in entries.items():
        name = str(name)
        try:
            if not _TABLE_NAME.match(name):
                raise TableConfigError(source, name, None, "a table name is letters, digits, _ . - (it names DAGs)")
            merged = _merge(defaults, entry) if isinstance(entry, Mapping) else entry
            if isinstance(entry, Mapping) and "root" in entry:
                roots[name] = _root(name, merged, source, base_dir)
            else:
                good[name] = _table(name, merged, source, base_dir)
        except TableConfigError as exc:
            bad[name] = exc
    return good, roots, bad


def parse_tables(
    data: Any, source: str, base_dir: Path | None = None
) -> tuple[dict[str, TableConfig], dict[str, TableConfigError]]:
    """(good tables, errors per bad entry name) from the parsed file; root entries are not tables (their errors
    are listed). A malformed file as a whole raises."""
    good, _, bad = parse_fleet(data, source, base_dir)
    return good, bad


def tables_file() -> Path:
    """$MEMWAL_TABLES_FILE, else dags/memwal_tables.yaml next to this repository's plugins/, else (installed
    from the wheel) memwal_tables.yaml in Airflow's DAG folder."""
    if os.environ.get(TABLES_FILE_ENV):
        return Path(os.environ[TABLES_FILE_ENV]).expanduser().resolve()
    if DEFAULT_TABLES_FILE.is_file():
        return DEFAULT_TABLES_FILE
    try:
        from airflow.configuration import conf
    except ImportError:
        return DEFAULT_TABLES_FILE
    return (Path(conf.get("core", "dags_folder")).expanduser() / DEFAULT_TABLES_FILE.name).resolve()


def _load_yaml(text: str) -> Any:
    """yaml.safe_load with libyaml's C loader where PyYAML has it (a tables file of 1,000 entries parses
    several times faster; the same safe subset of YAML)."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _read_file(path: Path) -> Any:
    import yaml

    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TableConfigError(str(path), None, None, f"tables file not found (set ${TABLES_FILE_ENV})") from None
    try:
        return _load_yaml(text)
    except yaml.YAMLError as exc:
        raise TableConfigError(str(path), None, None, f"not valid YAML: {' '.join(str(exc).split())}") from None


def _read_variable() -> Any:
    """The `memwal_tables` Variable (JSON or YAML), or None when it is not set. Only inside tasks."""
    from airflow.sdk import Variable

    try:
        text = Variable.get(TABLES_VARIABLE, default=None)
    except Exception:  # no Variable backend reachable (outside Airflow): the file alone
        return None
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if not isinstance(text, str):
        return text
    import yaml

    try:
        return _load_yaml(text)
    except yaml.YAMLError:
        try:
            return json.loads(text)
        except ValueError as exc:
            raise TableConfigError(f"Variable {TABLES_VARIABLE}", None, None, f"not JSON or YAML: {exc}") from None


def _load(use_variable: bool) -> tuple[dict[str, TableConfig], dict[str, RootConfig], dict[str, TableConfigError]]:
    path = tables_file()
    data = _read_file(path)
    if use_variable:
        override = _read_variable()
        if override is not None:
            if not isinstance(override, Mapping):
                raise TableConfigError(f"Variable {TABLES_VARIABLE}", None, None, "expected a mapping")
            data = _merge(data or {}, override)
    source = str(path) if not use_variable else f"{path} (+ Variable {TABLES_VARIABLE})"
    return parse_fleet(data, source, path.parent)


def load_tables_and_errors(
    use_variable: bool = True,
) -> tuple[dict[str, TableConfig], dict[str, TableConfigError]]:
    """Good tables and the error of each bad entry (file, then the Variable's overrides merged per table)."""
    good, _, bad = _load(use_variable)
    return good, bad


def load_fleet(
    use_variable: bool = True,
) -> tuple[dict[str, TableConfig], dict[str, RootConfig], dict[str, TableConfigError]]:
    """What the fleet DAG maintains: the tables with `fleet: true`, every root, and the error of each bad entry."""
    good, roots, bad = _load(use_variable)
    return {n: t for n, t in good.items() if t.fleet}, roots, bad


def load_tables(use_variable: bool = True) -> dict[str, TableConfig]:
    """Every valid table by name; raises the first TableConfigError if any entry is bad."""
    good, bad = load_tables_and_errors(use_variable)
    if bad:
        raise next(iter(bad.values()))
    return good


@contextmanager
def config_errors_fail() -> Iterator[None]:
    """In a task: a TableConfigError becomes AirflowFailException, which fails the task without a retry
    (retrying cannot fix a tables file; a plain exception would be retried as if transient)."""
    try:
        yield
    except TableConfigError as exc:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(str(exc)) from None


def get_table(name: str, use_variable: bool = True) -> TableConfig:
    """One table's config; a clear error for an unknown or invalid table."""
    good, bad = load_tables_and_errors(use_variable)
    if name in bad:
        raise bad[name]
    if name not in good:
        known = ", ".join(sorted(good)) or "none"
        raise TableConfigError(str(tables_file()), name, None,
                               f"no such table in the tables file (configured: {known}); add it there")
    return good[name]
