"""`make demo` with DEMO_TABLE deletes only what the demo wrote (issue 23, item 6): its reset step
(`scripts/demo.sh --reset-only`) keeps every other file of the table's directory and refuses a DEMO_TABLE
that exists but is not the demo's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _reset(table: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "scripts" / "demo.sh"), "--reset-only"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "DEMO_TABLE": str(table)})


def test_a_rerun_removes_the_demo_table_and_keeps_its_neighbours(tmp_path):
    parent = tmp_path / "data"
    parent.mkdir()
    sibling = parent / "mine.txt"
    sibling.write_text("not the demo's")
    (parent / "model.json").write_text("{}")  # the name the demo's model file had before
    (parent / "memwal_tables.yaml").write_text("tables: {}\n")  # and its tables file
    table = parent / "t.lance"
    first = _reset(table)
    assert sibling.read_text() == "not the demo's", "a file the demo did not write survives"
    assert first.returncode == 0, first.stderr
    assert (parent / "t.lance.memwal-demo").is_dir(), "the marker of a table the demo writes"
    # what the demo's run then wrote
    (table / "_versions").mkdir(parents=True)
    (table / "_versions" / "1.manifest").write_text("m")
    (parent / "t.lance.model.json").write_text("{}")
    (parent / "t.lance.memwal-demo" / "memwal_tables.yaml").write_text("tables: {}\n")
    again = _reset(table)
    assert again.returncode == 0, again.stderr
    assert not table.exists() and not (parent / "t.lance.model.json").exists()
    assert sorted(p.name for p in parent.iterdir()) == ["memwal_tables.yaml", "mine.txt", "model.json",
                                                        "t.lance.memwal-demo"]
    assert sibling.read_text() == "not the demo's"
    assert (parent / "memwal_tables.yaml").read_text() == "tables: {}\n"
    assert list((parent / "t.lance.memwal-demo").iterdir()) == []


def test_an_existing_table_that_is_not_the_demos_is_named_and_kept(tmp_path):
    table = tmp_path / "theirs.lance"
    (table / "data").mkdir(parents=True)
    (table / "data" / "f.lance").write_text("their data")
    (tmp_path / "neighbour").write_text("x")
    proc = _reset(table)
    assert proc.returncode == 2
    assert str(table) in proc.stderr and "not written by the demo" in proc.stderr
    assert (table / "data" / "f.lance").read_text() == "their data" and (tmp_path / "neighbour").exists()
    assert not (tmp_path / "theirs.lance.memwal-demo").exists()
