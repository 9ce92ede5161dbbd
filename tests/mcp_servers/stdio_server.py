"""A stdio MCP server for tests/test_mcp_client.py that speaks only the ``initialize``
handshake (the SDK's handshake-only loop, as the servers of before the 2026-07-28 revision
do), built on the official SDK's low-level ``Server``.

    python tests/mcp_servers/stdio_server.py [STATE_DIR]

Tools: ``echo``; ``grow``, which adds a tool and sends ``notifications/tools/list_changed``
(a server that changes its tool list, for pinning); ``garbage``, whose result breaks its own
output schema; ``ask``, which asks the client for input; ``count``, which reports progress
at each of its ``steps``; ``die``, which kills the process in
the middle of the call. With STATE_DIR the process writes its pid to ``STATE_DIR/pid``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.runner import serve_loop
from mcp.server.stdio import stdio_server

_grown: list[str] = []

_BASE = [
    types.Tool(
        name="echo",
        description="Echoes its text",
        input_schema={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="grow",
        description="Adds a tool to this server's list",
        input_schema={"type": "object", "properties": {}},
    ),
    types.Tool(
        name="garbage",
        description="Returns structured content that breaks its own output schema",
        input_schema={"type": "object", "properties": {}},
        output_schema={
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
        },
    ),
    types.Tool(
        name="ask",
        description="Asks the client for a colour",
        input_schema={"type": "object", "properties": {}},
    ),
    types.Tool(
        name="count",
        description="Counts to steps, reporting progress at each",
        input_schema={
            "type": "object",
            "properties": {"steps": {"type": "integer"}},
            "required": ["steps"],
        },
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="die",
        description="Kills this server's process mid-call",
        input_schema={"type": "object", "properties": {}},
        annotations=types.ToolAnnotations(destructive_hint=True),
    ),
]


def _tools() -> list[types.Tool]:
    grown = [
        types.Tool(name=name, description=f"grown tool {name}", input_schema={"type": "object"})
        for name in _grown
    ]
    return [*_BASE, *grown]


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=_tools())


async def call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    args = params.arguments or {}
    if params.name == "echo":
        return _text(str(args.get("text", "")))
    if params.name == "grow":
        _grown.append(f"grown_{len(_grown) + 1}")
        await ctx.session.send_tool_list_changed()
        return _text(f"now {len(_tools())} tools")
    if params.name == "garbage":
        return types.CallToolResult(
            content=[types.TextContent(type="text", text="n is not a number")],
            structured_content={"n": "not a number"},
        )
    if params.name == "ask":
        answer = await ctx.session.elicit_form(
            "Which colour?",
            {"type": "object", "properties": {"colour": {"type": "string"}}},
            related_request_id=ctx.request_id,
        )
        return _text(f"{answer.action}: {(answer.content or {}).get('colour')}")
    if params.name == "count":
        steps = int(args.get("steps", 1))
        for i in range(1, steps + 1):
            await ctx.session.report_progress(i, steps, f"step {i}")
        return _text(f"counted to {steps}")
    if params.name == "die":
        os._exit(5)
    if params.name in _grown:
        return _text(f"{params.name} ran")
    return types.CallToolResult(content=[_text("no such tool").content[0]], is_error=True)


server = Server(
    "cortex-test-stdio", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool
)


async def main() -> None:
    if len(sys.argv) > 1:
        (Path(sys.argv[1]) / "pid").write_text(str(os.getpid()))
    options = server.create_initialization_options(NotificationOptions(tools_changed=True))
    async with stdio_server() as (read, write), server.lifespan(server) as state:
        await serve_loop(server, read, write, lifespan_state=state, init_options=options)


if __name__ == "__main__":
    anyio.run(main)
