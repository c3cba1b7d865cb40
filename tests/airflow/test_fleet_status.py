"""The fleet status rows (`memwal.airflow.fleet_status`): one JSON object per source, overwritten each cycle;
the page's rows are the lag monitor's with the newer probe answer of either source, plus the tables only the
fleet probe found (under a root). The Variables are a dict here."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memwal.airflow import fleet_status


class _Variables(dict):
    def set(self, key, value):
        self[key] = value


@pytest.fixture
def variables(monkeypatch):
    store = _Variables()
    monkeypatch.setattr(fleet_status, "_backend", lambda: store)
    return store


def _probe(at: float, job: str | None) -> dict:
    return {"status": "ok", "due": [{"job": job, "reason": "why"}] if job else [], "not_due": [], "error": None,
            "changed": False, "probed_at": at}


def test_rows_merge_the_newer_probe_answer_and_the_tables_only_the_fleet_probe_found(variables):
    at = datetime(2026, 11, 27, 12, tzinfo=UTC)
    fleet_status.save(fleet_status.LAG_MONITOR, [
        fleet_status.row_of({"table": "a", "breaches": ["x"]}, "/a", probe=_probe(10.0, "merge")),
        fleet_status.row_of({"table": "b"}, "/b", probe=_probe(30.0, None))], at)
    fleet_status.save(fleet_status.FLEET_PROBE, [
        fleet_status.row_of({"table": "a"}, "/a", probe=_probe(20.0, "gc")),
        fleet_status.row_of({"table": "b"}, "/b", probe=_probe(25.0, "gc")),
        fleet_status.row_of({"table": "root.c"}, "/root/c.lance", probe=_probe(20.0, "snapshot"))], at)
    rows, measured_at = fleet_status.load_rows()
    assert measured_at == "2026-11-27T12:00:00+00:00"
    assert rows["a"]["probe"]["due"][0]["job"] == "gc" and rows["a"]["breaches"] == ["x"], "newer probe answer"
    assert rows["b"]["probe"]["due"] == [], "the lag monitor's own answer was newer"
    assert rows["root.c"]["from_probe_only"] and rows["root.c"]["probe"]["due"][0]["job"] == "snapshot"
    fleet_status.save(fleet_status.LAG_MONITOR, [], at)
    assert {n for n, r in fleet_status.load_rows()[0].items() if not r.get("from_probe_only")} == set(), (
        "the lag monitor's rows are overwritten by its next cycle")


def test_nothing_stored_yet_a_garbled_value_and_a_bad_source(variables):
    assert fleet_status.load_rows() == ({}, None)
    variables[fleet_status.VARIABLE_PREFIX + fleet_status.LAG_MONITOR] = '{"at": 1}'
    assert fleet_status.load(fleet_status.LAG_MONITOR) is None, "no tables: not a cycle's rows"
    with pytest.raises(ValueError, match="source 'mine' is not one of lag_monitor, fleet_probe"):
        fleet_status.save("mine", [], datetime.now(UTC))
