"""`make demo` with DEMO_TABLE deletes only what the demo wrote (issue 23, item 6): its reset step
(`scripts/demo.sh --reset-only`) keeps every other file of the table's directory and refuses a DEMO_TABLE
that exists but is not the demo's. The demo's search step (issue 41, item 10): `memwal search` (vector and
text) between merge and index catch-up, with the CLI's plan, checked against the model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from memwal import demo
from memwal.jobs import run_job
from memwal.table import MemWalTable

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


def _demo_search(table: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memwal.demo", "search", table], capture_output=True, text=True,
                          timeout=300)


def test_the_demo_searches_the_gap_prints_the_plan_and_checks_the_model(tmp_path, capsys):
    """A small demo table, merged and not caught up: `python -m memwal.demo search` runs `memwal search` for a
    vector and a text query, prints each plan (the base through its index; for text, the gap generations
    through their own INVERTED indexes, nothing flat) and says the results equal the model; after catch-up
    there is no gap to show and it exits 1."""
    table = str(tmp_path / "t.lance")
    model = demo.write(table, base_rows=2_000, batches=3, batch_rows=400, seed=7)
    Path(demo.model_path(table)).write_text(json.dumps(model))
    run_job("merge", MemWalTable(table))
    proc = _demo_search(table)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "search results equal the model: True" in out
    gap = re.search(r"\(the gap\): (\d+) for vec_idx, (\d+) for text_idx", out)
    assert gap and int(gap[1]) > 0 and gap[1] == gap[2], out
    gens = int(gap[2])
    assert f"$ memwal search {table} --vector '[" in out and f"$ memwal search {table} --text 'otter falcon'" in out
    assert "plan: vector search on vec (l2): 1 source(s) through an index," in out
    assert (f"plan: full-text search on text (['otter', 'falcon']): {1 + gens} source(s) through an index, "
            "0 read flat, 0 rows served flat;") in out, out
    first = re.search(r"\n  id=(\d+) .*_distance=([\d.]+)\n", out)
    assert first and float(first[2]) == 0.0, "the query row's newest version comes first"

    run_job("catchup", MemWalTable(table))
    assert demo.main(["search", table]) == 1, "after catch-up no generation sits in the gap"
    assert "no generation sits in the gap" in capsys.readouterr().out


def test_demo_sh_searches_after_merge_and_before_catchup():
    """The search step sits between merge and index catch-up in `make demo` (the gap it shows exists only there)."""
    lines = (REPO / "scripts" / "demo.sh").read_text().splitlines()
    at = {what: next(i for i, ln in enumerate(lines) if ln.startswith(f"$BIN/{what}")) for what in
          ('memwal merge "$TABLE"', 'python -m memwal.demo search "$TABLE"', 'memwal catchup "$TABLE"')}
    assert list(at.values()) == sorted(at.values()), at


def _row(i: int, amount: float, value: float) -> dict:
    _, texts = demo.derived([i], [amount])
    return {"id": i, "amount": amount, "text": texts[0], "_distance": value}


def test_the_demos_model_check_names_every_difference():
    """demo.matches_model (what makes the demo say False and exit 1): keys tied at the cut may differ; a stale
    version, a wrong distance, a short result and a key twice are each named."""
    model = {1: 1.0, 2: 2.0, 3: 3.0}
    expected = {1: 0.0, 2: 1.0, 3: 1.0}  # 2 and 3 tie at the cut of k = 2

    def check(found: list[dict]) -> list[str]:
        return demo.matches_model(found, model, expected, "_distance", 2, best_first_is_low=True)

    assert check([_row(1, 1.0, 0.0), _row(3, 3.0, 1.0)]) == check([_row(1, 1.0, 0.0), _row(2, 2.0, 1.0)]) == []
    stale = check([_row(1, 1.0, 0.0), _row(2, 2.1, 1.0)])
    assert stale == ["id 2: not its newest live version (amount 2.1, model 2.0)"]
    assert check([_row(1, 1.0, 0.0), _row(2, 2.0, 1.5)]) == ["id 2: _distance 1.5, model 1.0",
                                                            "_distances [0.0, 1.5], model's best [0.0, 1.0]"]
    assert check([_row(1, 1.0, 0.0)]) == ["_distances [0.0], model's best [0.0, 1.0]"]
    assert check([_row(1, 1.0, 0.0), _row(1, 1.0, 0.0)])[0].startswith("a key came back twice")
    wrong_text = {**_row(3, 3.0, 1.0), "text": "river"}
    assert check([_row(1, 1.0, 0.0), wrong_text]) == ["id 3: vec or text differs from the model"]
