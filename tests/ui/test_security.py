"""The MemWAL page on a real Airflow: every route needs a signed-in user, "Merge now" needs permission to
trigger memwal_merge, and state changes need the page's header (no cross-site form posts)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.ui.conftest import S3_CONTROLS, S3_SECRET, S3_TABLE, TABLE

from support.s3_decoy import NOT_REACHED

ROUTES = [
    ("GET", "/memwal/"),
    ("GET", "/memwal/static/memwal.js"),
    ("GET", "/memwal/api/tables"),
    ("GET", "/memwal/api/fleet"),
    ("GET", f"/memwal/api/tables/{TABLE}"),
    ("GET", "/memwal/api/runs/memwal_merge/some-run"),
    ("POST", f"/memwal/api/tables/{TABLE}/merge"),
]
MERGE = f"/memwal/api/tables/{TABLE}/merge"
CSRF = {"X-MemWAL-Request": "1"}


def _merge_runs(af) -> list[dict]:
    resp = af.request("GET", "/api/v2/dags/memwal_merge/dagRuns", expect=(200, 404))
    return [] if resp is None or "dag_runs" not in resp else resp["dag_runs"]


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_anonymous_request_is_refused(ui_airflow, method, path):
    resp = httpx.request(method, ui_airflow.url + path, headers=CSRF, timeout=30)
    assert resp.status_code == 401, f"{method} {path} answered {resp.status_code} to an anonymous caller"
    assert "rows" not in resp.text and "region" not in resp.text.lower()


def test_forged_token_is_refused(ui_airflow):
    resp = httpx.get(ui_airflow.url + "/memwal/api/tables", headers={"Authorization": "Bearer not.a.jwt"},
                     timeout=30)
    assert resp.status_code in (401, 403)


def test_anonymous_browser_gets_a_sign_in_link(ui_airflow):
    resp = httpx.get(ui_airflow.url + "/memwal/", headers={"Accept": "text/html"}, timeout=30)
    assert resp.status_code == 401
    assert "/auth/login?next=" in resp.text
    resp = httpx.get(ui_airflow.url + "/memwal/?x='\"><script>alert(1)</script>", headers={"Accept": "text/html"},
                     timeout=30)
    assert resp.status_code == 401 and "<script>" not in resp.text, "the sign-in link must be escaped"


def test_viewer_sees_the_page_without_merge_buttons(ui_airflow):
    headers = {"Authorization": f"Bearer {ui_airflow.token('viewer')}"}
    overview = httpx.get(ui_airflow.url + "/memwal/", headers=headers, timeout=60)
    assert overview.status_code == 200 and f'data-table="{TABLE}"' in overview.text, "the overview lists it"
    assert f'href="/memwal/?table={TABLE}"' in overview.text, "and links to the table's own view"
    resp = httpx.get(ui_airflow.url + "/memwal/", params={"table": TABLE}, headers=headers, timeout=60)
    assert resp.status_code == 200
    assert f'data-table="{TABLE}"' in resp.text and 'class="region' in resp.text
    assert 'class="health"' in resp.text and "table versions" in resp.text, "the table's health is on the page"
    assert "Merge now" not in resp.text, "a viewer must not be offered Merge now"


def test_viewer_cannot_merge(ui_airflow):
    before = len(_merge_runs(ui_airflow))
    headers = {"Authorization": f"Bearer {ui_airflow.token('viewer')}", **CSRF}
    resp = httpx.post(ui_airflow.url + MERGE, headers=headers, json={}, timeout=60)
    assert resp.status_code == 403, resp.text
    assert len(_merge_runs(ui_airflow)) == before, "a refused merge must not create a DAG run"


def test_merge_without_the_page_header_is_refused(ui_airflow):
    headers = {"Authorization": f"Bearer {ui_airflow.token('admin')}"}
    resp = httpx.post(ui_airflow.url + MERGE, headers=headers, json={}, timeout=60)
    assert resp.status_code == 403
    assert "X-MemWAL-Request" in resp.json()["detail"]


def test_bad_input_names_the_table_or_region(ui_airflow):
    headers = {"Authorization": f"Bearer {ui_airflow.token('admin')}", **CSRF}
    resp = httpx.post(ui_airflow.url + "/memwal/api/tables/nope/merge", headers=headers, json={}, timeout=60)
    assert resp.status_code == 404 and "nope" in resp.json()["detail"]
    resp = httpx.post(ui_airflow.url + MERGE, headers=headers, json={"regions": ["not-a-uuid"]}, timeout=60)
    assert resp.status_code == 422 and "not-a-uuid" in resp.json()["detail"]


def test_a_table_on_s3_is_read_through_its_connection_and_no_secret_reaches_the_page(ui_airflow, ui_s3_table):
    headers = {"Authorization": f"Bearer {ui_airflow.token('viewer')}"}
    table = httpx.get(f"{ui_airflow.url}/memwal/api/tables/{S3_TABLE}", headers=headers, timeout=60).json()
    assert table["error"] is None, table["error"]
    assert table["uri"] == ui_s3_table and len(table["regions"]) == 2
    assert table["summary"]["unmerged_generations"] == 2
    page = httpx.get(f"{ui_airflow.url}/memwal/", params={"table": S3_TABLE}, headers=headers, timeout=60).text
    assert f'data-table="{S3_TABLE}"' in page
    for body in (page, json.dumps(table)):
        assert S3_SECRET not in body, "the connection's secret must never reach the page"


@pytest.mark.parametrize("control", sorted(S3_CONTROLS))
def test_the_s3_table_cannot_be_read_without_its_connections_endpoint_or_keys(ui_airflow, control):
    """Positive control of the test above: the same table through a connection without its endpoint or its
    keys shows an error instead of regions (the page's processes reach no S3 through the environment)."""
    headers = {"Authorization": f"Bearer {ui_airflow.token('viewer')}"}
    table = httpx.get(f"{ui_airflow.url}/memwal/api/tables/{control}", headers=headers, timeout=60).json()
    assert table["error"] and NOT_REACHED.search(table["error"]), table
    assert not table.get("regions"), table


def test_merge_now_runs_as_the_signed_in_user(ui_airflow, ui_table):
    """A region's "Merge now": the memwal_merge run carries the region and was triggered by the caller."""
    from memwal.status import table_status

    ui_airflow.wait_for_dag("memwal_merge", timeout=120)
    region = table_status(str(ui_table)).regions[0].region_id
    headers = {"Authorization": f"Bearer {ui_airflow.token('admin')}", **CSRF}
    resp = httpx.post(ui_airflow.url + MERGE, headers=headers, json={"regions": [region]}, timeout=60)
    assert resp.status_code == 201, resp.text
    body = resp.json()
    run = ui_airflow.dag_run("memwal_merge", body["dag_run_id"])
    assert run["conf"] == {"table": TABLE, "regions": [region]}
    assert run["triggering_user_name"] == "admin", "the run must be triggered as the signed-in user"
    assert body["url"].startswith("/dags/memwal_merge/runs/")
