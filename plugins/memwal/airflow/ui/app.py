"""The MemWAL page: a FastAPI app mounted in Airflow's API server by the plugin (`/memwal`).

Routes (all require a signed-in Airflow user; Airflow does not protect plugin apps by itself):
  GET  /                         the fleet overview: every table, worst lag first, paged (page, per_page,
                                 sort=lag|due|name, q), with the lag monitor's last figures and the probe's
                                 answer (what is due and why, or the error), read from the last cycle's rows
                                 (`memwal.airflow.fleet_status`): no table is opened
  GET  /?table=NAME              one table: the region rows, the indexes, what a search pays now, the lag
                                 chart, the last runs (read from the table now)
  GET  /api/fleet                the overview's page as JSON (same parameters)
  GET  /api/tables[/{table}]     the per-table data as JSON (region rows as `memwal status --json` + marks;
                                 /api/tables opens every table: for a few tables, not a fleet)
  GET  /api/runs/{dag_id}/{run}  state of one memwal run (the page polls it after "Merge now")
  POST /api/tables/{table}/merge "Merge now" (body {"regions": [...]} or none for the whole table):
                                 triggers memwal_merge as the caller; needs permission to trigger it
"""

from __future__ import annotations

import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from html import escape
from pathlib import Path
from threading import Lock
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Body, Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.responses import HTMLResponse, JSONResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from memwal.airflow.ui import URL_PREFIX, sources
from memwal.airflow.ui.auth import (
    CSRF_HEADER,
    MERGE_DAG_ID,
    SignedInUser,
    caller_token,
    can_read_dag,
    may_trigger_merge,
    require_csrf_header,
    signed_in_user,
)
from memwal.airflow.ui.chart import lag_chart_svg
from memwal.airflow.ui.formatting import fmt, fmt_bytes, fmt_limit, fmt_time
from memwal.airflow.ui.merge_now import MergeRequestError, trigger_merge
from memwal.airflow.ui.overview import DEFAULT_PER_PAGE, MAX_PER_PAGE, SORTS, FleetPage, fleet_page
from memwal.airflow.ui.regions import COLUMNS, INDEX_COLUMNS, SEARCH_COLUMNS, TableView

__all__ = ["URL_PREFIX", "create_app"]

log = logging.getLogger(__name__)
_HERE = Path(__file__).parent
_STATIC = {"memwal.js": "text/javascript", "memwal.css": "text/css"}
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_SERIES_LABELS = {"unmerged_generations": "unmerged generations", "max_index_lag_generations": "index lag"}


def _load_tables() -> dict[str, Any]:
    return _load_tables_and_errors()[0]


#: How long a parsed tables file is reused while the file is unchanged (the `memwal_tables` Variable is read
#: again after it): parsing 1,000 entries takes about a second, too long for every page view.
CONFIG_TTL_S = 30.0
_config_cache: dict[str, Any] = {}
_config_lock = Lock()


def _load_tables_and_errors() -> tuple[dict[str, Any], dict[str, Exception]]:
    """Configured tables and the error of each bad entry (a bad entry never hides the good ones); the last
    parse is reused for CONFIG_TTL_S while the tables file's size and time are unchanged."""
    from memwal.airflow.config import TableConfigError, load_tables_and_errors, tables_file

    try:
        stat = tables_file().stat()
        key: Any = (str(tables_file()), stat.st_mtime_ns, stat.st_size)
    except OSError:
        key = None  # no file: load_tables_and_errors says so
    with _config_lock:
        cached = _config_cache.get("entry")
        if key is not None and cached and cached[0] == key and time.monotonic() - cached[1] < CONFIG_TTL_S:
            return cached[2]
        try:
            loaded = load_tables_and_errors()
        except TableConfigError as exc:
            raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR, f"tables configuration: {exc}") from exc
        _config_cache["entry"] = (key, time.monotonic(), loaded)
        return loaded


def _table_config(name: str) -> Any:
    tables = _load_tables()
    if name not in tables:
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"unknown table {name!r}: configured tables are {sorted(tables)}")
    return tables[name]


def _table_views(configs: list[Any], user: Any) -> list[TableView]:
    """Each table's view, read in parallel (status is object-store I/O; one slow table does not add up)."""
    if len(configs) <= 1:
        return [sources.table_view(cfg, user) for cfg in configs]
    with ThreadPoolExecutor(max_workers=min(4, len(configs))) as pool:
        return list(pool.map(lambda cfg: sources.table_view(cfg, user), configs))


def _is_paused(dag_id: str) -> bool:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return bool(session.scalar(select(DagModel.is_paused).where(DagModel.dag_id == dag_id)))


def _view_json(view: TableView) -> dict:
    return jsonable_encoder({
        "name": view.name, "uri": view.uri, "error": view.error, "notes": view.notes,
        "summary": view.summary, "regions": view.regions, "regions_over": view.regions_over,
        "indexes": view.indexes, "search": view.search, "history": view.history,
        "runs": view.runs,
    })


def _fleet_page(page: int, per_page: int, sort: str, q: str) -> FleetPage:
    """The overview's page from the tables file and the last cycle's rows (no table opened)."""
    from memwal.airflow import fleet_status

    if sort not in SORTS:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"sort must be one of {', '.join(SORTS)}, "
                                                                  f"not {sort!r}")
    tables, bad = _load_tables_and_errors()
    try:
        stored, measured_at = fleet_status.load_rows()
    except Exception as exc:  # the DB or a garbled Variable: the overview still lists the tables
        log.warning("fleet status not read: %s", exc)
        stored, measured_at = {}, None
    return fleet_page(tables, {k: str(v) for k, v in bad.items()}, stored, measured_at, page=page,
                      per_page=per_page, sort=sort, query=q)


def create_app() -> FastAPI:
    """The MemWAL FastAPI app; every route depends on a signed-in Airflow user."""
    app = FastAPI(title="MemWAL", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(signed_in_user)])
    env = Environment(loader=FileSystemLoader(_HERE / "templates"), autoescape=select_autoescape(["html"]))
    env.filters.update(fmt=fmt, fmt_time=fmt_time, fmt_bytes=fmt_bytes, fmt_limit=fmt_limit)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        if "text/html" in request.headers.get("accept", "") and exc.status_code == status.HTTP_401_UNAUTHORIZED:
            login = escape("/auth/login?next=" + quote(str(request.url), safe=""))
            body = (f'<!doctype html><title>Sign in</title><p>Sign in to Airflow to see this page: '
                    f'<a href="{login}" target="_top">sign in</a></p>')
            return HTMLResponse(body, status_code=exc.status_code)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.get("/", response_class=HTMLResponse)
    def page(request: Request, user: SignedInUser, table: str | None = None,
             page: Annotated[int, Query(ge=1)] = 1,
             per_page: Annotated[int, Query(ge=1, le=MAX_PER_PAGE)] = DEFAULT_PER_PAGE,
             sort: str = "lag", q: str = "") -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/")
        if not table:
            html = env.get_template("overview.html").render(
                fp=_fleet_page(page, per_page, sort, q), sorts=SORTS, user=user.get_name(), base=base,
                csrf_header=CSRF_HEADER)
            return HTMLResponse(html, headers={"Cache-Control": "no-store"})
        tables, bad = _load_tables_and_errors()
        views = _table_views([_table_config(table)], user)
        for v in views:
            v.chart = lag_chart_svg(v.history, sources.HISTORY_SERIES, _SERIES_LABELS)
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

        can_merge = get_auth_manager().is_authorized_dag(
            method="POST", access_entity=DagAccessEntity.RUN, details=DagDetails(id=MERGE_DAG_ID), user=user)
        html = env.get_template("page.html").render(
            merge_paused=can_merge and _is_paused(MERGE_DAG_ID),
            views=views, columns=COLUMNS, index_columns=INDEX_COLUMNS, search_columns=SEARCH_COLUMNS,
            can_merge=can_merge, user=user.get_name(),
            base=base, csrf_header=CSRF_HEADER,
            all_tables=sorted(tables), selected=table, bad_tables={k: str(v) for k, v in bad.items()},
        )
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in _STATIC:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no static file {name!r}")
        return Response((_HERE / "static" / name).read_bytes(), media_type=_STATIC[name])

    @app.get("/api/fleet")
    def fleet_json(user: SignedInUser, page: Annotated[int, Query(ge=1)] = 1,
                   per_page: Annotated[int, Query(ge=1, le=MAX_PER_PAGE)] = DEFAULT_PER_PAGE,
                   sort: str = "lag", q: str = "") -> dict:
        fp = _fleet_page(page, per_page, sort, q)
        return jsonable_encoder({k: getattr(fp, k) for k in ("rows", "total", "page", "pages", "per_page", "sort",
                                                             "query", "measured_at", "counts")})

    @app.get("/api/tables")
    def tables_json(user: SignedInUser) -> list[dict]:
        return [_view_json(v) for v in _table_views([cfg for _, cfg in sorted(_load_tables().items())], user)]

    @app.get("/api/tables/{table}")
    def table_json(table: str, user: SignedInUser) -> dict:
        return _view_json(sources.table_view(_table_config(table), user))

    @app.get("/api/runs/{dag_id}/{run_id}")
    def run_state(dag_id: str, run_id: str, user: SignedInUser) -> dict:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import select

        if not (dag_id == MERGE_DAG_ID or dag_id.startswith("memwal_maintenance__")):
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"{dag_id} is not a MemWAL DAG")
        if not can_read_dag(user, dag_id):
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"no permission to read runs of {dag_id}")
        with create_session() as session:
            dr = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
            if dr is None:
                raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run {run_id!r} of {dag_id}")
            state = dr.state.value if hasattr(dr.state, "value") else str(dr.state)
            return {"dag_id": dag_id, "run_id": run_id, "state": state,
                    "start_date": dr.start_date, "end_date": dr.end_date}

    @app.post("/api/tables/{table}/merge", status_code=status.HTTP_201_CREATED,
              dependencies=[Depends(require_csrf_header), Depends(may_trigger_merge)])
    def merge_now(
        request: Request,
        table: str,
        token: Annotated[str, Depends(caller_token)],
        body: Annotated[dict | None, Body()] = None,
    ) -> dict:
        _table_config(table)
        regions = (body or {}).get("regions") or []
        if not isinstance(regions, list):
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "regions must be a list of region ids")
        bad = [r for r in regions if not isinstance(r, str) or not _UUID.match(r)]
        if bad:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                f"malformed region id {bad[0]!r} for table {table} (expected a UUID)")
        try:
            run = trigger_merge(token, table, regions, transport=getattr(app.state, "api_transport", None),
                                base_url=getattr(app.state, "api_base_url", None))
        except MergeRequestError as exc:
            raise HTTPException(exc.status_code, str(exc)) from exc
        return {"dag_id": run.dag_id, "dag_run_id": run.dag_run_id, "state": run.state, "conf": run.conf,
                "url": f"/dags/{run.dag_id}/runs/{quote(run.dag_run_id, safe='')}"}

    return app
