"""MemWalPlugin: what Airflow loads from the plugins folder for the MemWAL platform.

Airflow imports `plugins/memwal_plugin.py` (the only file its plugin loader scans; `plugins/.airflowignore`
hides the library), which imports this class. The lists below are what the class registers; other
modules add their parts in `_collect()` (the UI page: `memwal.airflow.ui.fastapi_app()` /
`external_view()`), or append to these lists before the plugin manager reads them.
Operators, hooks and the `memwal` connection type need no plugin: they are imported by DAG files and
registered through the `apache_airflow_provider` entry point.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.plugins_manager import AirflowPlugin

__all__ = ["EXTERNAL_VIEWS", "FASTAPI_APPS", "FASTAPI_ROOT_MIDDLEWARES", "MACROS", "REACT_APPS", "MemWalPlugin"]

log = logging.getLogger(__name__)

FASTAPI_APPS: list[dict[str, Any]] = []
FASTAPI_ROOT_MIDDLEWARES: list[dict[str, Any]] = []
EXTERNAL_VIEWS: list[dict[str, Any]] = []
REACT_APPS: list[dict[str, Any]] = []
MACROS: list[Any] = []


def _collect() -> None:
    """Add the parts that live in other modules (each optional: a missing one is logged, not fatal)."""
    try:
        from memwal.airflow import ui
    except ImportError as exc:
        log.info("MemWAL UI page not available: %s", exc)
        return
    if not any(a.get("url_prefix") == ui.URL_PREFIX for a in FASTAPI_APPS):
        FASTAPI_APPS.append(ui.fastapi_app())
        EXTERNAL_VIEWS.append(ui.external_view())


_collect()


class MemWalPlugin(AirflowPlugin):
    """The MemWAL platform's Airflow plugin (UI page and anything else Airflow loads from plugins)."""

    name = "memwal"
    fastapi_apps = FASTAPI_APPS
    fastapi_root_middlewares = FASTAPI_ROOT_MIDDLEWARES
    external_views = EXTERNAL_VIEWS
    react_apps = REACT_APPS
    macros = MACROS
