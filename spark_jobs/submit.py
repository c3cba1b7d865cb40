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
(default: this interpreter; a `conf` entry overrides it, e.g. the workers' own python3). The zip is
kept in a directory only this user can write (`code_cache_dir()`) and checked against the code before
it is reused.

Storage options never go on a command line: `run_spark_job` writes them to a 0600 file in a fresh private
directory (removed when spark-submit ends) and passes `--storage-options-json @FILE`; the command builder
puts only non-secret options on argv as `--storage-option KEY=VALUE`. The logged command redacts
secret-looking values, Spark confs included (`redact`).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import memwal
from memwal.errors import MemWalError
from memwal.jobs import JOBS
from memwal.storage import is_secret_option, redact_value

if TYPE_CHECKING:
    from memwal.job_config import JobOptions
    from memwal.table import MemWalTable

__all__ = [
    "JOBS",
    "SparkJobError",
    "SparkSubmitRunner",
    "application_args",
    "code_cache_dir",
    "job_script",
    "package_code",
    "private_workdir",
    "redact",
    "run_spark_job",
    "spark_home",
    "spark_submit_command",
    "spark_submit_env",
    "spark_submit_executable",
    "write_storage_options_file",
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
    `package_code()` goes first in `--py-files`, ahead of `py_files`. `storage_options` go on argv, so a
    secret one is refused: pass it in `storage_options_file` (run_spark_job does)."""
    secret = sorted(k for k in storage_options or {} if is_secret_option(k))
    if secret:
        raise ValueError(f"storage option(s) {', '.join(secret)} would be on spark-submit's command line: pass "
                         "them in storage_options_file= (run_spark_job does)")
    settings = spark_conf_defaults(conf, python)
    cmd = [spark_submit or spark_submit_executable(), "--master", master, "--name", f"memwal-{job}"]
    for key, value in settings.items():
        cmd += ["--conf", f"{key}={value}"]
    py_files = [package_code(), *py_files] if ship_code else list(py_files)
    if py_files:
        cmd += ["--py-files", ",".join(str(p) for p in py_files)]
    return [*cmd, str(job_script(job)), *application_args(
        table, storage_options=storage_options, storage_options_file=storage_options_file, regions=regions,
        extra_args=extra_args)]


def application_args(
    table: str,
    *,
    storage_options: Mapping[str, str] | None = None,
    storage_options_file: str | Path | None = None,
    regions: Sequence[str] | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """A job's arguments after its script on the spark-submit command line (also what the Airflow hook hands
    the provider's SparkSubmitHook): the table, its storage options (secrets only in the file), the regions,
    then the job's options (`JobOptions.argv(job)`). `storage_options` go on argv: give only non-secret ones."""
    from memwal.storage import normalize_uri

    args = [normalize_uri(table)]
    if storage_options_file:
        args += ["--storage-options-json", f"@{storage_options_file}"]
    for key, value in (storage_options or {}).items():
        args += ["--storage-option", f"{key}={value}"]
    for region in regions or ():
        args += ["--region", str(region)]
    return args + [str(a) for a in extra_args]


def redact(cmd: Sequence[str]) -> list[str]:
    """The command with the values of secret-looking `KEY=VALUE` arguments (storage options and Spark confs
    such as spark.hadoop.fs.s3a.secret.key) and of an inline `--storage-options-json` replaced by ***, and
    the credentials of any URL (`scheme://user:pass@host`, e.g. a proxy_url) replaced by *** (`redact_value`)."""
    out: list[str] = []
    for arg in map(str, cmd):
        key, sep, value = arg.partition("=")
        if out and out[-1] == "--storage-options-json" and not arg.startswith("@"):
            arg = "***"
        elif sep and "://" not in key:
            arg = f"{key}={redact_value(key, value)}"
        else:  # no KEY=VALUE: a URL (a Spark master) may carry credentials too
            arg = redact_value("", arg)
        out.append(arg)
    return out


@contextlib.contextmanager
def private_workdir(prefix: str) -> Iterator[Path]:
    """A fresh directory only this user can enter (mkdtemp: 0700), removed with its files afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write_storage_options_file(directory: str | Path, storage_options: Mapping[str, str]) -> Path:
    """The options as a JSON object in a new 0600 file of `directory` (a private_workdir), for a job's
    `--storage-options-json @FILE`: the way secrets reach a Spark job without being on its command line."""
    path = Path(directory) / "storage-options.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(storage_options), f)
    return path


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
    a timeout, or a missing summary. kwargs are those of spark_submit_command; `storage_options` reach the
    job in a private file (write_storage_options_file), never on the command line.
    """
    storage_options = kwargs.pop("storage_options", None)
    if storage_options and kwargs.get("storage_options_file"):
        raise ValueError("give run_spark_job storage_options or storage_options_file, not both")
    with private_workdir(f"memwal-{job}-") as workdir:
        if storage_options:
            kwargs["storage_options_file"] = str(write_storage_options_file(workdir, storage_options))
        return _run_spark_submit(job, table, logger or log, env, timeout, kwargs)


class SparkSubmitRunner:
    """The `spark` engine's runner for `memwal.engines.dispatch` (the `memwal` command's `--spark`): the job
    as one spark-submit application on `master` with the Spark `conf`. A job that ran with some regions
    failed returns its summary (`failure_reason` names them); one that did not run raises MemWalError with
    the job's one-line reason."""

    def __init__(self, master: str = "local[*]", conf: Mapping[str, str] | None = None) -> None:
        self.master = master
        self.conf = dict(conf or {})

    def __call__(self, job: str, table: MemWalTable, options: JobOptions,
                 regions: Sequence[str] | None) -> dict[str, Any]:
        try:
            return run_spark_job(job, table.uri, master=self.master, storage_options=table.storage_options,
                                 regions=regions, extra_args=options.argv(job), conf=self.conf)
        except SparkJobError as exc:
            if exc.summary is not None:
                return exc.summary
            raise MemWalError(exc.reason or str(exc)) from exc


def _run_spark_submit(job: str, table: str, logger: logging.Logger, env: Mapping[str, str] | None,
                      timeout: float | None, kwargs: dict) -> dict:
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


CODE_ZIPS_KEPT = 3  # package_code keeps the newest few zips (other installed versions of the code) ...
CODE_ZIP_MIN_AGE_S = 86400  # ... and any used within a day: a running application's executors still fetch it


def code_cache_dir() -> Path:
    """Where package_code keeps its zips: $XDG_CACHE_HOME/memwal (default ~/.cache/memwal), or
    <tempdir>/memwal-<uid> when the home directory cannot hold it; a directory only this user can write
    (created 0700; an existing one of another owner or writable by others is refused, never used)."""
    try:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memwal"
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # no home directory, or a read-only one
        cache = Path(tempfile.gettempdir()) / f"memwal-{os.geteuid()}"
    return _private_dir(cache)


def _private_dir(path: Path) -> Path:
    """`path`, created 0700 if missing, after checking that it is a directory (not a link) of this user
    that neither its group nor others can write: nobody else can plant or swap a file in it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    problems = [what for bad, what in (
        (not stat.S_ISDIR(st.st_mode), "it is not a directory"),
        (st.st_uid != os.geteuid(), f"it belongs to uid {st.st_uid}, not {os.geteuid()}"),
        (bool(st.st_mode & 0o022), f"its mode {stat.S_IMODE(st.st_mode):o} lets others write in it"),
    ) if bad]
    if problems:
        raise PermissionError(f"{path}: refusing to keep the code zip shipped to Spark executors there: "
                              f"{'; '.join(problems)} (remove it, or pass another directory)")
    return path


def package_code(dest_dir: str | None = None) -> str:
    """A zip of the `memwal` and `spark_jobs` packages for `--py-files`, taken from where they are imported
    from (a wheel in site-packages, or this repository). Content-addressed in a private directory
    (`dest_dir`, default code_cache_dir()); an existing zip is reused only if it holds exactly this code."""
    roots = {"memwal": Path(memwal.__file__).resolve().parent, "spark_jobs": JOBS_DIR}
    files = sorted(
        (f"{name}/{p.relative_to(root).as_posix()}", p.read_bytes())
        for name, root in roots.items()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".pyi")
    )
    digest = hashlib.sha256()
    for arc, data in files:
        digest.update(arc.encode() + b"\0" + data + b"\0")
    directory = _private_dir(Path(dest_dir)) if dest_dir else code_cache_dir()
    out = directory / f"memwal-code-{digest.hexdigest()[:16]}.zip"
    if _zip_holds(out, files):
        os.utime(out)  # in use: pruning keeps it
    else:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f"{out.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as zf:
                for arc, data in files:
                    zf.writestr(arc, data)
            os.replace(tmp, out)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    _prune_code_zips(directory, keep=out)
    return str(out)


def _zip_holds(path: Path, files: list[tuple[str, bytes]]) -> bool:
    """Whether the zip at `path` is a regular file holding exactly `files` (names and bytes)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        with zipfile.ZipFile(path) as zf:
            return zf.namelist() == [arc for arc, _ in files] and all(zf.read(arc) == data for arc, data in files)
    except (OSError, zipfile.BadZipFile, KeyError, RuntimeError, ValueError):
        return False


def _prune_code_zips(directory: Path, keep: Path) -> None:
    """Remove the zips (and `.tmp` files a killed build left) of `directory` that are neither among the
    newest CODE_ZIPS_KEPT nor used within CODE_ZIP_MIN_AGE_S; `keep` (the one just returned) stays."""
    now = time.time()
    entries = []
    for p in directory.glob("memwal-code-*"):
        if p.name.endswith(".zip") or p.name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                entries.append((p.stat().st_mtime, p))
    entries.sort(reverse=True)
    kept = [p for _, p in entries if p.name.endswith(".zip")][:CODE_ZIPS_KEPT]
    for mtime, p in entries:
        if p == keep or p in kept or now - mtime < CODE_ZIP_MIN_AGE_S:
            continue
        p.unlink(missing_ok=True)
