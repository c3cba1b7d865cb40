"""The plugin and the connection type as Airflow loads them: the plugins folder yields the MemWAL plugin only
(plugins/.airflowignore keeps the library's modules from being imported as top-level modules), and the
providers manager offers the `memwal` connection type with MemWalHook and its form fields."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from airflow_support import REPO


def test_plugin_loads_alone_and_memwal_connection_type_is_registered(airflow_home):
    probe = Path(__file__).resolve().with_name("plugin_probe.py")
    env = {**airflow_home, "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins")}
    proc = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stderr[-3000:]
    out = json.loads(lines[-1])
    assert out["errors"] == {}, out["errors"]
    assert out["plugins"] == ["memwal"]
    assert out["top_level_library_modules"] == [], "the plugin loader must not import plugins/memwal/*.py"
    assert out["hook"] == "memwal.airflow.hooks.memwal.MemWalHook"
    assert out["widgets"] == ["extra__memwal__allow_http", "extra__memwal__region", "extra__memwal__storage_options"]
    assert out["behaviour"]["relabeling"]["login"] == "Access key id"
    assert "/memwal" in out["fastapi"], "the UI page joins through the plugin class"
