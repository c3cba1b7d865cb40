"""What every Spark job shares: arguments, the SparkSession, logging and the one-line JSON summary.

Contract with the callers (`spark_jobs.submit`, the `memwal` CLI, the Airflow operators):
- stdout carries exactly one line, the JSON summary (`json.dumps(summary, default=str)`), written last;
  everything else (our logs, library warnings, native code, a JVM we launch) goes to stderr;
- exit status 0: done; 1: the job failed (no summary) and the last line we write to stderr is
  `memwal-<job>: error: <reason>`; 2: bad input, one line on stderr naming the parameter and the value
  (a bad argument: before the table is opened; a missing table, an unknown region or index: before the
  Spark session starts); 3: the job ran but some region failed: the summary is printed first, then the
  one-line reason on stderr.

Pitfall handled here: spark-submit starts the Python driver with its stderr merged into its stdout
(PythonRunner uses `redirectErrorStream(true)`), so every log line would land on stdout. When we detect
that (stdout and stderr are the same pipe and spark-submit is our parent), stderr is re-pointed at
spark-submit's own stderr (`/proc/<ppid>/fd/2`, Linux, when that is a pipe, a terminal or a file opened
for append). Elsewhere the streams stay merged and the summary is still the last stdout line.

Result file (for callers that cannot read the driver's stdout apart from its logs, e.g. Airflow's
SparkSubmitHook, which merges both streams into its log): when `MEMWAL_RESULT_FILE` is set in the
driver's environment, the job also writes `{"exit": N, "summary": {...} or null, "error": "one line" or
null}` there (client deploy mode: the driver runs where the caller does). stdout is unchanged.
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
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from memwal import errors, jobs

if TYPE_CHECKING:
    from memwal.job_config import JobOptions
    from memwal.table import MemWalTable

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_USAGE",
    "LOG_LEVELS",
    "SPARK_LOG_LEVELS",
    "SparkJob",
    "Streams",
    "build_spark",
    "job_parser",
    "one_line",
    "parse_args",
    "run_job",
    "spark_error_line",
    "start_logging",
    "stop_spark",
    "write_result",
]

log = logging.getLogger("spark_jobs")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PARTIAL = jobs.EXIT_OK, jobs.EXIT_FAILED, jobs.EXIT_USAGE, jobs.EXIT_PARTIAL
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
SPARK_LOG_LEVELS = ("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")


# --- arguments ----------------------------------------------------------------------------------------


JobArgumentParser = jobs.OneLineArgumentParser  # a usage error is one line on stderr (exit 2)


def job_parser(job: str, description: str | None = None) -> JobArgumentParser:
    """The job's arguments (memwal.jobs: the same as the `memwal` command's) plus the log levels."""
    p = JobArgumentParser(prog=f"memwal-{job}", description=description)
    jobs.add_common_arguments(p, job)
    jobs.add_job_arguments(p, job)
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS,
                   help="log level of the job's own progress messages (stderr)")
    p.add_argument("--spark-log-level", default="WARN", type=str.upper, choices=SPARK_LOG_LEVELS,
                   help="log level of Spark itself once the session is up")
    return p


def parse_args(job: str, argv: list[str] | None = None,
               parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The job's command line (`parser`, default `job_parser(job)`) plus what the library takes:
    `args.options` (`memwal.job_config.JobOptions`), `args.storage_options` (dict or None) and
    `args.regions` (list or None). A bad one exits 2 with one line."""
    parser = parser or job_parser(job)
    args = parser.parse_args(argv)
    args.regions = list(dict.fromkeys(args.region or [])) or None
    try:
        args.options = jobs.job_options(job, args)
        jobs.validate_job_options(job, args.options, args.regions)
        args.storage_options = jobs.storage_options_of(args)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        parser.error(errors.one_line(exc))
    return args


# --- SparkSession -------------------------------------------------------------------------------------


def local_cores(master: str) -> int:
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
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # set by spark-submit's PythonRunner
    if not under_spark_submit:
        # Python workers must run this interpreter (with pyarrow, lance, memwal), not whatever python3 is.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    launch = None
    if not under_spark_submit and conf and SparkContext._gateway is None:
        # JVM options (spark.driver.extraJavaOptions, spark.driver.memory) only act when the JVM starts.
        launch = SparkConf(loadDefaults=False).setAll(list(conf.items()))
    SparkContext._ensure_initialized(conf=launch)  # joins spark-submit's JVM, or launches one
    given = SparkConf()  # the spark.* properties spark-submit (or the pyspark launcher) set
    # pyspark's own launcher always sets spark.master (local[*]); only spark-submit's is a choice to honour.
    submitted = given.get("spark.master", None) if under_spark_submit else None
    master_url = submitted or master or given.get("spark.master", None) or "local[*]"
    # Always: a progress bar is not a log line (the pyspark launcher turns it on for its own JVM).
    forced = {"spark.app.name": f"memwal-{job}", "spark.ui.showConsoleProgress": "false"}
    settings: dict[str, str] = {}
    if master_url.startswith("local"):
        settings.update({
            "spark.sql.shuffle.partitions": str(2 * local_cores(master_url)),
            "spark.ui.enabled": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        })
    builder = SparkSession.builder.master(master_url)
    for key, value in settings.items():
        if not given.contains(key):
            builder = builder.config(key, value)
    for key, value in {**forced, **(conf or {})}.items():
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
        if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            return os.open(path, os.O_WRONLY)
        if stat.S_ISREG(mode) and _opened_for_append(os.getppid(), 2):
            return os.open(path, os.O_WRONLY | os.O_APPEND)
        return None  # a file not opened for append: a second open would overwrite the JVM's own lines
    except OSError:
        return None


def _opened_for_append(pid: int, fd: int) -> bool:
    with open(f"/proc/{pid}/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("flags:"):
                return bool(int(line.split()[1], 8) & os.O_APPEND)
    return False


class Streams:
    """While a job runs, fd 1 and sys.stdout point at stderr; `emit` writes the one stdout line."""

    def __enter__(self) -> Streams:
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


def start_logging(level: str) -> logging.Handler:
    """Log lines of `level` and up (and Python warnings) to stderr; the handler, to remove when the job ends."""
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
    return errors.one_line(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, 1000)


_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit): .+")


def spark_error_line(exc: BaseException) -> str:
    """The root cause of a failed Spark action in one line: the executor's Python exception if there is
    one (a PythonException carries the whole worker traceback), else the first line."""
    lines = [ln.strip() for ln in str(exc).splitlines()]
    found = [ln for ln in lines if _EXC_LINE.match(ln) and not ln.startswith(("org.apache.spark", "py4j"))]
    if found:
        return found[-1]
    return next((ln for ln in lines if ln), type(exc).__name__)


RESULT_FILE_ENV = "MEMWAL_RESULT_FILE"


def write_result(code: int, summary: dict | None, error: str | None) -> None:
    """The job's outcome as JSON at $MEMWAL_RESULT_FILE (if set); see the module docstring."""
    path = os.environ.get(RESULT_FILE_ENV)
    if not path:
        return
    try:
        with open(path, "w") as f:
            f.write(json.dumps({"exit": code, "summary": summary, "error": error}, default=str))
    except OSError as exc:
        log.warning("could not write the result file %s: %s", path, exc)


# A job's entry: run(spark, table, options, regions) -> its summary (a dict, or an object with `.to_dict()`).
SparkJob = Callable[[Any, "MemWalTable", "JobOptions", "Sequence[str] | None"], Any]


def run_job(job: str, run: SparkJob, argv: list[str] | None = None, description: str | None = None) -> int:
    """A job's `main`: parse argv, open the table, build the session, `run(spark, table, options, regions)`
    -> summary (dict or `.to_dict()`), print it; the exit code."""
    code, summary, error = _run_job(job, run, argv, description)
    write_result(code, summary, error)
    return code


def _run_job(job: str, run: SparkJob, argv: list[str] | None,
             description: str | None) -> tuple[int, dict | None, str | None]:
    from memwal.table import MemWalTable

    prefix = f"memwal-{job}"
    parser = job_parser(job, description)
    with Streams() as streams:
        try:
            args = parse_args(job, argv, parser)
        except SystemExit as exc:  # --help, or a usage error already written as one line
            code = exc.code if isinstance(exc.code, int) else EXIT_USAGE
            line = getattr(parser, "error_line", None) or f"bad arguments to {prefix} (exit {code})"
            return code, None, None if code == EXIT_OK else line
        handler = start_logging(args.log_level)
        spark, owned = None, False
        started = time.monotonic()
        try:
            # Bad input (a missing table, an unknown region or index) exits 2 before a Spark session starts.
            # One handle per job run: what the input check before the Spark session opened is what the job uses.
            table = MemWalTable(args.table, args.storage_options)
            jobs.check_job_input(job, table, args.options, args.regions)
            log.info("%s: starting on %s", prefix, args.table)
            spark, owned = build_spark(job, spark_log_level=args.spark_log_level)
            session_s = time.monotonic() - started
            sc = spark.sparkContext
            log.info("%s: Spark %s, master %s, application %s", prefix, spark.version, sc.master, sc.applicationId)
            result = run(spark, table, args.options, args.regions)
            summary = dict(result.to_dict() if hasattr(result, "to_dict") else result)
            summary.setdefault("job", job)
            summary.setdefault("spark_master", sc.master)
            summary.setdefault("spark_application_id", sc.applicationId)
            summary.setdefault("spark_session_s", round(session_s, 3))  # from the driver's start to a session
        except errors.BadInputError as exc:
            stop_spark(spark, owned)
            reason = errors.one_line(exc, 1000)
            print(f"{prefix}: error: {reason}", file=sys.stderr, flush=True)
            logging.getLogger().removeHandler(handler)
            return EXIT_USAGE, None, reason
        except Exception as exc:
            log.debug("%s failed", prefix, exc_info=True)
            stop_spark(spark, owned)
            print(f"{prefix}: error: {one_line(exc)}", file=sys.stderr, flush=True)
            logging.getLogger().removeHandler(handler)
            return EXIT_FAILED, None, one_line(exc)
        stop_spark(spark, owned)
        reason = jobs.failure_reason(summary)
        log.info("%s: done in %.1fs", prefix, time.monotonic() - started)
        logging.getLogger().removeHandler(handler)
        streams.emit(json.dumps(summary, default=str))
        if reason:
            print(f"{prefix}: error: {reason}", file=sys.stderr, flush=True)
            return EXIT_PARTIAL, summary, reason
        return EXIT_OK, summary, None


def stop_spark(spark: Any, owned: bool) -> None:
    """Stop the session if this job created it (`owned`); a failure to stop is a warning, not the job's."""
    if spark is None or not owned:
        return
    try:
        spark.stop()
    except Exception as exc:  # the job's outcome is already decided
        log.warning("stopping Spark failed: %s", exc)


def set_job_description(spark: Any, text: str | None) -> None:
    """Name the next Spark jobs in the Spark UI (a classic session only: Spark Connect has no SparkContext,
    and the description is only cosmetic)."""
    try:
        spark.sparkContext.setJobDescription(text)
    except Exception:
        pass
