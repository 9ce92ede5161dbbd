"""A streamable-HTTP MCP server for tests/test_mcp_client.py (the official SDK's MCPServer under
uvicorn), guarded by a bearer token.

    python tests/mcp_servers/http_server.py PORT TOKEN STATE_DIR

Its tools cover what the client must handle: more tools than one page (``PAGE_SIZE`` a page),
an output schema with structured content, an ``isError`` result, progress notifications, a
request for input (elicitation), a call that hangs (it writes ``STATE_DIR/cancelled`` when the
client cancels it) and a call that kills the server's own process."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import anyio
import uvicorn
from mcp.server.context import CallNext, ServerRequestContext
from mcp.server.elicitation import ElicitationResult
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp.types import ToolAnnotations
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

PAGE_SIZE = 4
FILLER_TOOLS = 6

port, token, state = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])


async def paginate(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Any:
    """``tools/list`` a page at a time (the wire form the handler produced, cut): the cursor
    is the offset of the page."""
    result = await call_next(ctx)
    if ctx.method != "tools/list" or not isinstance(result, dict):
        return result
    start = int((ctx.params or {}).get("cursor") or 0)
    end = start + PAGE_SIZE
    tools = sorted(result["tools"], key=lambda t: t["name"])
    page = {**result, "tools": tools[start:end]}
    if end < len(tools):
        page["nextCursor"] = str(end)
    return page


server = MCPServer("cortex-test-http", version="1.0", middleware=[paginate])


class Weather(BaseModel):
    city: str
    celsius: float


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def weather(city: str) -> Weather:
    """The weather in a city (structured output)."""
    return Weather(city=city, celsius=21.5)


@server.tool()
def fail(reason: str) -> str:
    """Always fails (an isError result)."""
    raise ToolError(f"failed on purpose: {reason}")


@server.tool()
async def slow_count(steps: int, ctx: Context) -> str:
    """Counts to ``steps``, reporting progress at each."""
    for i in range(1, steps + 1):
        await ctx.report_progress(i, steps, f"step {i}")
        await anyio.sleep(0.05)
    return f"counted to {steps}"


class Confirm(BaseModel):
    approve: bool
    note: str = ""


def ask(item: str) -> Elicit[Confirm]:
    return Elicit(f"Delete {item}?", Confirm)


@server.tool()
async def delete_item(
    item: str, answer: Annotated[ElicitationResult[Confirm], Resolve(ask)]
) -> str:
    """Deletes an item once a person confirms (asks for input)."""
    if answer.action != "accept":
        return f"not deleted ({answer.action})"
    data = answer.data
    return f"deleted {item}: approve={data.approve} note={data.note}"


@server.tool()
async def hang(label: str) -> str:
    """Never returns; records a cancellation from the client."""
    try:
        await anyio.sleep(3600)
    except anyio.get_cancelled_exc_class():
        (state / "cancelled").write_text(label)
        raise
    return "unreachable"


@server.tool()
def die(code: int = 3) -> str:
    """Kills this server's process in the middle of the call."""
    os._exit(code)


@server.tool()
def whoami(ctx: Context) -> str:
    """Echoes the request's protocol version."""
    return ctx.protocol_version or "unknown"


def _filler(n: int) -> Any:
    def filler(x: int = 0) -> str:
        return f"filler {n}: {x}"

    return filler


for n in range(FILLER_TOOLS):
    server.add_tool(_filler(n), name=f"filler_{n}", description=f"filler tool {n}")


class RequireBearer:
    """Refuses a request without ``Authorization: Bearer <token>`` (HTTP 401)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": b'{"error":"invalid_token"}'})
                return
        await self.app(scope, receive, send)


app = RequireBearer(server.streamable_http_app())

if __name__ == "__main__":
    (state / "pid").write_text(str(os.getpid()))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
