"""The ASGI app at ``/mcp/{org}``: the API's bearer key and organisation check in front of the
SDK's streamable-HTTP session manager.

Stateless: every POST is served on its own, with no ``Mcp-Session-Id`` and nothing kept
between requests, so any replica of the Serve deployment can answer any request (a stateful
session would pin a client to the replica that holds it, which Serve's proxy does not do).
Both protocol eras are served: the 2026-07-28 revision is stateless by design, and the
older ``initialize`` handshake runs in the SDK's stateless mode. Long work still reports
progress, on the SSE stream of the request that started it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from cortex_ray import Principal
from serve._deps import state_of
from serve._errors import ApiProblem
from serve.mcp._tools import PRINCIPAL_KEY, build_server

__all__ = ["MCP_PATH", "McpEndpoint"]

log = logging.getLogger("serve.mcp")

MCP_PATH = "/mcp/{org}"
"""Where the API serves MCP: one endpoint per organisation, like ``/api/orgs/{org}``."""


class McpEndpoint:
    """The MCP endpoint: authenticates, then hands the request to the SDK.

    ``running()`` is entered by the app's lifespan (the session manager's task group lives
    as long as the app); before it, or without a lifespan, the endpoint answers 503.
    """

    def __init__(self, *, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self._manager: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve MCP while inside (a session manager runs only once: a fresh one each time)."""
        server = build_server()
        server.streamable_http_app(
            stateless_http=True,
            json_response=False,  # SSE responses: progress notifications ride them
            max_request_body_size=self.max_body_bytes,
            # Requests carry a bearer key, and the API binds 127.0.0.1 unless told otherwise;
            # behind Serve's proxy the Host is the deployment's, not one list we could know.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        manager = server.session_manager
        async with manager.run():
            self._manager = manager
            try:
                yield
            finally:
                self._manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The request's span is named by the path's template, not each organisation's path
        # (a Starlette Route leaves no "route" in the scope, as FastAPI's routes do).
        scope.setdefault("route", _TEMPLATE)
        request = Request(scope, receive)
        principal = await _member(request)
        manager = self._manager
        if manager is None:
            raise ApiProblem(503, "the MCP endpoint is not running yet")
        scope[PRINCIPAL_KEY] = principal
        await manager.handle_request(scope, receive, send)


@dataclass(frozen=True)
class _Template:
    path: str = MCP_PATH


_TEMPLATE = _Template()


async def _member(request: Request) -> Principal:
    """The principal of the request's bearer key, a member of the path's organisation: the
    same answers as ``serve._deps.authenticate`` and ``member`` (401 without a key or with
    an unknown one; 404 for another organisation's path, which tells it nothing)."""
    state = state_of(request)
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise ApiProblem(
            401,
            "missing API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = await state.runtime.authenticate(key)
    if principal is None:
        raise ApiProblem(
            401,
            "unknown or revoked API key",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    org = str(request.path_params.get("org", ""))
    if principal.org_id != org:
        raise ApiProblem(404, f"organisation {org!r} not found")
    return principal
