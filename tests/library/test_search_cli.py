"""`memwal search`: vector search over the LSM view from the command line (the --text side is the FTS
engineer's LsmReader.full_text_search, wired by name)."""

from __future__ import annotations

import json

import pytest

from memwal.cli import main

from support.vector_tables import create_vector_table, text_of, vectors, write_generation


@pytest.fixture
def table(local_location):
    """| level        | rows                                    |
    | base (IVF_PQ) | ids 0-299, version 0                    |
    | generation 1  | ids 0-9 updated (version 1), 10-14 deleted |"""
    region = create_vector_table(local_location, rows=300)[0]
    write_generation(local_location, region, range(10), 1, delete_ids=range(10, 15))
    return local_location.uri


def _rows(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_search_vector_json_returns_the_newest_row_nearest_first(table, capsys):
    q = vectors([3], 1)[0]
    assert main(["search", table, "--vector", json.dumps(q.tolist()), "--k", "4", "--json"]) == 0
    rows = _rows(capsys)
    assert len(rows) == 4 and rows[0]["id"] == 3 and rows[0]["text"] == text_of(3, 1), rows[0]
    assert rows[0]["_distance"] == pytest.approx(0.0, abs=1e-4), "the updated row's own vector is at distance 0"
    assert [r["_distance"] for r in rows] == sorted(r["_distance"] for r in rows), "not nearest first"


def test_search_filter_and_deleted_rows(table, capsys):
    """The old vector of deleted row 12 must not find it; the filter keeps only ids >= 100."""
    q = vectors([12], 0)[0]
    assert main(["search", table, "--vector", json.dumps(q.tolist()), "--k", "20", "--json"]) == 0
    assert 12 not in {r["id"] for r in _rows(capsys)}, "a deleted row came back"
    assert main(["search", table, "--vector", json.dumps(q.tolist()), "--filter", "id >= 100", "--json"]) == 0
    rows = _rows(capsys)
    assert len(rows) == 10 and all(r["id"] >= 100 for r in rows), rows


def test_search_prints_rows_without_the_vector_column(table, capsys):
    assert main(["search", table, "--vector", json.dumps(vectors([3], 1)[0].tolist()), "--k", "1"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("id=3  text=") and "_distance=" in out and "vec=" not in out, out


@pytest.mark.parametrize("argv, message", [
    (["--vector", "[1, 2"], "is not JSON"),
    (["--vector", '{"a": 1}'], "is not a JSON list of numbers"),
    (["--vector", "[1, 2]"], "search vector must be 16 finite numbers"),
    (["--vector", "[1]", "--k", "0"], "'0' is not a positive integer"),
    ([], "one of the arguments --vector --text is required"),
])
def test_bad_search_input_exits_2_naming_it(table, capsys, argv, message):
    assert main(["search", table, *argv]) == 2
    assert message in capsys.readouterr().err


def test_status_search_shows_what_a_search_pays(table, capsys):
    """Base through its IVF_PQ index, our writer's small generation 1 read flat by the vector search (whatever
    index it carries): status --search counts the sources and the rows served flat, per index; without --search
    the JSON is unchanged."""
    assert main(["status", table, "--search", "--json"]) == 0
    costs = {c["index"]: c for c in json.loads(capsys.readouterr().out)["search"]}
    assert set(costs) == {"vec_idx", "text_idx"}, costs
    vec = costs["vec_idx"]
    assert (vec["kind"], vec["column"], vec["indexed_sources"], vec["flat_sources"]) == ("vector", "vec", 1, 1), vec
    assert vec["rows_served_flat"] == 15, "generation 1's 10 upserts and 5 deletes are read flat"
    assert main(["status", table, "--search"]) == 0
    assert "search vector on vec (vec_idx): 1 sources through an index, 1 flat, 15 rows served flat" \
        in capsys.readouterr().out
    assert main(["status", table, "--json"]) == 0
    assert "search" not in json.loads(capsys.readouterr().out)


def test_lag_measure_reports_search_costs_when_asked(table):
    from memwal.lag import measure

    assert "search" not in measure(table)
    costs = {c["index"]: c for c in measure(table, search=True)["search"]}
    assert costs["vec_idx"]["flat_sources"] == 1 and costs["text_idx"]["kind"] == "fts", costs
    assert costs["text_idx"]["indexed_sources"] + costs["text_idx"]["flat_sources"] == 2, costs


def test_search_plan_prints_the_read_plan_on_stderr(table, capsys):
    """--plan: one line on stderr with what the search read (the base through its index, generation 1 read
    flat: as status --search counts it); stdout keeps only the rows, and without --plan no plan is printed."""
    q = json.dumps(vectors([3], 1)[0].tolist())
    assert main(["search", table, "--vector", q, "--k", "4", "--json", "--plan"]) == 0
    out, err = capsys.readouterr()
    assert len(_rows_of(out)) == 4
    assert "plan: vector search on vec (l2): 1 source(s) through an index, 1 read flat, 15 rows served flat;" in err
    word = text_of(3, 1).split()[0]
    assert main(["search", table, "--text", word, "--plan"]) == 0
    err = capsys.readouterr().err
    assert f"plan: full-text search on text (['{word}']): 2 source(s) through an index, 0 read flat, 0 rows served " \
           "flat;" in err, "generation 1 is asked through the INVERTED index its flush built"
    assert main(["search", table, "--vector", q, "--k", "4"]) == 0
    assert "plan:" not in capsys.readouterr().err


def _rows_of(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]
