"""The A2A routes of the API: per published agent, its card and its JSON-RPC endpoint.

    GET  /a2a/{org}/{agent}/.well-known/agent-card.json   the agent card
    POST /a2a/{org}/{agent}                               JSON-RPC: A2A 1.0 and 0.3 methods

Both take the API's bearer key of a member of ``{org}`` first (401, and 404 for another
organisation, in the API's error body, before anything A2A is read); then the SDK's
JSON-RPC dispatcher parses the call and hands it to ``RuntimeRequestHandler``.
"""

from __future__ import annotations

from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from serve._deps import ERRORS, AgentRef, MemberDep, OrgPath, StateDep
from serve._errors import ApiProblem
from serve.a2a._call import A2ACall, published
from serve.a2a._convert import agent_card
from serve.a2a._handler import RuntimeRequestHandler

__all__ = ["A2A_PREFIX", "a2a_router"]

A2A_PREFIX = "/a2a/{org}/{agent}"
_RPC = "a2a_jsonrpc"


class _CallContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's context (headers, the requested A2A version), plus the caller the route
    authenticated."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state["cortex"] = request.state.a2a
        return context


def a2a_router() -> APIRouter:
    """The A2A routes (docs/a2a.md)."""
    router = APIRouter(prefix=A2A_PREFIX, responses=dict(ERRORS), tags=["a2a"])
    dispatcher = JsonRpcDispatcher(
        RuntimeRequestHandler(), context_builder=_CallContextBuilder(), enable_v0_3_compat=True
    )

    @router.get("/.well-known/agent-card.json", response_model=dict[str, Any])
    async def a2a_agent_card(
        state: StateDep, org: OrgPath, agent: AgentRef, principal: MemberDep, request: Request
    ) -> JSONResponse:
        """The agent's A2A card: persona, skills and the tools the key may use with it, its
        JSON-RPC URL, streaming, bearer-key security. 404 for an unpublished agent."""
        found = await state.runtime.get_agent(org, agent, principal=principal)
        if not published(state.runtime.settings.api.a2a_agents, found):
            raise ApiProblem(404, f"agent {agent!r} is not published over A2A")
        tools = await state.runtime.list_tools(org, agent_ref=found.id, principal=principal)
        url = str(request.url_for(_RPC, org=org, agent=str(found.id)))
        return JSONResponse(agent_card_to_dict(agent_card(found, tools, url)))

    @router.post(
        "",
        name=_RPC,
        response_model=dict[str, Any],
        responses={
            200: {
                "description": "A JSON-RPC 2.0 response, or for `SendStreamingMessage` / "
                "`message/stream` and `SubscribeToTask` server-sent events, each a JSON-RPC "
                "response holding a task, a status update or an artifact update"
            }
        },
    )
    async def a2a_jsonrpc(
        state: StateDep, org: OrgPath, agent: AgentRef, principal: MemberDep, request: Request
    ) -> Response:
        """An A2A JSON-RPC call (`SendMessage`, `SendStreamingMessage`, `GetTask`,
        `CancelTask`, `ListTasks`, `SubscribeToTask`; and the 0.3 names `message/send`,
        `message/stream`, `tasks/get`, `tasks/cancel`, ...). A2A errors are JSON-RPC
        errors (HTTP 200)."""
        request.state.a2a = A2ACall(state, org, agent, principal)
        return await dispatcher.handle_requests(request)

    return router
