"""Who may see the MemWAL page and who may merge: Airflow's own users and permissions.

Airflow does not protect a plugin's FastAPI app, so every route here depends on `signed_in_user`
(Airflow's `get_user`: the UI's `_token` cookie or an `Authorization: Bearer` token; anonymous is 401)
and "Merge now" additionally on `may_trigger_merge` (the auth manager's permission to create a run of
`memwal_merge`; a viewer gets 403). The caller's own token is what "Merge now" forwards to Airflow's
REST API, so the run is created as that user, never as a service account.
"""

from __future__ import annotations

from typing import Annotated

from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.core_api.security import bearer_scheme, get_user, requires_access_dag
from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials

MERGE_DAG_ID = "memwal_merge"
#: A header a cross-site form cannot send without a CORS preflight: required on every state change.
CSRF_HEADER = "X-MemWAL-Request"

__all__ = [
    "CSRF_HEADER",
    "MERGE_DAG_ID",
    "SignedInUser",
    "caller_token",
    "can_read_dag",
    "may_trigger_merge",
    "require_csrf_header",
    "signed_in_user",
]


async def signed_in_user(user: Annotated[BaseUser, Depends(get_user)]) -> BaseUser:
    """The signed-in Airflow user (401 when anonymous, 403 when the token is invalid)."""
    return user


SignedInUser = Annotated[BaseUser, Depends(signed_in_user)]

#: Permission to create a run of memwal_merge (the same check as Airflow's POST dagRuns endpoint).
may_trigger_merge = requires_access_dag("POST", DagAccessEntity.RUN, param_dag_id=MERGE_DAG_ID)


def caller_token(
    request: Request, bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> str:
    """The token the caller authenticated with (bearer header first, like `get_user`, then the UI cookie)."""
    if bearer and bearer.scheme.lower() == "bearer":
        return bearer.credentials
    token = request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    if not token:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "Not authenticated")
    return token


def require_csrf_header(request: Request) -> None:
    """Refuse a state-changing request without the page's custom header (no cross-site form posts)."""
    if request.headers.get(CSRF_HEADER) != "1":
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"missing header {CSRF_HEADER}: 1")


def can_read_dag(user: BaseUser, dag_id: str, entity: DagAccessEntity = DagAccessEntity.RUN) -> bool:
    """Whether the user may read `entity` (runs, XCom) of `dag_id` (used to filter what the page shows)."""
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().is_authorized_dag(
        method="GET", access_entity=entity, details=DagDetails(id=dag_id), user=user
    )
