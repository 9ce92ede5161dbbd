"""A stdio MCP server on the official SDK's ``MCPServer`` (both protocol eras) whose tool list
changes: ``grow`` adds a tool and announces it, on a ``subscriptions/listen`` stream (the
2026-07-28 revision) and as ``notifications/tools/list_changed`` (the handshake era).

    python tests/mcp_servers/modern_server.py"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("cortex-test-modern", version="1.0")


def _grown(n: int) -> Any:
    def grown() -> str:
        return f"grown {n} ran"

    return grown


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds a tool to this server's list and announces the change."""
    n = len(await server.list_tools())
    server.add_tool(_grown(n), name=f"grown_{n}", description=f"grown tool {n}")
    await ctx.notify_tools_changed()
    if ctx.protocol_version and ctx.protocol_version < "2026":
        await ctx.session.send_tool_list_changed()
    return f"now {n + 1} tools"


if __name__ == "__main__":
    server.run("stdio")
