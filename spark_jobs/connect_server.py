"""A local Spark Connect server (the one pyspark ships: `SparkConnectServer` in `pyspark/jars`), for
`make airflow`, `make demo`, the tests and the benchmarks. Production runs its own next to the Spark
cluster (docker-compose's `spark-connect` service is one).

    with ConnectServer(master="local[2]").start() as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()

It binds 127.0.0.1 on a free port, runs with this interpreter as the executors' Python (they import
memwal from the artifacts each client ships), our log4j configuration, and its own process group, so
`stop()` ends it and its Python workers. Its log is `<workdir>/server.log`; `event_log_dir` turns Spark's
event log on (the canary test reads both).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from spark_jobs.submit import private_workdir, spark_conf_defaults, spark_submit_env, spark_submit_executable

__all__ = ["CONNECT_SERVER_CLASS", "ConnectServer", "connect_jar", "free_local_port"]

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def connect_jar() -> str:
    """The Spark Connect server jar of the installed pyspark (or of SPARK_HOME)."""
    from spark_jobs.submit import spark_home

    for jars in (Path(spark_home()) / "jars",):
        found = sorted(jars.glob("spark-connect_*.jar"))
        if found:
            return str(found[-1])
    raise FileNotFoundError(f"no spark-connect_*.jar under {spark_home()}/jars (pyspark >= 4 ships it)")


def free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ConnectServer:
    """One local Spark Connect server process. `start()` waits until it accepts connections."""

    master: str = "local[2]"
    port: int = 0
    conf: Mapping[str, str] = field(default_factory=dict)
    event_log_dir: str | None = None
    log_path: Path | None = None
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        settings = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "4",
        }
        if self.event_log_dir:
            settings.update({"spark.eventLog.enabled": "true", "spark.eventLog.dir": self.event_log_dir})
        settings.update(spark_conf_defaults(self.conf))  # conf over ours; JVM options add to our log4j one
        cmd = [spark_submit_executable(), "--master", self.master, "--name", "memwal-spark-connect",
               "--class", CONNECT_SERVER_CLASS]
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        return [*cmd, connect_jar()]

    def start(self, timeout: float = 120.0) -> ConnectServer:
        if self.proc is not None:
            return self
        self.port = self.port or free_local_port()
        if self.log_path is None:
            self._workdir = private_workdir("memwal-connect-")
            self.log_path = self._workdir.__enter__() / "server.log"
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it
        env = spark_submit_env()
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace").splitlines()[-20:]
                raise RuntimeError(f"the Spark Connect server exited ({self.proc.returncode}) before listening on "
                                   f"{self.url}: " + "\n".join(tail))
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"the Spark Connect server did not listen on {self.url} within {timeout:.0f}s "
                           f"(log: {self.log_path})")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        """End the server and its Python workers (its process group): SIGTERM, then SIGKILL."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc = None

    def close(self) -> None:
        """stop(), and remove the private directory holding the default log."""
        self.stop()
        workdir = getattr(self, "_workdir", None)
        if workdir is not None:
            workdir.__exit__(None, None, None)
            self._workdir = None

    def __enter__(self) -> ConnectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    """`python -m spark_jobs.connect_server [--port N] [--master M]`: run one until interrupted."""
    import argparse

    p = argparse.ArgumentParser(prog="memwal-connect-server", description=main.__doc__)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)
    server = ConnectServer(master=args.master, port=args.port).start()
    print(server.url, flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
