"""A batch of tables' due jobs (`memwal.fleet_batch.TableDue`s) as one Spark application: through spark-submit
(`run_fleet_submit`: `spark_jobs/fleet.py` on a batch file) or on a Spark Connect session from this process
(`run_fleet_connect`). Both return the batch's summary (`memwal.fleet_batch.batch_summary`: `tables[]`, one
result per table, plus the engine's keys).

Storage options, one set for the batch, reach the spark-submit driver as every job's do: a 0600 file in a fresh
0700 directory (`spark_jobs.submit.write_storage_options_file`), named by `--storage-options-json @FILE`,
removed when spark-submit ends; the batch file beside it holds URIs, jobs and options only.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memwal.errors import MemWalError
from memwal.fleet_batch import TableDue, batch_to_json
from spark_jobs import submit

__all__ = ["FLEET_SCRIPT", "fleet_application_args", "fleet_submit_command", "run_fleet_connect", "run_fleet_submit",
           "write_batch_file"]

log = logging.getLogger(__name__)

FLEET_SCRIPT = Path(__file__).resolve().with_name("fleet.py")


def write_batch_file(directory: str | Path, entries: Sequence[TableDue]) -> Path:
    """The batch as `spark_jobs/fleet.py` reads it, in a new 0600 file of `directory` (a private_workdir)."""
    path = Path(directory) / "batch.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(batch_to_json(entries))
    return path


def fleet_application_args(batch_file: str | Path, storage_options_file: str | Path | None = None) -> list[str]:
    """The fleet entry point's arguments after its script (also what the Airflow hook gives SparkSubmitHook)."""
    args = [str(batch_file)]
    if storage_options_file:
        args += ["--storage-options-json", f"@{storage_options_file}"]
    return args


def fleet_submit_command(batch_file: str | Path, *, master: str = "local[*]", conf: Mapping[str, str] | None = None,
                         storage_options_file: str | Path | None = None, python: str | None = None,
                         ship_code: bool = True) -> list[str]:
    """The spark-submit argv of one batch: the jobs' Spark configuration and shipped code
    (`spark_jobs.submit.spark_conf_defaults`, `package_code`), then fleet.py and its arguments."""
    cmd = [submit.spark_submit_executable(), "--master", master, "--name", "memwal-fleet"]
    for key, value in submit.spark_conf_defaults(conf, python).items():
        cmd += ["--conf", f"{key}={value}"]
    if ship_code:
        cmd += ["--py-files", submit.package_code()]
    return [*cmd, str(FLEET_SCRIPT), *fleet_application_args(batch_file, storage_options_file)]


def run_fleet_submit(entries: Sequence[TableDue], *, master: str = "local[*]", conf: Mapping[str, str] | None = None,
                     storage_options: Mapping[str, str] | None = None, timeout: float | None = None,
                     logger: logging.Logger | None = None) -> dict[str, Any]:
    """The batch as one spark-submit application; its summary (`job: fleet`, `tables[]`: one result per table,
    the Spark keys). A table's failure is in its result; MemWalError (the one-line reason) when the application
    reported no summary (a bad batch file, Spark failed)."""
    logger = logger or log
    with submit.private_workdir("memwal-fleet-") as workdir:
        batch_file = write_batch_file(workdir, entries)
        opts_file = submit.write_storage_options_file(workdir, storage_options) if storage_options else None
        cmd = fleet_submit_command(batch_file, master=master, conf=conf, storage_options_file=opts_file)
        logger.info("running %s", " ".join(submit.redact(cmd)))
        code, stdout, tail = _run(cmd, logger, timeout)
    summary = _last_json(stdout)
    if summary is None or summary.get("job") != "fleet":
        why = next((ln.split("error: ", 1)[1] for ln in reversed(tail) if ln.startswith("memwal-fleet: error: ")),
                   next((ln for ln in reversed(tail) if ln.strip()), "no output"))
        raise MemWalError(f"memwal-fleet ({len(entries)} table(s), master {master}) failed (exit {code}): {why}")
    return summary


def _run(cmd: list[str], logger: logging.Logger, timeout: float | None) -> tuple[int, str, list[str]]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, errors="replace", env=submit.spark_submit_env(), start_new_session=True)
    tail: collections.deque[str] = collections.deque(maxlen=40)
    out: list[str] = []

    def pump_stderr() -> None:
        for line in proc.stderr:
            tail.append(line.rstrip("\n"))
            logger.info("%s", line.rstrip("\n"))

    pumps = [threading.Thread(target=pump_stderr, daemon=True),
             threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)]
    for t in pumps:
        t.start()
    try:
        proc.wait(timeout=timeout)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        raise
    for t in pumps:
        t.join()
    return proc.returncode, "".join(out), list(tail)


def _last_json(stdout: str) -> dict | None:
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    try:
        value = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def run_fleet_connect(entries: Sequence[TableDue], url: str, *, storage_options: Mapping[str, str] | None = None,
                      conn_id: str | None = None) -> dict[str, Any]:
    """The batch on one Spark Connect session at `url` (the driver logic in this process): its summary, one
    result per table. A server that is down: `spark_jobs.connect.ConnectServerError`, nothing ran."""
    import time

    from memwal.fleet_batch import batch_summary
    from spark_jobs import fleet
    from spark_jobs.connect import open_session, redact_url

    started = time.monotonic()
    with open_session(url, conn_id=conn_id) as spark:
        session_s = time.monotonic() - started
        results = fleet.run(spark, entries, storage_options)
    return {**batch_summary(results, time.monotonic() - started), "spark_connect_url": redact_url(url),
            "spark_session_s": round(session_s, 3)}
