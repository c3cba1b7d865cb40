"""What every Spark job shares: arguments, the SparkSession, logging and the one-line JSON summary.

Contract with the callers (`spark_jobs.submit`, the `memwal` CLI, the Airflow operators):
- stdout carries exactly one line, the JSON summary (`json.dumps(summary, default=str)`), written last;
  everything else (our logs, library warnings, native code, a JVM we launch) goes to stderr;
- exit status 0: done; 1: the job failed (no summary) and the last line we write to stderr is
  `memwal-<job>: error: <reason>`; 2: bad arguments (one line on stderr); 3: the job ran but some region
  failed: the summary is printed first, then the one-line reason on stderr.

Pitfall handled here: spark-submit starts the Python driver with its stderr merged into its stdout
(PythonRunner uses `redirectErrorStream(true)`), so every log line would land on stdout. When we detect
that (stdout and stderr are the same pipe and spark-submit is our parent), stderr is re-pointed at
spark-submit's own stderr (`/proc/<ppid>/fd/2`, Linux, when that is a pipe or a terminal). Elsewhere the
streams stay merged and the summary is still the last stdout line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import stat
import sys
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_USAGE",
    "build_spark",
    "byte_size",
    "job_parser",
    "one_line",
    "positive_int",
    "run_job",
]

log = logging.getLogger("spark_jobs")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_SPARK_LOG_LEVELS = ("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")


# --- arguments ----------------------------------------------------------------------------------------


class JobArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), not the usage block."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def region_id(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"region id {text!r} is not a UUID") from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def byte_size(text: str) -> int:
    """Bytes from `536870912`, `512MiB`, `512m`, `1g`, `1GB` (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 536870912, 512MiB, 1g)")
    value = int(m.group(1)) * 1024 ** "_kmgt".index(m.group(2).lower() or "_")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not >= 1 byte")
    return value


def job_parser(job: str, description: str | None = None) -> JobArgumentParser:
    """The options every job takes; the job adds its own."""
    p = JobArgumentParser(prog=f"memwal-{job}", description=description)
    p.add_argument("table", help="table URI: a path, file://... or s3://bucket/prefix")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a storage option for Lance and the object store (repeatable)")
    p.add_argument("--storage-options-json", metavar="JSON",
                   help="storage options as a JSON object, or @FILE to read it from a file (keeps secrets "
                        "off the command line); --storage-option entries override it")
    p.add_argument("--region", action="append", type=region_id, default=[], metavar="UUID",
                   help="only this region (repeatable; default: every region)")
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=_LOG_LEVELS,
                   help="log level of the job's own progress messages (stderr)")
    p.add_argument("--spark-log-level", default="WARN", type=str.upper, choices=_SPARK_LOG_LEVELS,
                   help="log level of Spark itself once the session is up")
    return p


def _storage_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str] | None:
    options: dict[str, str] = {}
    if args.storage_options_json:
        text = args.storage_options_json
        try:
            if text.startswith("@"):
                text = Path(text[1:]).read_text()
            data = json.loads(text)
        except (OSError, ValueError) as exc:
            parser.error(f"--storage-options-json: {exc}")
        if not isinstance(data, dict):
            parser.error("--storage-options-json must be a JSON object")
        for key, value in data.items():
            options[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    for item in args.storage_option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--storage-option {item!r} is not KEY=VALUE")
        options[key.strip()] = value
    return options or None


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """parse_args plus `args.storage_options` (dict or None) and `args.regions` (list or None)."""
    args = parser.parse_args(argv)
    args.storage_options = _storage_options(parser, args)
    args.regions = list(dict.fromkeys(args.region)) or None
    return args


# --- SparkSession -------------------------------------------------------------------------------------


def _local_cores(master: str) -> int:
    """Cores of a local master: local -> 1, local[N] / local[N,F] -> N, local[*] and others -> all."""
    if master == "local":
        return 1
    m = re.match(r"^local\[(\d+)(?:,\s*\d+)?\]$", master)
    return int(m.group(1)) if m else os.cpu_count() or 1


def build_spark(job: str, *, master: str | None = None, conf: dict[str, str] | None = None,
                spark_log_level: str = "WARN") -> tuple[Any, bool]:
    """(SparkSession, created). Reuses an active session (created=False: not ours to stop).

    The master from spark-submit (`--master`, spark-defaults.conf) wins; otherwise `master`, otherwise
    `local[*]`. In local mode the defaults are small: `spark.sql.shuffle.partitions` = 2 x cores, no web
    UI, the driver on 127.0.0.1. Anything given with `--conf` (or in `conf`) is kept.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    SparkContext._ensure_initialized()  # joins spark-submit's JVM, or launches one
    given = SparkConf()  # the spark.* properties spark-submit set
    master_url = given.get("spark.master", None) or master or "local[*]"
    settings = {"spark.app.name": f"memwal-{job}", "spark.ui.showConsoleProgress": "false"}
    if master_url.startswith("local"):
        settings.update({
            "spark.sql.shuffle.partitions": str(2 * _local_cores(master_url)),
            "spark.ui.enabled": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        })
    builder = SparkSession.builder.master(master_url)
    for key, value in settings.items():
        if key == "spark.app.name" or not given.contains(key):
            builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(spark_log_level)
    return spark, True


# --- streams and logging ------------------------------------------------------------------------------


def _spark_submit_stderr() -> int | None:
    """A fd on spark-submit's own stderr when spark-submit merged ours into stdout (see module doc)."""
    if not sys.platform.startswith("linux") or "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    try:
        out, err = os.fstat(1), os.fstat(2)
        if (out.st_dev, out.st_ino) != (err.st_dev, err.st_ino) or not stat.S_ISFIFO(out.st_mode):
            return None
        path = f"/proc/{os.getppid()}/fd/2"
        mode = os.stat(path).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            return None  # a regular file: a second open would write over the JVM's own lines
        return os.open(path, os.O_WRONLY)
    except OSError:
        return None


class _Streams:
    """While a job runs, fd 1 and sys.stdout point at stderr; `emit` writes the one stdout line."""

    def __enter__(self) -> _Streams:
        sys.stdout.flush()
        sys.stderr.flush()
        self._out = os.dup(1)
        self._err = os.dup(2)
        target = _spark_submit_stderr()
        if target is not None:
            os.dup2(target, 2)
            os.close(target)
        os.dup2(2, 1)
        self._stdout = sys.stdout
        sys.stdout = sys.stderr
        return self

    def emit(self, line: str) -> None:
        sys.stderr.flush()
        data = (line.rstrip("\n") + "\n").encode()
        while data:
            data = data[os.write(self._out, data):]

    def __exit__(self, *exc_info) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout = self._stdout
        os.dup2(self._out, 1)
        os.dup2(self._err, 2)
        os.close(self._out)
        os.close(self._err)


def _start_logging(level: str) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.captureWarnings(True)
    return handler


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message`, at most 1000 characters."""
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= 1000 else text[:997] + "..."


def _failed_regions_reason(summary: dict) -> str | None:
    failed = summary.get("failed_regions") or []
    if not failed:
        return None
    errors = {r.get("region_id"): r.get("error") for r in summary.get("regions", []) if isinstance(r, dict)}
    parts = [f"{rid}: {' '.join(str(errors.get(rid) or 'failed').split())}" for rid in failed]
    total = len(summary.get("regions", [])) or len(failed)
    return f"{len(failed)} of {total} region(s) failed: " + "; ".join(parts)


def run_job(
    job: str,
    parser: argparse.ArgumentParser,
    run: Callable[[Any, argparse.Namespace], Any],
    argv: list[str] | None = None,
    *,
    validate: Callable[[argparse.ArgumentParser, argparse.Namespace], None] | None = None,
) -> int:
    """Parse, build the session, `run(spark, args)` -> summary (dict or `.to_dict()`), print it; exit code."""
    prefix = f"memwal-{job}"
    with _Streams() as streams:
        try:
            args = parse_args(parser, argv)
            if validate is not None:
                validate(parser, args)
        except SystemExit as exc:  # --help, or a usage error already written as one line
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        handler = _start_logging(args.log_level)
        spark, owned = None, False
        started = time.monotonic()
        try:
            log.info("%s: starting on %s", prefix, args.table)
            spark, owned = build_spark(job, spark_log_level=args.spark_log_level)
            sc = spark.sparkContext
            log.info("%s: Spark %s, master %s, application %s", prefix, spark.version, sc.master, sc.applicationId)
            result = run(spark, args)
            summary = dict(result.to_dict() if hasattr(result, "to_dict") else result)
            summary.setdefault("job", job)
            summary.setdefault("spark_master", sc.master)
            summary.setdefault("spark_application_id", sc.applicationId)
        except Exception as exc:
            log.debug("%s failed", prefix, exc_info=True)
            _stop(spark, owned)
            print(f"{prefix}: error: {one_line(exc)}", file=sys.stderr, flush=True)
            logging.getLogger().removeHandler(handler)
            return EXIT_FAILED
        _stop(spark, owned)
        reason = _failed_regions_reason(summary)
        log.info("%s: done in %.1fs", prefix, time.monotonic() - started)
        logging.getLogger().removeHandler(handler)
        streams.emit(json.dumps(summary, default=str))
        if reason:
            print(f"{prefix}: error: {reason}", file=sys.stderr, flush=True)
            return EXIT_PARTIAL
        return EXIT_OK


def _stop(spark: Any, owned: bool) -> None:
    if spark is None or not owned:
        return
    try:
        spark.stop()
    except Exception as exc:  # the job's outcome is already decided
        log.warning("stopping Spark failed: %s", exc)
