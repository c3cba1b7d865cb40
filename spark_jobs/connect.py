"""The `spark_connect` engine: a job's driver logic runs in the caller's process (an Airflow task, the
`memwal` command) as a Spark Connect client; its executor work goes through the session as DataFrame
operations (`mapInArrow`, `spark_jobs.task_runner`), with our code shipped as a session artifact
(`package_code()`'s private, verified zip, `addArtifacts(pyfile=True)`: what `--py-files` does for
spark-submit).

    summary = run_job_on_connect("merge", "sc://spark-connect:15002", table, options, regions, conn_id="sc")
    summary = ConnectRunner("sc://spark-connect:15002", conn_id="sc")("merge", table, options, regions)  # the same

Sessions are shared: every client of one code version attaches to the same server-side session (its id
derived from the code zip's name and the hour, `shared_session_url`), so the artifact is already there and
the executors' Python workers, which a server keys by the session's artifacts, are already up and have
imported pyarrow, lance and memwal: a task's first job costs what a long-lived application's next job
does. A client leaves the session open when it ends (the server expires it after its idle timeout, one
hour by default); a session the server has closed is replaced by a private one for that task.

Within one process the client itself is kept too (`open_session` hands the next job the same client, no new
channel, no code upload, no code hashing): several jobs of one task, a fleet batch, a test module. A job's
own error leaves it in use; an error saying the server went away or dropped the session discards it, and
the next job builds a new one. Such a process skips the interpreter's final full garbage collection
(`gc.freeze` at exit): over pyspark's, pandas' and lance's objects it took longer than the job's
attach (bench/README.md, engines.py).

Storage options reach the executors inside the pickled task closures, as with spark-submit; the server
logs a Python UDF's bytes only as a truncated prefix (`[truncated(size=...)]`), never whole. A server that
is down or unreachable gives `ConnectServerError`: one line naming the connection and the URL (any token
redacted); nothing was committed by the failed step, and the job's retry resumes (jobs are idempotent).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import hashlib
import importlib
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from memwal.errors import MemWalError, one_line

if TYPE_CHECKING:
    from memwal.job_config import JobOptions
    from memwal.table import MemWalTable

__all__ = [
    "SESSION_PERIOD_S",
    "ConnectRunner",
    "ConnectServerError",
    "connect_mode",
    "connect_session",
    "discard_session",
    "import_client",
    "open_session",
    "redact_url",
    "run_job_on_connect",
    "run_on_session",
    "shared_session_url",
]

log = logging.getLogger(__name__)

DEFAULT_PORT = 15002
SESSION_PERIOD_S = 3600  # a shared session's id changes every period (shorter than the idle timeout)

_lock = threading.Lock()
# This process's client of the shared session, per server URL: (the period it was built in, the session).
_clients: dict[str, tuple[int, Any]] = {}
_retired: list[Any] = []  # earlier periods' clients, closed at exit


class ConnectServerError(MemWalError):
    """The Spark Connect server is down, unreachable, or went away during the job (a retry resumes)."""


def redact_url(url: str) -> str:
    """The sc:// URL with the value of a `token` parameter replaced by ***."""
    return re.sub(r"(?i)(;token=)[^;]*", r"\1***", url)


def _where(url: str, conn_id: str | None) -> str:
    conn = f"Spark Connect connection {conn_id!r}" if conn_id else "Spark Connect"
    return f"{conn} at {redact_url(url)}"


def _check_reachable(url: str, conn_id: str | None, timeout: float = 5.0) -> None:
    parsed = urlparse(url.replace("sc://", "http://", 1))
    host, port = parsed.hostname or "localhost", parsed.port or DEFAULT_PORT
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except OSError as exc:
        raise ConnectServerError(f"{_where(url, conn_id)} is not reachable ({one_line(exc, 120)}): start the "
                                 "Spark Connect server or fix the connection; nothing ran") from None


@contextlib.contextmanager
def connect_mode() -> Iterator[None]:
    """pyspark's marker of a Connect process (`SPARK_CONNECT_MODE_ENABLED`: its functions and Columns then
    build Connect plans), for the block only: pyspark sets it for good on a Connect session's creation,
    after which this process could not start a classic session (the CLI, tests, a later job)."""
    before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        else:
            os.environ["SPARK_CONNECT_MODE_ENABLED"] = before


def shared_session_url(url: str, code_zip: str, now: float | None = None) -> str:
    """`url` with the session id every client of this code version uses in this period."""
    period = int((time.time() if now is None else now) // SESSION_PERIOD_S)
    digest = hashlib.sha256(f"memwal:{Path(code_zip).name}:{period}".encode()).digest()[:16]
    session_id = str(uuid.UUID(bytes=digest, version=4))
    if ";" in url:
        return f"{url};session_id={session_id}"
    return f"{url.rstrip('/')}/;session_id={session_id}"


@contextlib.contextmanager
def open_session(url: str, *, conn_id: str | None = None, ship_code: bool = True) -> Iterator[Any]:
    """A Connect session with our code on it (the shared one, this process's client of it kept for the next
    job), in connect_mode. A private session (`ship_code=False`, or the shared one closed by the server) is
    closed afterwards; an error of the server's or of the session's (`_session_lost`) discards the client."""
    with connect_mode():
        spark = connect_session(url, conn_id=conn_id, ship_code=ship_code)
        try:
            yield spark
        except BaseException as exc:
            if _session_lost(exc):
                discard_session(spark)
            raise
        finally:
            if not getattr(spark, "_memwal_shared", False):
                _close(spark, release=True)


def connect_session(url: str, *, conn_id: str | None = None, ship_code: bool = True) -> Any:
    """A Spark Connect session with our code shipped to the executors: the shared session of this code
    version (module docstring) when `ship_code` (this process's client of it if it has a live one for the
    current period), else a private one."""
    import warnings

    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    _check_reachable(url, conn_id)  # one cheap connect: a server that is down is one line, nothing ran
    if not ship_code:
        return _session(url, conn_id, None)
    period = int(time.time() // SESSION_PERIOD_S)
    with _lock:
        kept = _clients.get(url)
        if kept is not None and kept[0] == period and not kept[1].is_stopped:
            return kept[1]
        _clients.pop(url, None)  # an earlier period's (maybe still in a job of another thread): closed at exit
        from spark_jobs.submit import package_code

        code = package_code()
        try:
            spark = _session(shared_session_url(url, code, now=period * SESSION_PERIOD_S), conn_id, code)
        except ConnectServerError as exc:
            if "SESSION_CLOSED" not in str(exc) and "INVALID_HANDLE" not in str(exc):
                raise
            log.info("the shared Spark Connect session was closed by the server; using a private one")
            return _session(url, conn_id, code)
        spark._memwal_shared = True
        if kept is not None:
            _retired.append(kept[1])
        _clients[url] = (period, spark)
        # After pyspark's own exit handler of this client (registered at its creation), so that ours runs
        # first: a closed client skips pyspark's (a cache clean-up round trip, retried if the server is gone).
        atexit.unregister(_at_exit)
        atexit.register(_at_exit)
        return spark


def discard_session(spark: Any) -> None:
    """Forget (and close) this process's client `spark`: the next job builds a new one."""
    with _lock:
        for url, (_, kept) in list(_clients.items()):
            if kept is spark:
                del _clients[url]
    _close(spark, release=False)


def _close(spark: Any, *, release: bool) -> None:
    try:
        spark.release_session_on_close = release  # the shared session stays for the next task
        spark.stop()
    except Exception:  # the server may be gone; the outcome is decided
        pass


def _at_exit() -> None:
    """Close the kept clients (leaving the shared session open), then spare the interpreter its final full
    collection: the process is ending, its cycles are reclaimed with it (what it flushes is flushed anyway)."""
    with _lock:
        kept = [spark for _, spark in _clients.values()] + _retired
        _clients.clear()
        _retired.clear()
    for spark in kept:
        _close(spark, release=False)
    gc.freeze()


@contextlib.contextmanager
def _collector_off() -> Iterator[None]:
    """For a block of imports (pyspark's Connect client: some 250 modules, 0.2 s of a task's CPU): the cyclic
    collector off, as imports make objects, not garbage, yet set off a collection every 700 allocations. In
    a process that froze its start-up (the `memwal` command, `memwal.cli.start_up`) what they made is frozen
    too; elsewhere the collector catches up once, when it is back on."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count():
            gc.freeze()
        if collecting:
            gc.enable()


def import_client() -> None:
    """Import pyspark's Connect client (with the collector off) in connect_mode: what a job's first session
    costs in a fresh process before any round trip."""
    with connect_mode(), _collector_off():
        import pyspark.sql.connect.session  # noqa: F401


def _session(url: str, conn_id: str | None, code: str | None) -> Any:
    import_client()
    from pyspark.sql.connect.session import SparkSession

    try:
        spark = SparkSession.builder.remote(url).create()  # not pyspark.sql's: it would mark the process for good
        # pyspark retries an unavailable server for ten minutes; a task's retry is the better place to wait.
        from pyspark.sql.connect.client.retries import DefaultPolicy

        spark.client.set_retry_policies([DefaultPolicy(max_retries=4, max_backoff=5000)])
        # Reattachable execution releases each result from a thread that outlives spark.stop() (warnings
        # about a closed session); a job's results are small and read at once.
        spark.client.disable_reattachable_execute()
        if code:
            spark.addArtifacts(code, pyfile=True)  # the same zip again in a shared session: a no-op
    except Exception as exc:
        raise ConnectServerError(f"{_where(url, conn_id)}: no session: {_error_line(exc)}") from None
    return spark


def _error_line(exc: BaseException) -> str:
    from spark_jobs.common import spark_error_line

    return one_line(spark_error_line(exc), 300)


def run_on_session(job: str, spark: Any, table: MemWalTable, options: JobOptions,
                   regions: Sequence[str] | None = None) -> dict[str, Any]:
    """Run one job with its executor work on `spark` (classic or Connect): the job's own `spark_jobs`
    entry point's typed `run(spark, table, options, regions)`."""
    with _collector_off():
        module = importlib.import_module(f"spark_jobs.{job}")
    result = module.run(spark, table, options, list(regions) if regions else None)
    summary = dict(result.to_dict() if hasattr(result, "to_dict") else result)
    summary.setdefault("job", job)
    return summary


def run_job_on_connect(job: str, url: str, table: MemWalTable, options: JobOptions,
                       regions: Sequence[str] | None = None, *, conn_id: str | None = None) -> dict[str, Any]:
    """The job on the Connect session at `url` (this process's client of it, built on first use);
    `spark_session_s` is the time to the session with our code on it. A server that is down or goes away:
    ConnectServerError naming the connection and URL."""
    started = time.monotonic()
    with open_session(url, conn_id=conn_id) as spark:
        session_s = time.monotonic() - started
        summary = _run_guarded(job, url, conn_id, spark, table, options, regions)
    summary.setdefault("spark_connect_url", redact_url(url))
    summary.setdefault("spark_session_s", round(session_s, 3))
    return summary


class ConnectRunner:
    """The `spark_connect` engine's runner for `memwal.engines.dispatch`: the job's driver logic here, its
    executor work on the Spark Connect server at `url` (`conn_id`: the connection named in errors)."""

    def __init__(self, url: str, conn_id: str | None = None) -> None:
        self.url = url
        self.conn_id = conn_id

    def __call__(self, job: str, table: MemWalTable, options: JobOptions,
                 regions: Sequence[str] | None) -> dict[str, Any]:
        return run_job_on_connect(job, self.url, table, options, regions, conn_id=self.conn_id)


def _run_guarded(job: str, url: str, conn_id: str | None, spark: Any, table: MemWalTable, options: JobOptions,
                 regions: Sequence[str] | None) -> dict[str, Any]:
    try:
        return run_on_session(job, spark, table, options, regions)
    except MemWalError as exc:
        if _server_gone(exc):
            raise ConnectServerError(f"{_where(url, conn_id)} failed during memwal {job}: {one_line(exc, 300)}; "
                                     "a retry resumes") from exc
        raise
    except Exception as exc:
        if _server_gone(exc):
            raise ConnectServerError(f"{_where(url, conn_id)} failed during memwal {job}: {_error_line(exc)}; "
                                     "a retry resumes") from exc
        raise


def _session_lost(exc: BaseException) -> bool:
    """Whether the client is no use any more: the server went away, or no longer knows the session."""
    if isinstance(exc, ConnectServerError) or _server_gone(exc):
        return True
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if "SESSION_CLOSED" in str(e) or "INVALID_HANDLE" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _server_gone(exc: BaseException) -> bool:
    """Whether the failure is the server's (gone, unreachable), not the job's (a task error)."""
    import grpc
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException

    gone = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, SparkConnectGrpcException) and e.getGrpcStatusCode() in gone:
            return True
        if isinstance(e, grpc.RpcError) and getattr(e, "code", lambda: None)() in gone:
            return True
        e = e.__cause__ or e.__context__
    return False
