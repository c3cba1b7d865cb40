"""The MemWAL page in the Airflow UI: a FastAPI app in the API server shown as an external view.

`fastapi_app()` and `external_view()` are what the plugin class lists in `fastapi_apps` and
`external_views`: the app is mounted at `/memwal` and the navigation shows it in an iframe at
`/plugin/memwal`. Importing this package imports neither FastAPI nor Airflow.
"""

from __future__ import annotations

from typing import Any

__all__ = ["URL_PREFIX", "external_view", "fastapi_app"]

URL_PREFIX = "/memwal"


def fastapi_app() -> dict[str, Any]:
    """The `fastapi_apps` entry: the page's app mounted at /memwal in Airflow's API server."""
    from memwal.airflow.ui.app import create_app

    return {"app": create_app(), "url_prefix": URL_PREFIX, "name": "MemWAL"}


def external_view() -> dict[str, Any]:
    """The `external_views` entry: "MemWAL" in the navigation, rendering /memwal/ in an iframe."""
    return {
        "name": "MemWAL",
        "href": f"{URL_PREFIX}/",
        "url_route": "memwal",
        "destination": "nav",
        "category": "browse",
    }
