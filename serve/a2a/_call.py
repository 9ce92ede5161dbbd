"""One A2A call: who calls which agent (set by the route), whether the agent is published,
and the runtime's refusals as A2A errors."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from a2a.server.context import ServerCallContext
from a2a.utils.errors import A2AError, InternalError, InvalidParamsError, InvalidRequestError

from cortex_ray import Agent, CortexError, Principal
from serve._deps import ApiState
from serve._errors import report

__all__ = ["A2ACall", "a2a_error", "agent_of", "call_of", "door", "published"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class A2ACall:
    """Who calls which agent: set by the route (after the bearer key and the organisation
    are checked) in the call context's ``state["cortex"]``."""

    api: ApiState
    org: str
    agent_ref: str
    principal: Principal


def call_of(context: ServerCallContext) -> A2ACall:
    call = context.state.get("cortex")
    if not isinstance(call, A2ACall):  # only reachable through the route, which sets it
        raise InternalError("the A2A call has no caller")
    return call


def published(setting: str, agent: Agent) -> bool:
    """Whether the setting ``api.a2a_agents`` publishes the agent: ``*`` (every agent), or
    its name or id among the comma-separated entries."""
    names = {n.strip() for n in setting.split(",") if n.strip()}
    return "*" in names or agent.name in names or str(agent.id) in names


def a2a_error(exc: BaseException, what: str, *, not_found: A2AError | None = None) -> A2AError:
    """A refusal of the runtime as the A2A error a client can act on (``not_found`` for a
    404); ``data`` carries the API's status, code and correlation id."""
    problem = report(exc, what=what)
    data = {"status": problem.status, "code": problem.code, "correlationId": problem.correlation_id}
    if problem.status == 404 and not_found is not None:
        not_found.data = data
        return not_found
    kind: type[A2AError]
    if problem.status in (400, 422):
        kind = InvalidParamsError
    elif problem.status in (403, 404, 409):
        kind = InvalidRequestError
    else:
        kind = InternalError
    return kind(problem.message, data=data)


async def door(work: Awaitable[T], what: str, *, not_found: A2AError | None = None) -> T:
    """Await a use case, its refusal raised as the A2A error (``a2a_error``)."""
    try:
        return await work
    except CortexError as exc:
        raise a2a_error(exc, what, not_found=not_found) from exc


async def agent_of(call: A2ACall) -> Agent:
    """The called agent, if it is published (else the A2A error for an unknown agent)."""
    unknown = InvalidRequestError(
        f"no published agent {call.agent_ref!r} in organisation {call.org!r}"
    )
    agent = await door(
        call.api.runtime.get_agent(call.org, call.agent_ref, principal=call.principal),
        f"A2A agent {call.agent_ref!r}",
        not_found=unknown,
    )
    if not published(call.api.runtime.settings.api.a2a_agents, agent):
        raise unknown
    return agent
