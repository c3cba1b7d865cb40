"""A real local Airflow 3 (api-server, scheduler, dag-processor, triggerer; LocalExecutor) for tests and demos.

    with LocalAirflow(tables_file="demo/tables.yaml") as af:      # or: python scripts/local_airflow.py
        run_id = af.trigger_dag("memwal_merge", conf={"table": "demo"})
        assert af.wait_for_run("memwal_merge", run_id) == "success"

What `start()` does:
- makes an AIRFLOW_HOME (a temporary directory unless given); all configuration goes through `AIRFLOW__...`
  environment variables of the child processes, connections through `AIRFLOW_CONN_...` (never argv);
- metadata on PostgreSQL (a fresh database `airflow_local_<pid>_<hex>` on 127.0.0.1:5432, dropped by
  `stop()`, or by the next start once its launcher's pid is gone) when one answers, else SQLite in
  AIRFLOW_HOME (logged, and `self.backend` says which);
- `airflow db migrate`, the Simple auth manager with an `admin` (Admin) and a `viewer` (Viewer) user whose
  random passwords are written to the passwords file Airflow reads (mode 0600);
- the repository's `dags/` and `plugins/`, `MEMWAL_TABLES_FILE` when a tables file is given;
- api-server, scheduler, dag-processor and triggerer started together, each in its own process group,
  logs in AIRFLOW_HOME/logs/<name>.log; waits until /api/v2/monitor/health reports every component healthy.

`stop()` terminates every process it started, including grandchildren that left the process group (task
runners, spark-submit): every child carries a marker in its environment and stop() finds them in /proc.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/, when imported from elsewhere
from ports import free_port

__all__ = ["COMPONENTS", "AirflowError", "LocalAirflow", "postgres_available"]

log = logging.getLogger("local_airflow")

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
TERMINAL_RUN_STATES = ("success", "failed")
PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"
PG_DB_PREFIX = "airflow_local_"  # + <pid of the launcher>_<instance>: one fresh database per start
DEFAULT_POOLS = {"memwal_spark": 4}  # the pool the MemWAL DAGs bound Spark applications with
MARKER = "LOCAL_AIRFLOW_INSTANCE"  # environment marker of every process started by one LocalAirflow


class AirflowError(RuntimeError):
    """The local Airflow did not start, or a REST call failed; the message names the call and the log to read."""


def postgres_available(host: str = PG_HOST, port: int = PG_PORT, user: str = PG_USER) -> bool:
    """True when a PostgreSQL server accepts a connection from `user` (trust auth) at host:port."""
    try:
        import psycopg2
    except ImportError:
        return False
    try:
        psycopg2.connect(host=host, port=port, user=user, dbname="postgres", connect_timeout=3).close()
        return True
    except psycopg2.Error:
        return False


def _pg_admin(sql: str) -> None:
    import psycopg2

    conn = psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", connect_timeout=5)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def _drop_orphaned_databases() -> None:
    """Drop the fresh databases of launchers that died without stop() (named after their pid, now gone)."""
    import psycopg2

    conn = psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (PG_DB_PREFIX + "%",))
            names = [r[0] for r in cur.fetchall()]
    finally:
        conn.close()
    for name in names:
        match = re.fullmatch(rf"{PG_DB_PREFIX}(\d+)_[0-9a-f]{{12}}", name)
        pid = match.group(1) if match else None
        if pid and not os.path.exists(f"/proc/{pid}"):
            log.info("dropping database %s of a launcher (pid %s) that is gone", name, pid)
            try:
                _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except Exception as exc:  # another launcher dropped it first, or it is in use: leave it
                log.warning("could not drop orphaned database %s: %s", name, exc)


def _airflow_bin() -> str:
    """The `airflow` entry point of this interpreter's environment."""
    candidate = Path(sys.executable).with_name("airflow")
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("airflow")
    if not found:
        raise AirflowError("the `airflow` command is not installed next to this Python (run `make setup`)")
    return found


@dataclass
class LocalAirflow:
    """One local Airflow deployment: configuration, child processes and a REST API v2 client.

    database: "auto" (PostgreSQL when it answers, else SQLite), "postgres" or "sqlite".
    connections: conn_id -> Airflow connection (a URI or a dict in Airflow's JSON form), passed as
        `AIRFLOW_CONN_<ID>` environment variables so secrets never appear on a command line.
    env: extra environment of every Airflow process (e.g. MEMWAL_LOCK_LEASE_S for tests).
    statsd: (host, port) to send Airflow's StatsD metrics to, or None.
    pools: Airflow pools created once healthy (name -> slots); by default the MemWAL DAGs' `memwal_spark`.
    reparse_interval: seconds before an unchanged DAG file is parsed again (the tests' deployments, whose files
        never change, wait 300 s: parsing is most of an idle deployment's CPU).
    """

    home: str | None = None
    tables_file: str | None = None
    dags_folder: str = str(REPO / "dags")
    plugins_folder: str = str(REPO / "plugins")
    database: str = "auto"
    port: int | None = None
    connections: Mapping[str, str | Mapping[str, Any]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    statsd: tuple[str, int] | None = None
    pools: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_POOLS))
    parallelism: int = 4
    paused_at_creation: bool = True
    start_timeout: float = 240.0
    reparse_interval: int = 30  # Airflow's default

    def __post_init__(self) -> None:
        self.instance = uuid.uuid4().hex[:12]
        self.passwords = {"admin": secrets.token_urlsafe(12), "viewer": secrets.token_urlsafe(12)}
        self.roles = {"admin": "admin", "viewer": "viewer"}
        self.procs: dict[str, subprocess.Popen] = {}
        self._log_files: list[Any] = []
        self._pg_db: str | None = None
        self._own_home = False
        self._tokens: dict[str, str] = {}
        self._client: httpx.Client | None = None
        self.backend: str | None = None  # "postgresql" or "sqlite" once started

    # -- configuration ------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def logs_dir(self) -> Path:
        return Path(self.home) / "logs"

    def _choose_database(self) -> str:
        if self.database not in ("auto", "postgres", "sqlite"):
            raise ValueError(f"database must be auto, postgres or sqlite, not {self.database!r}")
        if self.database == "sqlite":
            self.backend = "sqlite"
        elif postgres_available():
            self.backend = "postgresql"
        elif self.database == "postgres":
            raise AirflowError(f"no PostgreSQL answers on {PG_HOST}:{PG_PORT} (database='postgres' was asked)")
        else:
            self.backend = "sqlite"
            log.warning("no PostgreSQL answers on %s:%s: the Airflow metadata database is SQLite", PG_HOST, PG_PORT)
        if self.backend == "postgresql":
            _drop_orphaned_databases()
            self._pg_db = f"{PG_DB_PREFIX}{os.getpid()}_{self.instance}"
            _pg_admin(f'CREATE DATABASE "{self._pg_db}"')
            log.info("metadata database: PostgreSQL %s:%s/%s (fresh)", PG_HOST, PG_PORT, self._pg_db)
            return f"postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/{self._pg_db}"
        log.info("metadata database: SQLite %s/airflow.db", self.home)
        return f"sqlite:///{self.home}/airflow.db"

    def airflow_env(self) -> dict[str, str]:
        """The environment of every Airflow process (configuration, connections, the instance marker)."""

        home = Path(self.home)
        cfg = {
            "CORE__EXECUTOR": "LocalExecutor",
            "CORE__PARALLELISM": str(self.parallelism),
            "CORE__DAGS_FOLDER": self.dags_folder,
            "CORE__PLUGINS_FOLDER": self.plugins_folder,
            "CORE__LOAD_EXAMPLES": "False",
            "CORE__DAGS_ARE_PAUSED_AT_CREATION": str(self.paused_at_creation),
            "CORE__FERNET_KEY": self._fernet_key,
            "CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in self.roles.items()),
            "CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL": "5",
            "DATABASE__SQL_ALCHEMY_CONN": self._sql_conn,
            "API__HOST": "127.0.0.1",
            "API__PORT": str(self.port),
            "API__BASE_URL": self.url,
            "API__WORKERS": "1",
            "API__SECRET_KEY": self._secret_key,
            "API_AUTH__JWT_SECRET": self._jwt_secret,
            "API__EXPOSE_CONFIG": "False",
            "LOGGING__BASE_LOG_FOLDER": str(self.logs_dir),
            "LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "LOGGING__COLORED_CONSOLE_LOG": "False",
            # Start and react fast: short listing and heartbeat intervals, one parsing process (2 cores); an
            # unchanged DAG file is parsed again after reparse_interval (each parse costs the dag-processor CPU).
            "DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": str(self.reparse_interval),
            "DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "DAG_PROCESSOR__PRINT_STATS_INTERVAL": "300",
            "DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "2",
            "SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "SCHEDULER__JOB_HEARTBEAT_SEC": "2",
            "SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            "SCHEDULER__TASK_QUEUED_TIMEOUT": "600",
            "TRIGGERER__JOB_HEARTBEAT_SEC": "2",
        }
        if self.statsd:
            cfg.update({"METRICS__STATSD_ON": "True", "METRICS__STATSD_HOST": self.statsd[0],
                        "METRICS__STATSD_PORT": str(self.statsd[1])})
        env = dict(os.environ)
        env.update({f"AIRFLOW__{k}": v for k, v in cfg.items()})
        env["AIRFLOW_HOME"] = str(home)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        if self.tables_file:
            env["MEMWAL_TABLES_FILE"] = str(Path(self.tables_file).resolve())
        for conn_id, value in self.connections.items():
            env[f"AIRFLOW_CONN_{conn_id.upper()}"] = value if isinstance(value, str) else json.dumps(value)
        env.update(self.env)
        env[MARKER] = self.instance
        return env

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> LocalAirflow:
        """Configure, migrate, start the four components and wait until healthy; returns self."""
        t0 = time.monotonic()
        if self.home is None:
            self.home = tempfile.mkdtemp(prefix="airflow-home-")
            self._own_home = True
        Path(self.home).mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        picked = not self.port
        self.port = self.port or free_port()
        self._fernet_key = _fernet_key()
        self._secret_key = secrets.token_urlsafe(24)
        self._jwt_secret = secrets.token_urlsafe(32)
        passwords = Path(self.home) / "passwords.json"
        passwords.write_text(json.dumps(self.passwords) + "\n")
        passwords.chmod(0o600)
        try:
            self._sql_conn = self._choose_database()
            self._env = self.airflow_env()
            self._run(["db", "migrate"], "db-migrate", timeout=300)
            log.info("airflow db migrate took %.1fs", time.monotonic() - t0)
            if picked:  # picked again: one free before a migrate of a minute may be another server's by now
                self.port = free_port()
                self._env = self.airflow_env()
            for name in COMPONENTS:
                self._spawn(name, [name])
            self.wait_healthy()
            for name, slots in self.pools.items():
                self.set_pool(name, slots)
        except BaseException:
            self.stop()
            raise
        log.info("local Airflow up at %s in %.1fs (%s)", self.url, time.monotonic() - t0, self.backend)
        return self

    def _run(self, args: Sequence[str], name: str, timeout: float) -> None:
        out = self.logs_dir / f"{name}.log"
        with open(out, "w") as f:
            proc = subprocess.run([_airflow_bin(), *args], stdout=f, stderr=subprocess.STDOUT, env=self._env,
                                  stdin=subprocess.DEVNULL, timeout=timeout, cwd=self.home, check=False)
        if proc.returncode != 0:
            raise AirflowError(f"`airflow {' '.join(args)}` failed (exit {proc.returncode}); see {out}:\n"
                               + _tail(out))

    def _spawn(self, name: str, args: Sequence[str]) -> None:
        out = open(self.logs_dir / f"{name}.log", "w")  # noqa: SIM115 - closed by stop()
        self._log_files.append(out)
        self.procs[name] = subprocess.Popen(
            [_airflow_bin(), *args], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self._env, cwd=self.home, start_new_session=True,
        )

    def health(self) -> dict:
        """GET /api/v2/monitor/health (no authentication needed)."""
        return httpx.get(f"{self.url}/api/v2/monitor/health", timeout=5).json()

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Poll the health endpoint until metadatabase, scheduler, dag processor and triggerer are healthy."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        last: Any = None
        while True:
            self.check_alive()
            try:
                last = self.health()
                if all((last.get(k) or {}).get("status") == "healthy"
                       for k in ("metadatabase", "scheduler", "dag_processor", "triggerer")):
                    return
            except (httpx.HTTPError, ValueError) as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                raise AirflowError(f"Airflow at {self.url} not healthy after {timeout or self.start_timeout}s: "
                                   f"{last}; logs in {self.logs_dir}")
            time.sleep(0.5)

    def check_alive(self) -> None:
        """Raise AirflowError (with the tail of its log) if a component has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                log_file = self.logs_dir / f"{name}.log"
                raise AirflowError(f"airflow {name} exited with {proc.returncode}; see {log_file}:\n"
                                   + _tail(log_file))

    _check_alive = check_alive

    def descendants(self) -> list[int]:
        """Pids of every live process carrying this instance's marker (children, task runners, spark-submit)."""
        needle = f"{MARKER}={self.instance}".encode()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                continue
        return pids

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every process started here (SIGTERM, then SIGKILL after `timeout`), drop the fresh database."""
        t0 = time.monotonic()
        if self._client is not None:
            self._client.close()
            self._client = None
        for proc in self.procs.values():
            _signal_group(proc.pid, signal.SIGTERM)
        # The api-server's uvicorn finishes at once but its parent lingers; it holds no state: a short grace.
        grace = {name: min(timeout, 3.0) if name == "api-server" else timeout for name in self.procs}
        pending = dict(self.procs)
        while pending:
            for name, proc in list(pending.items()):
                if proc.poll() is not None:
                    del pending[name]
                elif time.monotonic() - t0 > grace[name]:
                    log.info("airflow %s did not stop within %.0fs of SIGTERM: killed", name, grace[name])
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
                    del pending[name]
            time.sleep(0.1)
        for _ in range(3):  # anything that left the process groups (new sessions, re-parented orphans)
            stray = self.descendants()
            if not stray:
                break
            for pid in stray:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        self.procs.clear()
        for f in self._log_files:
            f.close()
        self._log_files.clear()
        if self._pg_db:
            try:
                _pg_admin(f'DROP DATABASE IF EXISTS "{self._pg_db}" WITH (FORCE)')
            except Exception as exc:
                log.warning("could not drop database %s: %s", self._pg_db, exc)
            self._pg_db = None
        log.info("local Airflow stopped in %.1fs", time.monotonic() - t0)

    def cleanup_home(self) -> None:
        """Remove AIRFLOW_HOME if this instance created it (after stop(); keep it to read the logs)."""
        if self._own_home and self.home:
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> LocalAirflow:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- REST API v2 --------------------------------------------------------------------------------------

    def token(self, username: str = "admin") -> str:
        """A REST API v2 JWT for `username`, from POST /auth/token as the UI's login form does."""
        if username not in self._tokens:
            resp = httpx.post(f"{self.url}/auth/token", timeout=30,
                              json={"username": username, "password": self.passwords[username]})
            if resp.status_code not in (200, 201):
                raise AirflowError(f"POST /auth/token for {username!r} -> {resp.status_code}: {resp.text[:300]}")
            self._tokens[username] = resp.json()["access_token"]
        return self._tokens[username]

    def request(self, method: str, path: str, *, user: str = "admin", expect: Sequence[int] = (200,),
                **kwargs: Any) -> Any:
        """One REST call (path under the API root, e.g. /api/v2/dags) as `user`; returns the decoded JSON."""
        if self._client is None:
            self._client = httpx.Client(base_url=self.url, timeout=60)
        headers = {"Authorization": f"Bearer {self.token(user)}", **kwargs.pop("headers", {})}
        resp = self._client.request(method, path, headers=headers, **kwargs)
        if resp.status_code not in expect:
            raise AirflowError(f"{method} {path} as {user} -> {resp.status_code}: {resp.text[:500]}")
        if not resp.content:
            return None
        ctype = resp.headers.get("content-type", "")
        return resp.json() if "json" in ctype else resp.text

    def get_dag(self, dag_id: str) -> dict | None:
        resp = self.request("GET", f"/api/v2/dags/{dag_id}", expect=(200, 404))
        return None if resp is None or resp.get("dag_id") != dag_id else resp

    def wait_for_dag(self, dag_id: str, timeout: float = 120.0) -> dict:
        """Wait until the dag processor has serialized `dag_id`; fail early naming an import error of its file."""
        deadline = time.monotonic() + timeout
        while True:
            dag = self.get_dag(dag_id)
            if dag is not None:
                return dag
            self.check_alive()
            if time.monotonic() > deadline:
                errors = self.import_errors()
                raise AirflowError(f"DAG {dag_id} not loaded after {timeout}s; import errors: {errors}")
            time.sleep(1)

    def import_errors(self) -> list[dict]:
        return self.request("GET", "/api/v2/importErrors")["import_errors"]

    def set_pool(self, name: str, slots: int, description: str = "") -> None:
        """Create or resize a pool (the MemWAL DAGs need `memwal_spark`: a task in a missing pool never runs)."""
        body = {"name": name, "slots": slots, "description": description or f"created by {Path(__file__).name}"}
        if self.request("GET", f"/api/v2/pools/{name}", expect=(200, 404)).get("name") == name:
            self.request("PATCH", f"/api/v2/pools/{name}", json=body)
        else:
            self.request("POST", "/api/v2/pools", json=body, expect=(200, 201))

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": paused})

    def reparse(self, dag_id: str) -> None:
        """Ask the dag processor to parse `dag_id`'s file now (the UI's "Reparse DAG"), not after
        reparse_interval: e.g. an asset watcher registers only when its DAG is parsed unpaused."""
        token = self.request("GET", f"/api/v2/dags/{dag_id}/details")["file_token"]
        self.request("PUT", f"/api/v2/parseDagFile/{token}", expect=(201,))

    def trigger_dag(self, dag_id: str, conf: Mapping[str, Any] | None = None, *, user: str = "admin",
                    run_id: str | None = None, unpause: bool = True) -> str:
        """POST a manual DAG run (as the UI's trigger form does) and return its run id. Unpauses the DAG first
        unless told not to: the scheduler runs nothing of a paused DAG."""
        self.wait_for_dag(dag_id)
        if unpause:
            self.set_paused(dag_id, False)
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf or {})}
        if run_id:
            body["dag_run_id"] = run_id
        run = self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", user=user, json=body)
        return run["dag_run_id"]

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        return self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")

    def dag_runs(self, dag_id: str) -> list[dict]:
        return self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns", params={"limit": 100})["dag_runs"]

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 300.0) -> str:
        """Poll a DAG run until success or failed; returns the state (raises on timeout with task states)."""
        return self.wait_until(lambda: self._terminal_state(dag_id, run_id), timeout,
                               lambda: f"run {dag_id}/{run_id}: {self.task_states(dag_id, run_id)}")

    def _terminal_state(self, dag_id: str, run_id: str) -> str | None:
        state = self.dag_run(dag_id, run_id)["state"]
        return state if state in TERMINAL_RUN_STATES else None

    def wait_until(self, probe: Callable[[], Any], timeout: float, describe: Callable[[], str] | None = None,
                   interval: float = 1.0) -> Any:
        """Call `probe` until it returns something truthy (returned); raise after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            self.check_alive()
            if time.monotonic() > deadline:
                raise AirflowError(f"timed out after {timeout}s" + (f": {describe()}" if describe else ""))
            time.sleep(interval)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
                            params={"limit": 100})["task_instances"]

    def task_states(self, dag_id: str, run_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for ti in self.task_instances(dag_id, run_id):
            key = ti["task_id"] if ti.get("map_index", -1) < 0 else f"{ti['task_id']}[{ti['map_index']}]"
            out[key] = ti["state"]
        return out

    def task_tries(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> list[dict]:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        path += f"/{map_index}/tries" if map_index >= 0 else "/tries"
        return self.request("GET", path)["task_instances"]

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
        """The deserialized XCom value (REST: xcomEntries/{key}?deserialize=true)."""
        entry = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/"
                             f"{key}", params={"map_index": map_index, "deserialize": True, "stringify": False})
        return entry["value"]

    def xcom_entries(self, dag_id: str, run_id: str, task_id: str = "~") -> list[dict]:
        return self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries",
                            params={"limit": 100})["xcom_entries"]

    def assets(self) -> list[dict]:
        return self.request("GET", "/api/v2/assets", params={"limit": 100})["assets"]

    def asset_events(self, **filters: Any) -> list[dict]:
        """GET /api/v2/assets/events (filters: asset_id, source_dag_id, source_run_id, source_task_id, ...)."""
        return self.request("GET", "/api/v2/assets/events", params={"limit": 100, **filters})["asset_events"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1) -> str:
        """The task's log of one try as the UI reads it (the structured records, one JSON object a line)."""
        body = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/"
                            f"{try_number}", params={"map_index": map_index, "full_content": True},
                            headers={"Accept": "application/json"})
        content = body.get("content", []) if isinstance(body, dict) else body
        return "\n".join(json.dumps(r) if not isinstance(r, str) else r for r in content)


def _fernet_key() -> str:
    try:
        from cryptography.fernet import Fernet

        return Fernet.generate_key().decode()
    except ImportError:  # pragma: no cover - cryptography comes with Airflow
        return base64.urlsafe_b64encode(os.urandom(32)).decode()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/local_airflow.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--home", help="AIRFLOW_HOME (default: a new temporary directory)")
    p.add_argument("--tables-file", help="the MemWAL tables file (MEMWAL_TABLES_FILE)")
    p.add_argument("--database", choices=["auto", "postgres", "sqlite"], default="auto")
    p.add_argument("--port", type=int, default=8080, help="api-server port on 127.0.0.1 (0: any free port)")
    p.add_argument("--dags-folder", default=str(REPO / "dags"))
    p.add_argument("--unpause", action="store_true", help="DAGs start unpaused (default: paused at creation)")
    p.add_argument("--statsd", metavar="HOST:PORT", help="send Airflow's StatsD metrics there")
    p.add_argument("--no-spark-connect", dest="spark_connect", action="store_false",
                   help="start no local Spark Connect server (tables on engine spark_connect then fail)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    statsd = None
    if args.statsd:
        host, _, port = args.statsd.rpartition(":")
        statsd = (host or "127.0.0.1", int(port))
    af = LocalAirflow(home=args.home, tables_file=args.tables_file, database=args.database,
                      port=args.port or None, dags_folder=args.dags_folder, paused_at_creation=not args.unpause,
                      statsd=statsd)
    return serve(af, "local_airflow", spark_connect=args.spark_connect)


# The `spark_connect` connections a local deployment defines (the tables file's default, and the demo's).
SPARK_CONNECT_CONNS = ("spark_connect_default", "memwal_spark_connect_local")


def start_connect_server(af: LocalAirflow, master: str = "local[*]") -> Any:
    """A local Spark Connect server (`spark_jobs.connect_server`, 127.0.0.1 on a free port) for the tasks of
    `af`, and its `spark_connect` connections (SPARK_CONNECT_CONNS) pointing at it; call before af.start().
    The caller stops it (`close()`)."""
    from spark_jobs.connect_server import ConnectServer

    server = ConnectServer(master=master, port=free_port()).start()
    conns = {c: {"conn_type": "spark_connect", "host": "127.0.0.1", "port": server.port} for c in SPARK_CONNECT_CONNS}
    af.connections = {**conns, **af.connections}
    return server


def serve(af: LocalAirflow, name: str, after_start: Callable[[LocalAirflow], list[str]] | None = None,
          spark_connect: bool = True) -> int:
    """Start `af` (and, with `spark_connect`, a local Spark Connect server for its tasks first), print its URL,
    logins and `after_start`'s lines, and keep it up until Ctrl-C or SIGTERM; every process it started is
    stopped on the way out (the command line of `local_airflow` and `make airflow`)."""
    stopping = False
    server = None

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            raise KeyboardInterrupt

    # SIGINT explicitly too: a process started in the background of a non-interactive shell inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler of its own.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if spark_connect:
            server = start_connect_server(af)
        af.start()
        lines = after_start(af) if after_start else []
        if server is not None:
            lines.append(f"Spark Connect server: {server.url} (connections {', '.join(SPARK_CONNECT_CONNS)}; log "
                         f"{server.log_path})")
        print(f"\nAirflow is up: {af.url}  (metadata: {af.backend}; AIRFLOW_HOME={af.home})")
        for user, password in af.passwords.items():
            print(f"  login: {user} / {password}  (role {af.roles[user]})")
        for line in lines:
            print(f"  {line}")
        print("Ctrl-C stops every process started here.\n", flush=True)
        while True:
            af.check_alive()
            time.sleep(1)
    except KeyboardInterrupt:
        print("stopping ...", file=sys.stderr)
    except AirflowError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 1
    except (RuntimeError, TimeoutError, FileNotFoundError) as exc:  # the Spark Connect server did not start
        print(f"{name}: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        af.stop()
        if server is not None:
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
