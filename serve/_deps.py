"""What every router shares: the app's state, the bearer API key, the organisation member,
path parameters used by several domains, the error responses every route declares.

Every route under ``/api/orgs/{org}`` authenticates a bearer API key and checks that its
principal belongs to ``{org}``; a principal of another organisation gets 404, exactly as if
nothing existed there, so no route tells one tenant anything about another. This module
imports no router.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from cortex_ray import Executor, Principal, Runtime
from serve._errors import ApiProblem
from serve.schemas import ORG_PATTERN, ApiError

__all__ = [
    "ERRORS",
    "MAX_WAIT_S",
    "NOT_ADMIN",
    "AgentRef",
    "ApiState",
    "MemberDep",
    "OrgPath",
    "StateDep",
    "authenticate",
    "member",
    "org_router",
    "retrieve",
    "state_of",
]

log = logging.getLogger("serve.api")

MAX_WAIT_S = 60.0
"""The longest long poll a route offers (``wait``)."""


def retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a background task's error as retrieved: a turn (or wait) outlives its request
    when the client goes away, and the request reports the error when still there, so
    asyncio must not warn."""
    if not task.cancelled() and (error := task.exception()) is not None:
        log.debug("background %s ended with %r", task, error)


@dataclass(frozen=True, slots=True)
class ApiState:
    """What the routes use: the open runtime and the executor, and the turns this process
    is waiting on (held here: asyncio keeps only weak references to tasks, and a turn must
    outlive the request whose client went away)."""

    runtime: Runtime
    executor: Executor
    turns: set[asyncio.Future[Any]] = field(default_factory=set)

    def keep(self, task: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """Hold ``task`` until it ends."""
        self.turns.add(task)
        task.add_done_callback(self.turns.discard)
        task.add_done_callback(retrieve)
        return task


def state_of(request: Request) -> ApiState:
    """The app's open runtime and executor (503 before start-up has opened them)."""
    state: ApiState | None = getattr(request.app.state, "api", None)
    if state is None:
        raise ApiProblem(503, "the runtime is not open yet")
    return state


StateDep = Annotated[ApiState, Depends(state_of)]

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="apiKey",
    description="An API key from `cortex-ray api-keys create`: `Authorization: Bearer crx_…`",
)


async def authenticate(
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The principal of the request's bearer API key (401 without one, or an unknown one)."""
    if credentials is None:
        raise ApiProblem(
            401,
            "missing API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = await state.runtime.authenticate(credentials.credentials)
    if principal is None:
        raise ApiProblem(
            401,
            "unknown or revoked API key",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    return principal


OrgPath = Annotated[str, Path(pattern=ORG_PATTERN, description="the organisation (tenant) id")]


async def member(org: OrgPath, principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
    """The authenticated principal, a member of ``{org}``."""
    # 404, not 403: to a principal of another organisation, nothing exists there.
    if principal.org_id != org:
        raise ApiProblem(404, f"organisation {org!r} not found")
    return principal


MemberDep = Annotated[Principal, Depends(member)]
AgentRef = Annotated[
    str, Path(pattern=r"^[^\x00]{1,200}$", description="the agent's id or its name")
]

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ApiError, "description": text}
    for status, text in (
        (401, "no valid API key"),
        (404, "not found in this organisation (or another organisation's path)"),
        (422, "invalid request"),
    )
}
"""The errors every route of an organisation may answer."""

NOT_ADMIN: dict[int | str, dict[str, Any]] = {
    403: {"model": ApiError, "description": "not an admin"}
}


def org_router(tags: list[str] | None = None) -> APIRouter:
    """A router of routes under ``/api/orgs/{org}``, each for members of ``{org}`` only."""
    return APIRouter(
        prefix="/api/orgs/{org}",
        dependencies=[Depends(member)],
        responses=dict(ERRORS),
        tags=list(tags or ()),
    )
