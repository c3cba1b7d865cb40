"""Build and run the spark-submit command of a job (used by the `memwal` CLI and the Airflow operators).

    spark_submit_command("merge", "s3://bucket/table", master="spark://host:7077",
                         storage_options={...}, regions=[...], extra_args=["--max-generations-per-commit", "4"])
    -> [".../spark-submit", "--master", "spark://host:7077", "--name", "memwal-merge",
        "--conf", "spark.pyspark.python=...", ..., "/abs/spark_jobs/merge.py", "s3://bucket/table", ...]

Code on the executors: the jobs import `memwal` and `spark_jobs`, and every command ships both as a zip
with `--py-files` (`package_code()`, built from the installed packages, content-addressed), so a cluster
whose Python has the dependencies (pylance, pyarrow, numpy, obstore, protobuf, mmh3) but not this project
runs the jobs; an installed copy on the workers is shadowed by the shipped one (the same code). The
command pins the driver's and executors' Python with `spark.pyspark.driver.python` / `spark.pyspark.python`
(default: this interpreter; a `conf` entry overrides it, e.g. the workers' own python3).

Storage options go on the command line as `--storage-option KEY=VALUE` (the logged command redacts
secret-looking values); `storage_options_file=` passes them as `--storage-options-json @FILE` instead,
which keeps them out of the process list.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import memwal
from memwal.jobs import JOBS
from memwal.storage import is_secret_option

__all__ = [
    "JOBS",
    "SparkJobError",
    "job_script",
    "package_code",
    "redact",
    "run_spark_job",
    "spark_home",
    "spark_submit_command",
    "spark_submit_env",
    "spark_submit_executable",
]

log = logging.getLogger(__name__)


JOBS_DIR = Path(__file__).resolve().parent


class SparkJobError(RuntimeError):
    """spark-submit failed. `reason` is the job's one-line error, `stderr_tail` its last stderr lines,
    `summary` the JSON summary when the job printed one (some regions failed: exit status 3)."""

    def __init__(self, message: str, *, returncode: int, reason: str | None, stderr_tail: list[str],
                 summary: dict | None = None, command: Sequence[str] = ()):
        super().__init__(message)
        self.returncode = returncode
        self.reason = reason
        self.stderr_tail = stderr_tail
        self.summary = summary
        self.command = list(command)


LOG4J_CONFIG = Path(__file__).resolve().with_name("log4j2.properties")


def job_script(job: str) -> Path:
    """Absolute path of a job's entry point."""
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r} (one of {', '.join(JOBS)})")
    path = JOBS_DIR / f"{job}.py"
    if not path.is_file():
        raise FileNotFoundError(f"job {job!r} has no entry point at {path}")
    return path


def spark_home() -> str:
    """SPARK_HOME if set, else the Spark distribution inside the installed pyspark package."""
    if os.environ.get("SPARK_HOME"):
        return os.environ["SPARK_HOME"]
    import pyspark

    return str(Path(pyspark.__file__).resolve().parent)


def spark_submit_executable() -> str:
    """spark-submit of SPARK_HOME, else the one next to this interpreter, else the one on PATH."""
    candidates = [Path(spark_home()) / "bin" / "spark-submit", Path(sys.executable).parent / "spark-submit"]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("spark-submit")
    if found:
        return found
    raise FileNotFoundError("spark-submit not found (install pyspark or set SPARK_HOME)")


def spark_conf_defaults(conf: Mapping[str, str] | None = None, python: str | None = None) -> dict[str, str]:
    """Every job's Spark configuration: `python` (default: this interpreter) runs the driver and the
    executors' Python workers, our log4j configuration; `conf` entries override these (JVM options add)."""
    python = python or sys.executable
    log4j = f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"
    settings = {"spark.pyspark.python": python, "spark.pyspark.driver.python": python,
                "spark.driver.extraJavaOptions": log4j, "spark.executor.extraJavaOptions": log4j}
    for key, value in (conf or {}).items():  # JVM options add to ours; everything else replaces
        settings[key] = f"{settings[key]} {value}" if key.endswith("extraJavaOptions") and key in settings else value
    return settings


def spark_submit_command(
    job: str,
    table: str,
    *,
    master: str = "local[*]",
    storage_options: Mapping[str, str] | None = None,
    regions: Sequence[str] | None = None,
    extra_args: Sequence[str] = (),
    conf: Mapping[str, str] | None = None,
    python: str | None = None,
    py_files: Sequence[str] = (),
    storage_options_file: str | None = None,
    spark_submit: str | None = None,
    ship_code: bool = True,
) -> list[str]:
    """The exact spark-submit argv of a job. `python` (default: this interpreter) runs the driver and the
    executors' Python workers; `conf` entries override the defaults set here. `ship_code`: the zip of
    `package_code()` goes first in `--py-files`, ahead of `py_files`."""
    from memwal.storage import normalize_uri

    settings = spark_conf_defaults(conf, python)
    cmd = [spark_submit or spark_submit_executable(), "--master", master, "--name", f"memwal-{job}"]
    for key, value in settings.items():
        cmd += ["--conf", f"{key}={value}"]
    py_files = [package_code(), *py_files] if ship_code else list(py_files)
    if py_files:
        cmd += ["--py-files", ",".join(str(p) for p in py_files)]
    cmd += [str(job_script(job)), normalize_uri(table)]
    if storage_options_file:
        cmd += ["--storage-options-json", f"@{storage_options_file}"]
    for key, value in (storage_options or {}).items():
        cmd += ["--storage-option", f"{key}={value}"]
    for region in regions or ():
        cmd += ["--region", str(region)]
    return cmd + [str(a) for a in extra_args]


def redact(cmd: Sequence[str]) -> list[str]:
    """The command with secret-looking storage option values replaced by ***."""
    out = []
    for arg in cmd:
        key, sep, _ = arg.partition("=")
        if sep and is_secret_option(key) and not key.startswith("spark."):
            arg = f"{key}=***"
        out.append(arg)
    return out


def spark_submit_env(python: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment to run a spark_submit_command with (os.environ or `env`, plus what spark-submit needs)."""
    out = dict(os.environ if env is None else env)
    python = python or sys.executable
    # bin/spark-submit of the pip package locates SPARK_HOME with `python3` unless these are set.
    out.setdefault("PYSPARK_PYTHON", python)
    out.setdefault("PYSPARK_DRIVER_PYTHON", python)
    out.setdefault("SPARK_HOME", spark_home())
    return out


def run_spark_job(
    job: str,
    table: str,
    *,
    logger: logging.Logger | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    **kwargs,
) -> dict:
    """Run a job with spark-submit; stderr lines go to `logger` as they arrive. Returns the JSON summary.

    Raises SparkJobError (with the job's one-line reason and the last stderr lines) on a non-zero exit,
    a timeout, or a missing summary. kwargs are those of spark_submit_command.
    """
    logger = logger or log
    cmd = spark_submit_command(job, table, **kwargs)
    logger.info("running %s", " ".join(redact(cmd)))
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        errors="replace", env=spark_submit_env(kwargs.get("python"), env), start_new_session=True,
    )
    tail: collections.deque[str] = collections.deque(maxlen=40)
    reason: list[str] = []
    out_lines: list[str] = []
    marker = f"memwal-{job}: error: "

    def pump_stderr() -> None:
        for line in proc.stderr:
            line = line.rstrip("\n")
            tail.append(line)
            if line.startswith(marker):
                reason.append(line[len(marker):])
            logger.info("%s", line)

    def pump_stdout() -> None:
        out_lines.extend(proc.stdout)

    pumps = [threading.Thread(target=f, name=f"memwal-{job}-{f.__name__}", daemon=True)
             for f in (pump_stderr, pump_stdout)]
    for t in pumps:
        t.start()
    try:
        proc.wait(timeout=timeout)
    except BaseException as exc:
        _kill_group(proc)
        if isinstance(exc, subprocess.TimeoutExpired):
            raise SparkJobError(f"memwal-{job} timed out after {timeout}s", returncode=proc.returncode,
                                reason=None, stderr_tail=list(tail), command=redact(cmd)) from None
        raise
    for t in pumps:
        t.join()
    stdout = "".join(out_lines)
    summary = _last_json_line(stdout)
    if proc.returncode != 0:
        why = reason[-1] if reason else next((ln for ln in reversed(tail) if ln.strip()), "no output")
        raise SparkJobError(
            f"memwal-{job} failed (exit {proc.returncode}): {why}", returncode=proc.returncode,
            reason=reason[-1] if reason else None, stderr_tail=list(tail), summary=summary, command=redact(cmd),
        )
    if summary is None:
        raise SparkJobError(f"memwal-{job} printed no JSON summary on stdout", returncode=0, reason=None,
                            stderr_tail=list(tail) + stdout.splitlines()[-5:], command=redact(cmd))
    return summary


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill spark-submit and its Python driver (their own process group, started by run_spark_job)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _last_json_line(stdout: str) -> dict | None:
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def package_code(dest_dir: str | None = None) -> str:
    """A zip of the `memwal` and `spark_jobs` packages for `--py-files` (content-addressed, reused), taken
    from where they are imported from: a wheel in site-packages, or this repository (editable install)."""
    roots = {"memwal": Path(memwal.__file__).resolve().parent, "spark_jobs": JOBS_DIR}
    files = sorted(
        (f"{name}/{p.relative_to(root).as_posix()}", p)
        for name, root in roots.items()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".pyi")
    )
    digest = hashlib.sha256()
    for arc, path in files:
        digest.update(arc.encode() + b"\0" + path.read_bytes() + b"\0")
    out = Path(dest_dir or tempfile.gettempdir()) / f"memwal-code-{digest.hexdigest()[:16]}.zip"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
            for arc, path in files:
                zf.write(path, arc)
        os.replace(tmp, out)
    return str(out)
