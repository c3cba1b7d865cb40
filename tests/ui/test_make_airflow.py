"""`make airflow` (scripts/make_airflow.py): the demo table written, a local Airflow serving the MemWAL page,
the URL and logins printed, and Ctrl-C (SIGINT) stopping every process it started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]


def _processes_with(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


@pytest.mark.slow
def test_make_airflow_serves_the_page_and_ctrl_c_stops_everything(tmp_path):
    port = free_port()
    demo = tmp_path / "demo" / "table.lance"
    tables = tmp_path / "tables.yaml"
    tables.write_text(f"tables:\n  demo:\n    uri: {demo}\n    engine: in_process\n")
    marker = f"MAKE_AIRFLOW_TEST={tmp_path.name}"
    env = {**os.environ, "MAKE_AIRFLOW_TEST": tmp_path.name}
    log = tmp_path / "out.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "make_airflow.py"), "--port", str(port),
                                 "--tables-file", str(tables), "--demo-table", str(demo),
                                 "--demo-base-rows", "2000", "--demo-batches", "2"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 240
        while "Ctrl-C stops" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "make airflow did not come up in 240 s:\n" + log.read_text()[-3000:]
            time.sleep(1)
        text = log.read_text()
        assert demo.exists(), "the demo table must be written"
        assert f"http://127.0.0.1:{port}/plugin/memwal" in text
        password = re.search(r"login: admin / (\S+)", text).group(1)
        assert re.search(r"login: viewer / \S+", text)
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/memwal/api/tables", timeout=30).status_code == 401
        token = httpx.post(f"{url}/auth/token", json={"username": "admin", "password": password},
                           timeout=30).json()["access_token"]
        tables_json = httpx.get(f"{url}/memwal/api/tables", headers={"Authorization": f"Bearer {token}"},
                                timeout=60).json()
        assert [t["name"] for t in tables_json] == ["demo"]
        assert tables_json[0]["error"] is None and tables_json[0]["summary"]["unmerged_generations"] > 0
        assert _processes_with(marker), "the Airflow processes carry the test's environment marker"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    assert "stopping" in log.read_text()
    deadline = time.monotonic() + 30
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_with(marker) == [], "Ctrl-C must stop every process make airflow started"
