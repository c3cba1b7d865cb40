"""The MemWAL page in a real browser (Debian's chromium, headless, driven by Playwright) on a real Airflow.

Sign in through Airflow's login form, open the page from the navigation (Browse -> MemWAL, an iframe),
check the region rows against `memwal status --json`, click "Merge now", watch the memwal_merge run start
and finish, and see the lag drop in the rows, the chart (lag monitor history) and the runs list.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest

from tests.ui.conftest import S3_CONTROLS, TABLE

CHROMIUM = "/usr/bin/chromium"
#: Flags for a headless chromium that talks to nothing but the server under test.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: Columns whose value `memwal status --json` gives exactly (ages move with the clock).
EXACT = ("writer_epoch", "current_generation", "flushed_generation", "merged_generation",
         "unmerged_generations", "unmerged_rows", "unmerged_bytes", "index_lag_generations")

playwright = pytest.importorskip(
    "playwright.sync_api", reason="Python package playwright missing: `make setup` installs requirements.txt")
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} missing: Debian's chromium is installed by `make browser` "
                "(part of `make test` when run as root: apt-get install -y chromium)", allow_module_level=True)


def memwal_status(table: Path) -> dict:
    out = subprocess.run([str(Path(sys.executable).with_name("memwal")), "status", str(table), "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def expected_rows(status: dict) -> dict[str, dict]:
    rows = {}
    for r in status["regions"]:
        flushed = r["flushed_generations"]
        rows[r["region_id"]] = {
            "writer_epoch": r["writer_epoch"], "current_generation": r["current_generation"],
            "flushed_generation": max(flushed) if flushed else None, "merged_generation": r["merged_generation"],
            "unmerged_generations": r["unmerged_generations"], "unmerged_rows": r["unmerged_rows"],
            "unmerged_bytes": r["unmerged_bytes"], "index_lag_generations": r["index_lag_generations"],
        }
    return rows


def page_rows(frame) -> dict[str, dict]:
    """Region rows as the page shows them (each cell's data-value)."""
    cells = frame.locator(f"section[data-table='{TABLE}'] tr.region").evaluate_all(
        "rows => rows.map(r => Object.fromEntries(Array.from(r.cells).filter(c => c.dataset.key)"
        ".map(c => [c.dataset.key, c.dataset.value])))")
    out = {}
    for c in cells:
        out[c["region_id"]] = {k: (int(float(c[k])) if c[k] not in ("", None) else None) for k in EXACT}
    return out


def screenshot(page, frame, path: Path, regions: int) -> None:
    """A screenshot of the page with the MemWAL view loaded in its iframe (the same document before and
    after the shot, so the picture cannot be of a frame that was still loading). The page's load event, not
    "networkidle": Airflow's UI keeps polling, and on a loaded machine 500 ms without a request did not come
    within 30 s (a fresh-clone make test beside a busy core)."""
    page.wait_for_load_state("load", timeout=60_000)
    frame.locator(f"section[data-table='{TABLE}'] tr.region").nth(regions - 1).wait_for(timeout=60_000)
    frame.locator("body").evaluate("b => { b.dataset.shot = '1'; }")
    page.screenshot(path=str(path))
    assert frame.locator(f"body[data-shot='1'] section[data-table='{TABLE}'] tr.region").count() == regions, \
        "the MemWAL frame reloaded while the screenshot was taken"


def open_table(page):
    """The MemWAL frame opens on the fleet overview: follow its link to the table's own view."""
    frame = page.frame_locator("iframe")
    frame.locator(f"tr.fleet-row[data-table='{TABLE}'] td.name a").click()
    frame.locator(f"section[data-table='{TABLE}']").wait_for(timeout=60_000)
    return frame


def run_lag_monitor(af) -> None:
    """One lag-monitor run: the page's table is measured; the S3 positive-control tables (connections
    without endpoint or keys, see conftest) cannot be, so their checks and therefore the run fail."""
    run_id = af.trigger_dag("memwal_lag_monitor")
    state = af.wait_for_run("memwal_lag_monitor", run_id, timeout=240)
    tasks = {ti["task_id"]: ti["state"] for ti in af.task_instances("memwal_lag_monitor", run_id)}
    assert tasks == {"check_tables": "failed"}, tasks
    assert state == "failed", "a table whose lag cannot be measured fails the monitor's run"
    headers = {"Authorization": f"Bearer {af.token('viewer')}"}
    rows = {r["table"]: r for r in httpx.get(f"{af.url}/memwal/api/fleet", headers=headers, timeout=60).json()["rows"]}
    assert rows[TABLE]["error"] is None and rows[TABLE]["state"] in ("behind", "due"), rows[TABLE]
    assert all(rows[name]["state"] == "error" for name in S3_CONTROLS), "the overview reports the failing ones"


@pytest.mark.slow
def test_page_shows_status_and_merge_now_drops_the_lag(ui_airflow, ui_table, tmp_path):
    af = ui_airflow
    af.wait_for_dag("memwal_merge", timeout=120)
    af.set_paused("memwal_merge", False)
    run_lag_monitor(af)  # one history sample before the merge
    before = memwal_status(ui_table)
    assert before["unmerged_generations"] > 0, "the fixture table must have work to merge"

    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(f"{af.url}/")
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", af.passwords["admin"])
            page.click("button[type=submit]")
            # The external view is in Airflow's navigation: Browse -> MemWAL opens it in the UI's iframe.
            page.get_by_role("button", name="Browse").click()
            page.get_by_role("menuitem", name="MemWAL").click()
            page.wait_for_url("**/plugin/memwal", timeout=30_000)
            frame = open_table(page)
            screenshot(page, frame, tmp_path / "memwal-page-before.png", len(before["regions"]))

            shown = page_rows(frame)
            assert shown == expected_rows(before), "region rows must equal `memwal status --json`"
            assert frame.locator(f"section[data-table='{TABLE}'] tr.region.over").count() == len(before["regions"]), \
                "every region is over max_unmerged_generations=1 and must be marked"

            frame.locator(f"section[data-table='{TABLE}'] .summary button.merge").click()
            status = frame.locator(f".merge-status[data-table='{TABLE}']")
            expect(status).to_contain_text("memwal_merge run", timeout=30_000)
            expect(status).to_have_attribute("data-run-id", re.compile(r"\S+"))
            run_id = status.get_attribute("data-run-id")
            triggered = af.dag_run("memwal_merge", run_id)
            assert triggered["conf"]["table"] == TABLE
            assert af.wait_for_run("memwal_merge", run_id, timeout=150) == "success"

            # The page reloads itself when the run ends: the rows show the merge, the runs list shows the run.
            frame.locator(f"tr.run[data-run-id='{run_id}'] .state-success").wait_for(timeout=60_000)
            after = memwal_status(ui_table)
            assert after["unmerged_generations"] == 0
            assert page_rows(frame) == expected_rows(after)
            assert frame.locator(f"section[data-table='{TABLE}'] tr.region.over").count() == 0
            link = frame.locator(f"tr.run[data-run-id='{run_id}'] a")
            assert unquote(link.get_attribute("href")) == f"/dags/memwal_merge/runs/{run_id}"
            assert "merge:" in frame.locator(f"tr.run[data-run-id='{run_id}']").inner_text()

            run_lag_monitor(af)  # a second history sample after the merge: the chart drops
            # Airflow keeps the frame's address in its own URL (/plugin/memwal/memwal/?table=...), so a
            # reload comes back to the table's view, not to the overview.
            page.reload()
            page.wait_for_url(re.compile(rf"/plugin/memwal/memwal/\?table={TABLE}$"), timeout=30_000)
            frame = page.frame_locator("iframe")
            chart = frame.locator(f"section[data-table='{TABLE}'] svg.lag-chart")
            chart.wait_for(timeout=60_000)
            assert int(chart.get_attribute("data-points")) >= 2
            line = chart.locator("polyline[data-series='unmerged_generations']").get_attribute("points")
            ys = [float(pt.split(",")[1]) for pt in line.split()]
            assert ys[-1] > ys[0], "the chart's last point (after the merge) is lower lag than the first"
            shot = tmp_path / "memwal-page.png"
            screenshot(page, frame, shot, len(after["regions"]))
            print(f"screenshots: {tmp_path / 'memwal-page-before.png'} {shot}")
        finally:
            browser.close()
