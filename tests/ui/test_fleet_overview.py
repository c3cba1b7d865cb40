"""The fleet overview at 1,000 tables, through FastAPI's test client on the page's own app: paged, worst lag
first, each table with the probe's answer (due jobs and why, or the error), linking to the per-table view, and
rendered from the lag monitor's stored rows without opening any table. The signed-in user is the only
dependency replaced (anonymous is still refused)."""

from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient

from memwal.airflow import fleet_status
from memwal.airflow.ui.overview import fleet_page

N = 1000
FAILED = {f"t{i:04d}" for i in range(0, N, 97)}  # 11 tables whose probe or lag failed


def _row(i: int) -> dict:
    name = f"t{i:04d}"
    breaches = [f"region r{k}: unmerged_generations 9 > 1" for k in range(i % 3)]  # 0, 1 or 2
    due = [{"job": "merge", "reason": f"{i % 7 + 1} unmerged generations >= 1"}] if i % 2 else []
    probe = {"status": "ok", "due": due, "not_due": ["catchup", "compaction", "retention", "snapshot", "gc"],
             "error": None, "changed": False, "probed_at": 1.0}
    error = None
    if name in FAILED:
        if i % 2:
            probe = {"status": "error", "due": [], "not_due": [], "changed": None, "probed_at": 1.0,
                     "error": f"table /data/{name}.lance: region r1: corrupt manifest"}
        else:
            error = f"table {name!r}: permission denied"
    check = {"table": name, "at": "2026-11-27T12:00:00+00:00", "error": error, "breaches": breaches,
             "alert": None, "unmerged_generations": i % 13, "oldest_unmerged_age_s": float((i * 7919) % 5000)}
    return fleet_status.row_of(check, f"/data/{name}.lance", {"since": None}, probe)


class _Variables:
    def __init__(self, rows: list[dict]) -> None:
        self.values = {fleet_status.VARIABLE_PREFIX + fleet_status.LAG_MONITOR: json.dumps(
            {"at": "2026-11-27T12:00:00+00:00", "source": "lag_monitor", "tables": {r["table"]: r for r in rows}})}
        self.reads = 0

    def get(self, key):
        self.reads += 1
        return self.values.get(key)

    def set(self, key, value):
        self.values[key] = value


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """1,000 configured tables (plus one never measured), their stored rows, and every way to open a table
    made to fail the test."""
    import memwal.storage
    import memwal.table
    from memwal.airflow.ui import sources

    names = [f"t{i:04d}" for i in range(N)] + ["zz_new"]
    path = tmp_path / "tables.yaml"
    path.write_text(json.dumps({"tables": {n: {"uri": f"/data/{n}.lance", "engine": "in_process",
                                               "schedule": None} for n in names}}))
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(path))
    variables = _Variables([_row(i) for i in range(N)])
    monkeypatch.setattr(fleet_status, "_backend", lambda: variables)

    def no_table(*args, **kwargs):
        raise AssertionError("the overview opened a table")

    for target, attr in ((memwal.table.MemWalTable, "__init__"), (memwal.storage.ObjectStore, "__init__"),
                         (sources, "table_view"), (sources, "table_status")):
        monkeypatch.setattr(target, attr, no_table)
    return variables


@pytest.fixture
def client(fleet):
    from memwal.airflow.ui.app import create_app
    from memwal.airflow.ui.auth import signed_in_user

    class User:
        def get_name(self) -> str:
            return "viewer"

    app = create_app()
    app.dependency_overrides[signed_in_user] = lambda: User()
    return TestClient(app)


def _rank(row: dict) -> tuple:
    failed = bool(row.get("error")) or (row["probe"] or {}).get("status") not in (None, "ok")
    return (bool(row.get("unmeasured")), not failed, -len(row["breaches"]), -(row.get("oldest_unmerged_age_s") or 0))


def test_every_page_is_50_tables_worst_lag_first_and_all_pages_hold_every_table_once(client, fleet):
    pages = [client.get("/api/fleet", params={"page": p}).json() for p in range(1, 22)]
    assert pages[0]["total"] == N + 1 and pages[0]["pages"] == 21 and pages[0]["per_page"] == 50
    assert [len(p["rows"]) for p in pages] == [50] * 20 + [1]
    rows = [r for p in pages for r in p["rows"]]
    assert len({r["table"] for r in rows}) == N + 1, "every table exactly once across the pages"
    assert {r["table"] for r in rows[:len(FAILED)]} == FAILED, "tables that failed come first"
    ranks = [_rank(r) for r in rows]
    assert ranks == sorted(ranks), "then most breaches, then the oldest unmerged generation"
    assert rows[-1]["table"] == "zz_new" and rows[-1]["state"] == "unmeasured", "not measured yet: last"
    fine = [i for i in range(N) if f"t{i:04d}" not in FAILED]
    behind = sum(1 for i in fine if i % 3)
    due = sum(1 for i in fine if not i % 3 and i % 2)
    assert pages[0]["counts"] == {"error": 11, "behind": behind, "due": due, "ok": len(fine) - behind - due,
                                  "unmeasured": 1}
    assert fleet.reads <= 2 * 21 + 21, "a Variable read or two per page view, nothing per table"


def test_the_page_shows_each_tables_probe_answer_or_error_and_links_to_its_view(client):
    html = client.get("/", params={"page": 1}).text
    rows = re.findall(r'<tr class="fleet-row state-(\w+)" data-table="(t\d+)"', html)
    assert len(rows) == 50 and {t for _, t in rows[:11]} == FAILED and {s for s, _ in rows[:11]} == {"error"}
    assert "probe: table /data/t0097.lance: region r1: corrupt manifest" in html, "a failed probe says why"
    assert "table &#39;t0000&#39;: permission denied" in html, "a table that could not be measured says why"
    assert '<a href="/?table=t0097">t0097</a>' in html, "each table links to its own view"
    merge = re.search(r'data-table="(t\d+)" data-state="behind".*?<td class="due">(.*?)</td>\s*'
                      r'<td class="not-due">(.*?)</td>', html, re.S)
    assert merge and "<b>merge</b>: " in merge.group(2) and "unmerged generations" in merge.group(2)
    assert merge.group(3) == "catchup, compaction, retention, snapshot, gc", "and what is not due"
    last = client.get("/", params={"page": 99}).text
    assert 'data-table="zz_new"' in last and "not measured yet" in last and "page 21 of 21" in last


def test_sort_by_name_and_filter_and_bad_parameters_are_named(client):
    body = client.get("/api/fleet", params={"sort": "name", "per_page": 3, "q": "t09"}).json()
    assert [r["table"] for r in body["rows"]] == ["t0900", "t0901", "t0902"] and body["total"] == 100
    due = client.get("/api/fleet", params={"sort": "due", "per_page": 500}).json()["rows"]
    assert all(r["probe"]["due"] for r in due[:len(due) // 2 - 10]), "tables with due work first"
    resp = client.get("/api/fleet", params={"sort": "fast"})
    assert resp.status_code == 422 and "sort" in resp.text and "fast" in resp.text
    resp = client.get("/", params={"per_page": 0})
    assert resp.status_code == 422 and "per_page" in resp.text


def test_the_overview_needs_a_signed_in_user(fleet):
    from memwal.airflow.ui.app import create_app

    for path in ("/", "/api/fleet"):
        resp = TestClient(create_app()).get(path)
        assert resp.status_code == 401, (path, resp.status_code)
        assert "t0000" not in resp.text


def test_fleet_page_drops_tables_no_longer_configured_keeps_those_found_under_a_root_and_reports_bad_entries():
    stored = {"old": _row(1) | {"table": "old"}, "a": _row(2) | {"table": "a"},
              "events.clicks": _row(4) | {"table": "events.clicks", "from_probe_only": True}}
    fp = fleet_page({"a": object()}, {"b": "table 'b', key 'uri': missing"}, stored, None)
    assert [r["table"] for r in fp.rows] == ["b", "a", "events.clicks"] and fp.rows[0]["state"] == "error"
    assert "tables file: table 'b'" in fp.rows[0]["error"]
    with pytest.raises(ValueError, match="per_page must be 1 to 500, not 501"):
        fleet_page({}, {}, {}, None, per_page=501)
