"""The page's pieces without a server: threshold marks on region rows, the lag chart, run summaries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memwal.airflow.config import Thresholds
from memwal.airflow.ui.chart import lag_chart_svg
from memwal.airflow.ui.regions import region_rows
from memwal.airflow.ui.sources import summarize

REGION = {"region_id": "r1", "writer_epoch": 2, "current_generation": 7, "flushed_generations": [4, 5, 6],
          "merged_generation": 3, "unmerged_generations": 3, "unmerged_rows": 30, "unmerged_bytes": 3000,
          "oldest_unmerged_age_s": 100.0, "index_lag_generations": 1, "error": None}


def test_rows_over_a_threshold_are_marked_with_the_metric():
    now = 1_000_000.0
    rows = region_rows({"regions": [REGION, {**REGION, "region_id": "r2", "unmerged_generations": 1}]},
                       Thresholds(max_unmerged_generations=2, max_snapshot_age_s=60),
                       snapshot_ts_millis=int((now - 90) * 1000), now=now)
    assert rows[0]["over"] == ["unmerged_generations", "snapshot_age_s"]
    assert rows[1]["over"] == ["snapshot_age_s"], "snapshot age is the table's, on every row"
    assert rows[0]["flushed_generation"] == 6 and rows[0]["snapshot_age_s"] == 90.0


def test_no_thresholds_mark_nothing_and_no_snapshot_has_no_age():
    rows = region_rows({"regions": [REGION]}, Thresholds(), snapshot_ts_millis=None)
    assert rows[0]["over"] == [] and rows[0]["snapshot_age_s"] is None


def test_chart_draws_one_line_per_series_through_every_point():
    t = datetime(2026, 1, 1, tzinfo=UTC)
    points = [{"at": t + timedelta(minutes=i), "unmerged_generations": g, "max_index_lag_generations": 0}
              for i, g in enumerate([8, 9, 0])]
    svg = lag_chart_svg(points, ("unmerged_generations", "max_index_lag_generations"))
    assert svg.count("<polyline") == 2 and 'data-points="3"' in svg
    line = svg.split('data-series="unmerged_generations"')[0].rsplit("points=", 1)[1]
    ys = [float(p.split(",")[1]) for p in line.strip('" ').split()]
    assert ys[2] > ys[0] > ys[1], "lower lag is drawn lower (larger y)"
    assert "no lag history" in lag_chart_svg([], ("unmerged_generations",))


def test_summary_speaks_of_the_jobs():
    line = summarize([{"job": "merge", "generations_merged": 8, "rows_upserted": 1160, "rows_deleted": 60},
                      {"job": "gc", "dry_run": True, "would_delete": {"generation": 2, "wal_entry": 3}}])
    assert line == "merge: 8 generations, 1160 rows upserted, 60 deleted; gc: 5 objects (dry run)"


def test_summary_speaks_of_compaction_and_retention():
    line = summarize([{"job": "compaction", "compacted": True, "tasks_committed": 3,
                       "health_before": {"fragments": 40}, "health_after": {"fragments": 2}},
                      {"job": "compaction", "compacted": False, "enabled": True},
                      {"job": "retention", "num_versions_removed": 12, "bytes_removed": 4096, "dry_run": False}])
    assert line == ("compaction: 3 tasks, fragments 40 -> 2; compaction: not due; "
                    "retention: 12 versions, 4096 bytes")


def test_merge_now_forwards_the_callers_token_and_reports_airflows_refusal():
    import json

    import httpx
    import pytest

    from memwal.airflow.ui.merge_now import MergeRequestError, trigger_merge

    seen = []

    def airflow(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.headers["Authorization"] != "Bearer user-token":
            return httpx.Response(403, json={"detail": "Forbidden"})
        body = json.loads(request.content)
        return httpx.Response(200, json={"dag_id": "memwal_merge", "dag_run_id": "manual__1", "state": "queued",
                                         "conf": body["conf"]})

    run = trigger_merge("user-token", "t", ["r1"], transport=httpx.MockTransport(airflow), base_url="http://af")
    assert (run.dag_run_id, run.conf) == ("manual__1", {"table": "t", "regions": ["r1"]})
    assert seen[0].url.path == "/api/v2/dags/memwal_merge/dagRuns"
    assert json.loads(seen[0].content) == {"logical_date": None, "conf": {"table": "t", "regions": ["r1"]}}
    with pytest.raises(MergeRequestError) as err:
        trigger_merge("other", "t", transport=httpx.MockTransport(airflow), base_url="http://af")
    assert err.value.status_code == 403 and "Forbidden" in str(err.value)


def test_index_health_rows_are_marked_and_rendered():
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    from memwal.airflow.ui import app as ui_app
    from memwal.airflow.ui.formatting import fmt, fmt_bytes, fmt_limit, fmt_time
    from memwal.airflow.ui.regions import COLUMNS, INDEX_COLUMNS, TableView, index_rows

    status = {"regions": [], "indexes": [
        {"name": "vec_idx", "index_type": "IVF_PQ", "segments": 6, "indexed_rows": 900, "unindexed_rows": 100,
         "indexed_fragments": 6, "unindexed_fragments": 1},
        {"name": "id_idx", "index_type": "BTree", "segments": 1, "indexed_rows": 1000, "unindexed_rows": 0,
         "indexed_fragments": 7, "unindexed_fragments": 0}]}
    rows = index_rows(status, Thresholds(max_index_segments=4, max_unindexed_rows=50))
    assert [r["over"] for r in rows] == [["segments", "unindexed_rows"], []]
    assert index_rows(status, Thresholds())[0]["over"] == []

    env = Environment(loader=FileSystemLoader(ui_app._HERE / "templates"), autoescape=select_autoescape(["html"]))
    env.filters.update(fmt=fmt, fmt_time=fmt_time, fmt_bytes=fmt_bytes, fmt_limit=fmt_limit)
    view = TableView(name="t", uri="/t", summary={"table_version": 3, "num_regions": 0, "unmerged_generations": 0,
                                                  "unmerged_rows": 0, "unmerged_bytes": 0, "generated_at": "now"},
                     indexes=rows)
    html = env.get_template("page.html").render(views=[view], columns=COLUMNS, index_columns=INDEX_COLUMNS,
                                                can_merge=False, user="u", base="", csrf_header="x",
                                                all_tables=["t"], selected=None, bad_tables={})
    assert '<tr class="index over" data-index="vec_idx">' in html
    assert '<td data-key="segments" class="over">6</td>' in html
    assert '<tr class="index" data-index="id_idx">' in html


def _render(view) -> str:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    from memwal.airflow.ui import app as ui_app
    from memwal.airflow.ui.formatting import fmt, fmt_bytes, fmt_limit, fmt_time
    from memwal.airflow.ui.regions import COLUMNS, INDEX_COLUMNS, SEARCH_COLUMNS

    env = Environment(loader=FileSystemLoader(ui_app._HERE / "templates"), autoescape=select_autoescape(["html"]))
    env.filters.update(fmt=fmt, fmt_time=fmt_time, fmt_bytes=fmt_bytes, fmt_limit=fmt_limit)
    return env.get_template("page.html").render(views=[view], columns=COLUMNS, index_columns=INDEX_COLUMNS,
                                                search_columns=SEARCH_COLUMNS, can_merge=False, user="u", base="",
                                                csrf_header="x", all_tables=["t"], selected=None, bad_tables={})


def _search_table_config(local_location, monkeypatch):
    """A table with IVF_PQ + FTS indexes and one unmerged generation (read flat by the vector search), and its
    config; the Airflow-DB parts of the view (history, runs) are left out."""
    from types import SimpleNamespace

    from memwal.airflow.ui import sources

    from support.vector_tables import create_vector_table, write_generation

    region = create_vector_table(local_location, rows=300)[0]
    write_generation(local_location, region, range(10), 1, delete_ids=range(10, 15))
    monkeypatch.setattr(sources, "history_points", lambda *a, **k: [])
    monkeypatch.setattr(sources, "recent_runs", lambda *a, **k: [])
    return SimpleNamespace(name="t", uri=local_location.uri, thresholds=None, conn_id=None, compaction=None)


def test_page_shows_what_a_search_pays_as_status_search_does(local_location, monkeypatch, capsys):
    """Per searched index: sources through an index, flat sources, rows served flat, equal to `memwal status
    --search --json` and lag.measure(search=True), in the page, its JSON, and after a merge (the gap is flat)."""
    import json

    from memwal.airflow.ui import sources
    from memwal.airflow.ui.app import _view_json
    from memwal.cli import main
    from memwal.lag import measure
    from memwal.merge import merge_table

    cfg = _search_table_config(local_location, monkeypatch)
    view = sources.table_view(cfg, user=None)
    assert view.error is None and view.notes == [], (view.error, view.notes)
    assert main(["status", cfg.uri, "--search", "--json"]) == 0
    shown = {c["index"]: c for c in view.search}
    assert shown == {c["index"]: c for c in json.loads(capsys.readouterr().out)["search"]}
    assert view.search == measure(cfg.uri, search=True)["search"]
    vec = shown["vec_idx"]
    assert (vec["indexed_sources"], vec["flat_sources"], vec["rows_served_flat"]) == (1, 1, 15), vec
    assert _view_json(view)["search"] == view.search

    html = _render(view)
    assert '<tr class="search-cost" data-index="vec_idx">' in html
    assert '<td data-key="rows_served_flat" data-value="15">15</td>' in html
    assert '<tr class="search-cost" data-index="text_idx">' in html

    # merged, vec_idx not caught up: the gap generation is a source of its own (small: read flat), the base
    # through its index over the fragments it covers
    assert not merge_table(cfg.uri).failed_regions
    after = {c["index"]: c for c in sources.table_view(cfg, user=None).search}
    assert (after["vec_idx"]["indexed_sources"], after["vec_idx"]["flat_sources"]) == (1, 1), after
    assert after["vec_idx"]["rows_served_flat"] > 0, "the gap generation's rows are read flat"
    assert after == {c["index"]: c for c in measure(cfg.uri, search=True)["search"]}


def test_search_costs_that_fail_leave_a_note_and_the_status(local_location, monkeypatch):
    from memwal.airflow.ui import sources

    cfg = _search_table_config(local_location, monkeypatch)

    def broken(_cfg):
        raise OSError("generation 1 unreadable")

    monkeypatch.setattr(sources, "search_costs_of", broken)
    view = sources.table_view(cfg, user=None)
    assert view.error is None and view.regions and view.search == []
    assert view.notes == ["search costs unavailable: generation 1 unreadable"]
    assert "search-cost" not in _render(view)
