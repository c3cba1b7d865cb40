"""MemWalHook: the tables of one `memwal` connection, each opened once per hook as a `memwal.table.MemWalTable`
(`hook.table(cfg)`), their status, and the jobs, run in-process, submitted with the Spark provider's
SparkSubmitHook, or driven from this process through a Spark Connect session (`spark_connect` connection).
An operator builds one hook (its cached `hook` property).

Connection `memwal` (the form fields come from `memwal.airflow.get_provider_info`):
    host      -> aws_endpoint (e.g. http://127.0.0.1:9000; empty: the store's default)
    login     -> aws_access_key_id          password -> aws_secret_access_key
    extra     -> {"region": "us-east-1", "allow_http": true, "storage_options": {...any Lance option}}
A table without `conn_id` uses no storage options (local files, or the environment's credentials).

Secrets never leave the connection except into the job's own process: in-process as a dict, on Spark as
`--storage-options-json @FILE` (a 0600 temp file deleted afterwards), never on argv or in a log line.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowNotFoundException

from memwal.errors import one_line
from memwal.job_config import is_true
from memwal.storage import is_secret_option, url_credentials

if TYPE_CHECKING:
    from memwal.airflow.config import TableConfig
    from memwal.fleet_batch import TableDue
    from memwal.job_config import JobOptions
    from memwal.table import MemWalTable

__all__ = ["JobRun", "MemWalHook", "MemWalTaskError", "spark_master"]

log = logging.getLogger(__name__)

_UNREACHABLE_HINTS = ("error sending request", "connection refused", "dns error", "timed out", "connect error",
                      "failed to lookup address", "network is unreachable", "no route to host")


class MemWalTaskError(AirflowException):
    """A job or check failed for a reason that may pass (storage or Spark down): one line; the task retries."""


@dataclass
class JobRun:
    """What a job returned: its JSON summary, exit status (0 done, 3 some regions failed) and that reason."""

    job: str
    summary: dict[str, Any]
    returncode: int
    reason: str | None = None


def _storage_problem(exc: BaseException, what: str, conn_id: str | None) -> AirflowException:
    """A one-line task error for a failure to open a table or run a job: unreachable storage retries; bad
    input (`memwal.errors.BadInputError`: a setting, a missing table, region or index) fails without retry."""
    from memwal.errors import BadInputError, MemWalNotInitializedError, TableNotFoundError, is_table_not_found

    text = str(exc)
    low = text.lower()
    conn = f"connection {conn_id!r}" if conn_id else "the table's storage (no conn_id set)"
    if isinstance(exc, MemWalNotInitializedError):
        return AirflowFailException(f"{what} has no MemWAL index (__lance_mem_wal): initialise MemWAL on the "
                                    "table (Lance initialize_mem_wal) or remove it from the tables file")
    if isinstance(exc, TableNotFoundError) or is_table_not_found(exc):
        return AirflowFailException(f"{what} does not exist: check its uri in the tables file and {conn}")
    if isinstance(exc, BadInputError):
        return AirflowFailException(f"{what}: {one_line(text)}")
    if any(h in low for h in _UNREACHABLE_HINTS):
        endpoint = next((w for w in text.split() if w.startswith(("http://", "https://"))), "")
        at = f" ({urlparse(endpoint).scheme}://{urlparse(endpoint).netloc})" if endpoint else ""
        return MemWalTaskError(f"{what}: storage unreachable{at}: check the endpoint in {conn} and that the "
                               f"object store is up ({one_line(text, 200)})")
    return MemWalTaskError(f"{what}: {one_line(text)}")



def _submit_workdir(prefix: str) -> tuple[dict[str, str], str, Path]:
    """For one spark-submit: the environment it runs with (the interpreter, SPARK_HOME, spark-submit on PATH,
    MEMWAL_RESULT_FILE), a fresh 0700 work directory, and the result file in it."""
    from spark_jobs.submit import spark_submit_env, spark_submit_executable

    env = spark_submit_env()
    env_vars = {k: env[k] for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME")}
    env_vars["PATH"] = os.pathsep.join([str(Path(spark_submit_executable()).parent), os.environ.get("PATH", "")])
    workdir = tempfile.mkdtemp(prefix=prefix)  # 0700
    result_file = Path(workdir) / "result.json"
    env_vars["MEMWAL_RESULT_FILE"] = str(result_file)
    return env_vars, workdir, result_file

class MemWalHook(BaseHook):
    """A MemWAL table's storage options (from a `memwal` connection, read lazily), status and jobs."""

    conn_name_attr = "memwal_conn_id"
    default_conn_name = "memwal_default"
    conn_type = "memwal"
    hook_name = "MemWAL table storage"

    def __init__(self, memwal_conn_id: str | None = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.memwal_conn_id = memwal_conn_id
        self._spark_hook: Any = None
        self._tables: dict[str, MemWalTable] = {}

    @classmethod
    def for_table(cls, cfg: TableConfig) -> MemWalHook:
        return cls(memwal_conn_id=cfg.conn_id)

    # --- storage options ------------------------------------------------------------------------------

    @cached_property
    def storage_options(self) -> dict[str, str] | None:
        """Lance storage options from the connection (None without a connection id)."""
        if not self.memwal_conn_id:
            return None
        try:
            conn = self.get_connection(self.memwal_conn_id)
        except AirflowNotFoundException:
            raise AirflowFailException(
                f"connection {self.memwal_conn_id!r} (a table's conn_id) is not defined: create it with type "
                "memwal (endpoint, access key id, secret) or remove conn_id from the table"
            ) from None
        return self.storage_options_from(conn)

    @staticmethod
    def storage_options_from(conn: Any) -> dict[str, str] | None:
        """host -> aws_endpoint, login/password -> keys, extra region / allow_http / storage_options."""
        extra = conn.extra_dejson or {}

        def field(name: str) -> Any:
            return extra.get(name, extra.get(f"extra__memwal__{name}"))

        opts: dict[str, str] = {}
        extra_opts = field("storage_options")
        if isinstance(extra_opts, str) and extra_opts.strip():
            try:
                extra_opts = json.loads(extra_opts)
            except ValueError:
                raise AirflowFailException(
                    f"connection {conn.conn_id!r}: extra storage_options is not a JSON object") from None
        if extra_opts:
            if not isinstance(extra_opts, Mapping):
                raise AirflowFailException(f"connection {conn.conn_id!r}: extra storage_options is not an object")
            opts.update({str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in extra_opts.items()})
        if conn.host:
            endpoint = conn.host if "://" in conn.host else f"https://{conn.host}"
            if conn.port and not urlparse(endpoint).port:
                endpoint = f"{endpoint.rstrip('/')}:{conn.port}"
            opts["aws_endpoint"] = endpoint
        if conn.login:
            opts["aws_access_key_id"] = conn.login
        if conn.password:
            opts["aws_secret_access_key"] = conn.password
        if field("region"):
            opts["aws_region"] = str(field("region"))
        allow_http = field("allow_http")
        if allow_http is not None and allow_http != "":
            opts["allow_http"] = "true" if is_true(allow_http) else "false"
        _mask(opts)
        return opts or None

    def get_conn(self) -> dict[str, str] | None:
        return self.storage_options

    def test_connection(self) -> tuple[bool, str]:
        """The UI's Test button: storage options resolve (the endpoint is checked when a table is opened)."""
        try:
            opts = self.storage_options or {}
        except Exception as exc:
            return False, one_line(exc)
        return True, f"storage options: {', '.join(sorted(opts)) or 'none'}"

    # --- the tables -------------------------------------------------------------------------------

    def table(self, table: str | TableConfig) -> MemWalTable:
        """The table's handle (`memwal.table.MemWalTable`), opened once per hook with its MemWAL index
        loaded; one-line errors for a missing table, a table without MemWAL and unreachable storage."""
        from memwal.table import MemWalTable

        uri, what = _uri_and_name(table)
        if uri not in self._tables:
            try:
                handle = MemWalTable.open(uri, self.storage_options)
                handle.index  # noqa: B018 - loads it: a table without MemWAL fails here
            except AirflowException:
                raise
            except Exception as exc:
                raise _storage_problem(exc, what, self.memwal_conn_id) from exc
            self._tables[uri] = handle
        return self._tables[uri]

    def _check_primary_key(self, handle: MemWalTable, what: str) -> list[str]:
        """The table's key columns by memwal.primary_key's rule (LanceDB's position-only marker included);
        AirflowFailException naming the table and the columns when there is none or its metadata contradicts
        itself."""
        from memwal.errors import InvalidPrimaryKeyError, NoPrimaryKeyError
        from memwal.primary_key import primary_key_columns

        try:
            return primary_key_columns(handle.schema, where=what)
        except (NoPrimaryKeyError, InvalidPrimaryKeyError) as exc:  # a retry cannot fix field metadata
            raise AirflowFailException(one_line(exc)) from exc

    def validate_regions(self, table: str | TableConfig, regions: Sequence[str] | None) -> list[str] | None:
        """Canonical region ids (`memwal.jobs.check_regions`, the command line's check); AirflowFailException
        naming a malformed or unknown one and the table. None: all regions."""
        from memwal.errors import BadInputError
        from memwal.jobs import check_regions

        if not regions:
            return None
        _, what = _uri_and_name(table)
        handle = self.table(table)
        try:
            return check_regions(handle, regions, param="region", where=what)
        except BadInputError as exc:
            raise AirflowFailException(str(exc)) from None
        except Exception as exc:
            raise _storage_problem(exc, what, self.memwal_conn_id) from exc

    def status(self, table: str | TableConfig, regions: Sequence[str] | None = None) -> dict[str, Any]:
        """`memwal status` of the table (a URI or a TableConfig) as a dict."""
        _, what = _uri_and_name(table)
        from memwal.status import table_status

        handle = self.table(table)
        try:
            return table_status(handle, regions).to_dict()
        except Exception as exc:
            raise _storage_problem(exc, what, self.memwal_conn_id) from exc

    def pending_work(self, table: str | TableConfig, regions: Sequence[str] | None = None,
                     up_to_generation: int | None = None) -> list[dict[str, Any]]:
        """`memwal.status.pending_work` of the table: what a merge would do now, per region."""
        from memwal.status import pending_work

        _, what = _uri_and_name(table)
        handle = self.table(table)
        try:
            return pending_work(handle, regions, up_to_generation)
        except Exception as exc:
            raise _storage_problem(exc, what, self.memwal_conn_id) from exc

    def rebuild_indexes(self, table: str | TableConfig, names: Sequence[str] | None = None) -> list[str]:
        """`memwal.catchup.rebuild_indexes` of the table; an unknown index name fails the task."""
        from memwal.catchup import rebuild_indexes

        _, what = _uri_and_name(table)
        try:
            return rebuild_indexes(self.table(table), names)
        except ValueError as exc:
            raise AirflowFailException(f"{what}: {exc}") from None

    # --- jobs -----------------------------------------------------------------------------------------

    def run_job(
        self,
        job: str,
        table: str | TableConfig,
        *,
        regions: Sequence[str] | None = None,
        options: JobOptions | None = None,
        engine: str = "in_process",
        spark_conn_id: str = "spark_default",
        spark_conf: Mapping[str, str] | None = None,
        on_spark_hook: Callable[[Any], None] | None = None,
        spark_connect_conn_id: str = "spark_connect_default",
        auto_spark_engine: str = "spark_connect",
    ) -> JobRun:
        """Run one job (merge, catchup, snapshot, gc, compaction, retention) with its typed options. Returns
        the summary with exit 0 or 3; raises a one-line AirflowException otherwise.

        `memwal.engines.dispatch` plans in this process, chooses the engine and runs the job on this hook's
        runner for it (in process, SparkSubmitHook, Spark Connect: each turns its errors into task errors): a
        job with no executor work runs in process whatever the engine; `auto` takes `auto_spark_engine` for
        large work.
        The summary says where each part ran and why (`ran_on`, `engine`, `engine_reason`, `plan`)."""
        from memwal import jobs
        from memwal.engines import ENGINES, dispatch
        from memwal.job_config import JobOptions

        if job not in jobs.JOBS:
            raise AirflowFailException(f"unknown job {job!r} (one of {', '.join(jobs.JOBS)})")
        _, what = _uri_and_name(table)
        if engine not in ENGINES:
            raise AirflowFailException(f"{what}: engine {engine!r} is not one of {', '.join(ENGINES)}")
        handle = self.table(table)  # a missing table, no MemWAL or unreachable storage: one line, nothing run
        options = options or JobOptions()
        try:
            jobs.validate_job_options(job, options, regions)
        except ValueError as exc:
            raise AirflowFailException(f"memwal {job}: {exc}") from None
        if job == "merge":
            self._check_primary_key(handle, what)  # a merge needs the key: a bad one fails once, not per region
        runners = {
            "in_process": partial(self._run_in_process, what=what),
            "spark": partial(self._run_spark, what=what, spark_conn_id=spark_conn_id, spark_conf=spark_conf or {},
                             on_spark_hook=on_spark_hook),
            "spark_connect": partial(self._run_connect, what=what, conn_id=spark_connect_conn_id),
        }

        chosen: list[str] = []

        def on_choice(plan: Any, choice: Any) -> None:
            chosen.append(choice.engine)
            log.info("memwal %s on %s: engine %s (%s): %s", job, what, choice.engine, engine, choice.reason)

        try:
            summary = dispatch(job, handle, options, regions, engine=engine, runners=runners,
                               spark_engine=auto_spark_engine, on_choice=on_choice)
        except Exception as exc:
            if chosen or isinstance(exc, AirflowException):
                raise  # the runner's (its own one-line errors)
            raise _storage_problem(exc, f"memwal {job} on {what} (planning)", self.memwal_conn_id) from exc
        reason = jobs.failure_reason(summary)
        return JobRun(job, summary, jobs.EXIT_PARTIAL if reason else jobs.EXIT_OK, reason)

    def spark_connect_url(self, conn_id: str, what: str) -> str:
        """The sc:// URL of a `spark_connect` connection, as the Spark provider's SparkConnectHook builds it
        (host, port, user id, token, use_ssl); the token is registered with the secrets masker."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        try:
            conn = self.get_connection(conn_id)
        except AirflowNotFoundException:
            raise AirflowFailException(
                f"{what}: Spark Connect connection {conn_id!r} is not defined: create it (type spark_connect, "
                "host sc://HOST, port 15002) or set spark_connect_conn_id / another engine for the table"
            ) from None
        if not conn.host:
            raise AirflowFailException(f"{what}: Spark Connect connection {conn_id!r} has no host")
        if conn.password:
            _mask({"token": conn.password})
        try:
            return SparkConnectHook(conn_id=conn_id).get_connection_url()
        except ValueError as exc:
            raise AirflowFailException(f"{what}: Spark Connect connection {conn_id!r}: {exc}") from None

    def _run_connect(self, job: str, handle: MemWalTable, options: JobOptions, regions: Sequence[str] | None, *,
                     what: str, conn_id: str) -> dict[str, Any]:
        """The spark_connect runner: `spark_jobs.connect.ConnectRunner` on the connection's URL, its errors
        as one-line task errors (a server that is down or went away retries)."""
        from spark_jobs.connect import ConnectRunner, ConnectServerError

        url = self.spark_connect_url(conn_id, what)
        try:
            return ConnectRunner(url, conn_id=conn_id)(job, handle, options, regions)
        except ConnectServerError as exc:
            raise MemWalTaskError(f"memwal {job} on {what}: {exc}") from None
        except Exception as exc:
            raise _storage_problem(exc, f"memwal {job} on {what} (Spark Connect)", self.memwal_conn_id) from exc

    def _run_in_process(self, job: str, handle: MemWalTable, options: JobOptions, regions: Sequence[str] | None, *,
                        what: str) -> dict[str, Any]:
        from memwal.engines import in_process

        try:
            return in_process(job, handle, options, regions)
        except Exception as exc:
            raise _storage_problem(exc, f"memwal {job} on {what}", self.memwal_conn_id) from exc

    def _spark_master(self, spark_conn_id: str, what: str) -> str:
        """The Spark master of the connection, read through the public connection API as the Spark provider
        resolves it (`spark_master`); a missing connection is named (the provider would fall back to yarn)."""
        try:
            return spark_master(self.get_connection(spark_conn_id))
        except AirflowNotFoundException:
            raise AirflowFailException(
                f"{what}: Spark connection {spark_conn_id!r} is not defined: create it (type spark, host "
                "local[*] or spark://HOST with port 7077) or set spark_conn_id / engine: in_process for the table"
            ) from None

    def _run_spark(self, job: str, handle: MemWalTable, options: JobOptions, regions: Sequence[str] | None, *,
                   what: str, spark_conn_id: str, spark_conf: Mapping[str, str],
                   on_spark_hook: Callable[[Any], None] | None) -> dict[str, Any]:
        """The spark runner: the job through the Spark provider's SparkSubmitHook with the same application
        arguments as `memwal --spark` (`spark_jobs.submit.application_args`); its summary (exit 0 or 3) from
        the result file, else a one-line task error."""
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from memwal import jobs
        from spark_jobs.submit import (
            application_args,
            job_script,
            package_code,
            spark_conf_defaults,
            write_storage_options_file,
        )

        master = self._spark_master(spark_conn_id, what)
        env_vars, workdir, result_file = _submit_workdir(f"memwal-{job}-")
        try:
            # Storage options: a 0600 file in the 0700 workdir, never on spark-submit's argv.
            opts_file = write_storage_options_file(workdir, handle.storage_options) if handle.storage_options else None
            app_args = application_args(handle.uri, storage_options_file=opts_file, regions=regions,
                                        extra_args=options.argv(job))
            _check_master_reachable(master, spark_conn_id, what)
            # py_files: the executors import memwal and spark_jobs from this zip, installed on the workers or not.
            spark = SparkSubmitHook(conn_id=spark_conn_id, name=f"memwal-{job}", conf=spark_conf_defaults(spark_conf),
                                    py_files=package_code(), application_args=app_args, env_vars=env_vars)
            self._spark_hook = spark
            if on_spark_hook:
                on_spark_hook(spark)
            started = time.monotonic()
            failure: Exception | None = None
            try:
                spark.submit(str(job_script(job)))
            except Exception as exc:
                failure = exc
            result = _read_result(result_file)
            log.info("memwal-%s on %s: spark-submit finished in %.1fs", job, what, time.monotonic() - started)
        finally:
            for p in Path(workdir).glob("*"):
                p.unlink(missing_ok=True)
            os.rmdir(workdir)
        if result is None:
            tail = next((ln for ln in reversed(str(failure or "").splitlines()) if ln.strip()), "no output")
            raise MemWalTaskError(f"memwal-{job} on {what}: spark-submit (master {master}, Spark connection "
                                  f"{spark_conn_id!r}) ended before the job reported a result: {one_line(tail)}; "
                                  "see the log above, the task retry resumes from merged_generations")
        code, summary, error = result.get("exit"), result.get("summary"), result.get("error")
        if code in (jobs.EXIT_OK, jobs.EXIT_PARTIAL) and isinstance(summary, dict):
            return summary
        error = error or f"exit {code}"
        if code == jobs.EXIT_USAGE:
            raise AirflowFailException(f"memwal-{job} on {what}: {error}")
        raise _storage_problem(RuntimeError(error), f"memwal-{job} on {what} (Spark)", self.memwal_conn_id)

    # --- a batch of tables' due jobs in one application ------------------------------------------------

    BATCH_ENGINES = ("in_process", "spark", "spark_connect")

    def run_batch(self, entries: Sequence[TableDue], *, engine: str = "spark", spark_conn_id: str = "spark_default",
                  spark_conf: Mapping[str, str] | None = None, on_spark_hook: Callable[[Any], None] | None = None,
                  spark_connect_conn_id: str = "spark_connect_default") -> list[dict[str, Any]]:
        """Every table's due jobs (`memwal.fleet_batch.TableDue`, e.g. `from_probe(probe result)`, packed by
        `pack_batches`) in ONE application: `spark` submits `spark_jobs/fleet.py` once through SparkSubmitHook
        (this connection's storage options in a private file, never on argv), `spark_connect` runs the batch on
        one session from this process, `in_process` here; a table with only GC or retention due (driver-only
        work) runs here whatever the engine, so a batch of such tables starts no Spark. Returns one result per
        table in the given order (`memwal.fleet_batch.run_table`: `table_uri`, `status` ok / partial / failed,
        `failed_job`, `error`, `ran`, `skipped`, `summaries`): a table's failure is its result, the others run.
        Raises a one-line task error only when the batch as a whole did not run (Spark unreachable, no result)."""
        from memwal.fleet_batch import in_process, run_batch

        if engine not in self.BATCH_ENGINES:
            raise AirflowFailException(f"memwal batch: engine {engine!r} is not one of {', '.join(self.BATCH_ENGINES)}")
        entries = list(entries)
        if not entries:
            return []
        what = f"memwal batch of {len(entries)} table(s)"
        started = time.monotonic()
        # A table with only driver-only jobs (GC, retention) due runs here: it needs no Spark.
        here = [i for i, e in enumerate(entries) if engine == "in_process" or not e.needs_spark]
        on_spark = [i for i in range(len(entries)) if i not in set(here)]
        done: dict[int, dict[str, Any]] = {}
        if here:
            done.update(zip(here, run_batch([entries[i] for i in here], in_process, open_table=self.table),
                            strict=True))
        if on_spark:
            batch = [entries[i] for i in on_spark]
            if engine == "spark_connect":
                from spark_jobs.connect import ConnectServerError
                from spark_jobs.fleet_runners import run_fleet_connect

                url = self.spark_connect_url(spark_connect_conn_id, what)
                try:
                    tables = run_fleet_connect(batch, url, storage_options=self.storage_options,
                                               conn_id=spark_connect_conn_id)["tables"]
                except ConnectServerError as exc:
                    raise MemWalTaskError(f"{what}: {exc}") from None
            else:
                tables = self._run_batch_spark(batch, what=what, spark_conn_id=spark_conn_id,
                                               spark_conf=spark_conf or {}, on_spark_hook=on_spark_hook)
            done.update(zip(on_spark, tables, strict=True))
        results = [done[i] for i in range(len(entries))]
        failed = [r for r in results if r.get("status") != "ok"]
        log.info("%s on %s: %d done, %d failed in %.1fs", what, engine, len(results) - len(failed), len(failed),
                 time.monotonic() - started)
        for r in failed:
            log.warning("%s", r.get("error"))
        return results

    def _run_batch_spark(self, entries: list[TableDue], *, what: str, spark_conn_id: str,
                         spark_conf: Mapping[str, str], on_spark_hook: Callable[[Any], None] | None) -> list[dict]:
        """One spark-submit of `spark_jobs/fleet.py` through SparkSubmitHook; the tables' results from the
        result file (exit 0: all done, 3: some table failed), else a one-line task error."""
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from memwal import jobs
        from spark_jobs.fleet_runners import FLEET_SCRIPT, fleet_application_args, write_batch_file
        from spark_jobs.submit import (
            package_code,
            spark_conf_defaults,
            write_storage_options_file,
        )

        master = self._spark_master(spark_conn_id, what)
        env_vars, workdir, result_file = _submit_workdir("memwal-fleet-")
        failure: Exception | None = None
        try:
            batch_file = write_batch_file(workdir, entries)
            opts = self.storage_options
            opts_file = write_storage_options_file(workdir, opts) if opts else None
            _check_master_reachable(master, spark_conn_id, what)
            spark = SparkSubmitHook(conn_id=spark_conn_id, name="memwal-fleet", conf=spark_conf_defaults(spark_conf),
                                    py_files=package_code(), env_vars=env_vars,
                                    application_args=fleet_application_args(batch_file, opts_file))
            self._spark_hook = spark
            if on_spark_hook:
                on_spark_hook(spark)
            try:
                spark.submit(str(FLEET_SCRIPT))
            except Exception as exc:
                failure = exc
            result = _read_result(result_file)
        finally:
            for p in Path(workdir).glob("*"):
                p.unlink(missing_ok=True)
            os.rmdir(workdir)
        code, summary = (result or {}).get("exit"), (result or {}).get("summary")
        if code in (jobs.EXIT_OK, jobs.EXIT_PARTIAL) and isinstance(summary, dict):
            return list(summary.get("tables") or [])
        if result is None:
            tail = next((ln for ln in reversed(str(failure or "").splitlines()) if ln.strip()), "no output")
            raise MemWalTaskError(f"{what}: spark-submit (master {master}, Spark connection {spark_conn_id!r}) ended "
                                  f"before the batch reported a result: {one_line(tail)}; see the log above")
        error = result.get("error") or f"exit {code}"
        if code == jobs.EXIT_USAGE:
            raise AirflowFailException(f"{what}: {error}")
        raise MemWalTaskError(f"{what} (Spark): {one_line(error)}")

    def on_kill(self) -> None:
        if self._spark_hook is not None:
            self._spark_hook.on_kill()


def spark_master(conn: Any) -> str:
    """The master URL of a `spark` connection from its public fields, the Spark provider's rule: a host that
    is a whole master URL (`local[*]`, `spark://h`, `k8s://https://h`) when the type is spark and the host
    has a scheme or there is no port, else `<conn_type>://<host>`; then `:<port>` when there is one."""
    host = conn.host or ""
    if conn.conn_type == "spark" and host and ("://" in host or not conn.port):
        master = host
    else:
        master = f"{conn.conn_type}://{host}"
    return f"{master}:{conn.port}" if conn.port else master


def _check_master_reachable(master: str, spark_conn_id: str, what: str, timeout: float = 5.0) -> None:
    """A standalone master that does not answer fails fast (spark-submit would retry for a minute)."""
    if not master.startswith("spark://"):
        return
    for hostport in master[len("spark://"):].split(","):
        host, _, port = hostport.rpartition(":")
        try:
            with socket.create_connection((host or hostport, int(port or 7077)), timeout=timeout):
                return
        except (OSError, ValueError):
            continue
    raise MemWalTaskError(f"{what}: Spark master {master} (Spark connection {spark_conn_id!r}) is not reachable: "
                          "start it or fix the connection; nothing was submitted")


def _read_result(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _uri_and_name(table: str | TableConfig) -> tuple[str, str]:
    if isinstance(table, str):
        return table, f"table at {table}"
    return table.uri, f"table {table.name!r} ({table.uri})"


def _mask(opts: Mapping[str, str]) -> None:
    """Register secret-looking storage option values, and the credentials embedded in URL-valued ones
    (`proxy_url=http://user:pass@host`), with Airflow's secrets masker."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover
        return
    for key, value in opts.items():
        if value and is_secret_option(key):
            mask_secret(value, key)
        elif value and (userinfo := url_credentials(value)):
            mask_secret(userinfo)

