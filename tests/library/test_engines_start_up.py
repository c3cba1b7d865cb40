"""What every task process pays before its job (issue 44): the `memwal` command's start-up imports lance, pyarrow
and pandas with the cyclic collector off and freezes them, and `memwal.engines.load_runner` reads the platform's
own runners from its metadata file, without importing `importlib.metadata` or scanning every distribution."""

from __future__ import annotations

import subprocess
import sys

import pytest

from memwal import engines


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_the_command_imports_lance_at_start_up_with_no_collection_then_freezes_it():
    """`import memwal.cli` leaves lance to `start_up` (a usage error or --help needs none of it), which imports
    it without one collection, freezes what it made and turns the collector back on."""
    code = ("import gc, sys\n"
            "import memwal.cli\n"
            "deferred = 'lance' not in sys.modules and 'pyarrow' not in sys.modules\n"
            "starts = []\n"
            "gc.callbacks.append(lambda phase, info: starts.append(1) if phase == 'start' else None)\n"
            "with memwal.cli.start_up():\n"
            "    pass\n"
            "print(deferred, len(starts), 'lance' in sys.modules, gc.isenabled(), gc.get_freeze_count() > 0)\n")
    assert _run(code) == "True 0 True True True"


def test_start_up_leaves_a_process_that_has_lance_already_as_it_is():
    """A process that imported lance before (a test calling `main`, a worker) keeps its collector as it is:
    nothing frozen, nothing turned off."""
    code = ("import gc, lance, memwal.cli\n"
            "with memwal.cli.start_up():\n"
            "    inside = gc.isenabled()\n"
            "print(inside, gc.get_freeze_count())\n")
    assert _run(code) == "True 0"


def test_the_platforms_runner_is_found_without_importlib_metadata():
    """The spark_connect runner comes from memwal-platform's own entry_points.txt: no `importlib.metadata`
    (its import and its scan of every installed distribution were 0.05-0.15 s of each task's start-up)."""
    code = ("import sys\n"
            "from memwal.engines import load_runner\n"
            "runner = load_runner('spark_connect', url='sc://h:15002')\n"
            "print(type(runner).__name__, runner.url, 'importlib.metadata' in sys.modules)\n")
    assert _run(code) == "ConnectRunner sc://h:15002 False"


def test_the_first_metadata_of_the_distribution_along_sys_path_is_read(tmp_path, monkeypatch):
    """As importlib.metadata finds a distribution: the first along sys.path; `[extras]` and comments aside."""
    info = tmp_path / "memwal_platform-9.9.dist-info"
    info.mkdir()
    (info / "entry_points.txt").write_text("# ours\n[console_scripts]\nspark_connect = nothing:here\n\n"
                                           "[memwal.runners]\nspark_connect = collections:OrderedDict [extra]\n")
    (tmp_path / "other-1.0.dist-info").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert engines.own_entry_points("memwal.runners") == {"spark_connect": "collections:OrderedDict"}
    assert engines.load_runner("spark_connect", url="sc://x") == {"url": "sc://x"}


def test_an_engine_the_platform_does_not_register_is_found_by_the_scan(monkeypatch):
    """Nothing in the platform's own metadata (another distribution's runner, metadata not found): the scan of
    every installed distribution's entry points, as before; an engine nobody registers is one line."""
    monkeypatch.setattr(engines, "own_entry_points", lambda group: {}, raising=False)
    runner = engines.load_runner("spark_connect", url="sc://h:15002")
    assert type(runner).__name__ == "ConnectRunner"
    with pytest.raises(Exception, match=r"memwal\.runners"):
        engines.load_runner("flink")
