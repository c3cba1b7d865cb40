"""The local Airflow launcher (scripts/local_airflow.py) on its own, with a tiny DAG and the SQLite metadata
database: the four components come up healthy, the REST API v2 answers with a token from POST /auth/token,
a viewer may read but not trigger, and stop() leaves no process behind, even one that left its group."""

from __future__ import annotations

import os
import textwrap

import pytest
from local_airflow import AirflowError, LocalAirflow  # scripts/ is on sys.path (tests/e2e/conftest.py)

pytestmark = [pytest.mark.slow]

TINY_DAG = textwrap.dedent('''
    """A DAG whose task leaves a process behind in its own session, and emits an asset event."""
    import subprocess

    from airflow.sdk import Asset, dag, task

    @dag(schedule=None)
    def tiny():
        @task(outlets=[Asset("memwal://tiny")])
        def leave_a_process_behind():
            stray = subprocess.Popen(["sleep", "600"], start_new_session=True)
            return {"stray_pid": stray.pid}

        leave_a_process_behind()

    tiny()
''')


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


def test_launcher_runs_a_dag_over_rest_and_stop_leaves_nothing_behind(tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "tiny.py").write_text(TINY_DAG)
    (tmp_path / "plugins").mkdir()
    af = LocalAirflow(home=str(tmp_path / "home"), dags_folder=str(dags), plugins_folder=str(tmp_path / "plugins"),
                      database="sqlite", pools={}, reparse_interval=300)
    try:
        af.start()
        assert af.backend == "sqlite"
        health = af.health()
        assert {k: health[k]["status"] for k in ("metadatabase", "scheduler", "dag_processor", "triggerer")} == \
            dict.fromkeys(("metadatabase", "scheduler", "dag_processor", "triggerer"), "healthy")
        run_id = af.trigger_dag("tiny")
        assert af.wait_for_run("tiny", run_id, timeout=180) == "success", af.task_states("tiny", run_id)
        stray = af.xcom("tiny", run_id, "leave_a_process_behind")["stray_pid"]
        assert _alive(stray), "the task's stray process runs until stop()"
        events = af.asset_events(source_dag_id="tiny")
        assert [e["source_run_id"] for e in events] == [run_id]

        # The viewer reads runs but may not trigger one (the Simple auth manager's Viewer role).
        assert af.dag_run("tiny", run_id)["state"] == "success"
        assert af.request("GET", "/api/v2/dags/tiny/dagRuns", user="viewer")["total_entries"] == 1
        with pytest.raises(AirflowError, match="403"):
            af.trigger_dag("tiny", user="viewer", unpause=False)
        # No token, no API.
        import httpx

        assert httpx.get(f"{af.url}/api/v2/dags", timeout=10).status_code == 401
        pids = [p.pid for p in af.procs.values()]
    finally:
        af.stop()
    assert not [p for p in pids if _alive(p)], "every Airflow component is stopped"
    assert not _alive(stray), "stop() killed the task's process that had left the process group"
    assert af.descendants() == []
    assert os.path.isfile(tmp_path / "home" / "logs" / "scheduler.log")
