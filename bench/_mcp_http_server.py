"""The streamable-HTTP MCP server of bench/mcp_overhead.py: the official SDK's MCPServer
(FastMCP) under uvicorn, one read-only tool with structured output, behind a bearer token.

    python bench/_mcp_http_server.py PORT TOKEN
"""

from __future__ import annotations

import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

port, token = int(sys.argv[1]), sys.argv[2]
server = MCPServer("cortex-bench-http", version="1.0")


class Weather(BaseModel):
    city: str
    celsius: float


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def weather(city: str) -> Weather:
    """The weather in a city."""
    return Weather(city=city, celsius=21.5)


class RequireBearer:
    """Refuses a request without ``Authorization: Bearer <token>`` (HTTP 401)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != (
            f"Bearer {token}".encode()
        ):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"invalid token"})
            return
        await self.app(scope, receive, send)


if __name__ == "__main__":
    uvicorn.run(
        RequireBearer(server.streamable_http_app()),
        host="127.0.0.1",
        port=port,
        log_level="warning",
    )
