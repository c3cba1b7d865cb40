""""Merge now": trigger `memwal_merge` through Airflow's REST API v2 as the signed-in user.

The caller's own token is forwarded, so Airflow checks the caller's permission again, records the caller
as the run's triggering user, and validates the params exactly as the trigger form does. The API is
reached at `MEMWAL_UI_API_URL`, else `[api] base_url`, else this API server on 127.0.0.1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import httpx

from memwal.airflow.ui.auth import MERGE_DAG_ID

__all__ = ["MergeRequestError", "api_base_url", "trigger_merge"]


class MergeRequestError(Exception):
    """Airflow refused or failed the trigger; `status_code` and `detail` are Airflow's answer."""

    def __init__(self, status_code: int, detail: Any) -> None:
        super().__init__(f"Airflow refused to trigger {MERGE_DAG_ID} ({status_code}): {detail}")
        self.status_code = status_code
        self.detail = detail


@dataclass(frozen=True)
class TriggeredRun:
    dag_id: str
    dag_run_id: str
    state: str
    conf: dict


def api_base_url() -> str:
    """Where this process reaches Airflow's REST API (the API server it runs in)."""
    from airflow.configuration import conf

    explicit = os.environ.get("MEMWAL_UI_API_URL") or conf.get("api", "base_url", fallback=None)
    if explicit:
        return explicit.rstrip("/")
    return f"http://127.0.0.1:{conf.getint('api', 'port', fallback=8080)}"


def trigger_merge(
    token: str,
    table: str,
    regions: list[str] | None = None,
    *,
    transport: httpx.BaseTransport | None = None,
    base_url: str | None = None,
    timeout_s: float = 30.0,
) -> TriggeredRun:
    """POST /api/v2/dags/memwal_merge/dagRuns with conf {table[, regions]} as the token's user."""
    conf: dict[str, Any] = {"table": table}
    if regions:
        conf["regions"] = list(regions)
    with httpx.Client(
        base_url=base_url or api_base_url(), transport=transport, timeout=timeout_s,
        headers={"Authorization": f"Bearer {token}"},
    ) as client:
        resp = client.post(f"/api/v2/dags/{MERGE_DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text
        raise MergeRequestError(resp.status_code, detail)
    body = resp.json()
    return TriggeredRun(dag_id=body["dag_id"], dag_run_id=body["dag_run_id"], state=str(body.get("state")),
                        conf=body.get("conf") or conf)
