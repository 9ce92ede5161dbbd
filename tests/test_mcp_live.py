"""MCP definitions kept live, through the real runtime (real PostgreSQL, the SDK client, a
real stdio server: tests/mcp_servers/stdio_server.py), issue 31 point 1: a server that
changes its tool list is refreshed without anyone asking (its ``list_changed`` reaches the
runtime's refresher), the new tool is pending and not offered, an audit row says so as the
system refresher, approving brings it; the periodic sweep repeats the listing as a no-op."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cortex_ray import Principal, Runtime, Settings
from cortex_ray.mcp import McpCredentials, McpServerConfig, McpTransport, connection_key
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import HashEmbedder
from cortex_ray.runtime._connectors import SYSTEM_REFRESHER
from cortex_ray.storage import Database

SERVER = Path(__file__).parent / "mcp_servers" / "stdio_server.py"
STDIO = McpServerConfig(transport=McpTransport.STDIO, command=sys.executable, args=[str(SERVER)])


@pytest.fixture
async def runtime(db: Database, settings: Settings) -> AsyncIterator[Runtime]:
    rt = await Runtime.open(  # no mcp_client: the runtime's own SdkMcpClient
        settings.model_copy(update={"embedding_backend": "hash"}),
        model=None,
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
        connectors=[],
    )
    yield rt
    await rt.close(close_db=False)


async def _names(runtime: Runtime, org: str) -> set[str]:
    return {t.name for t in await runtime.list_tools(org)}


async def test_a_changed_tool_list_is_pinned_without_a_refresh(runtime: Runtime, org: str) -> None:
    view = await runtime.connectors.register_mcp(org, "live", STDIO, local_operator=True)
    assert view.health == "ok"
    assert {"live__echo", "live__grow"} <= await _names(runtime, org)

    # The server adds a tool and sends notifications/tools/list_changed on the session the
    # runtime's client holds for (org, live): nobody calls refresh.
    result = await runtime.mcp_client.call_tool(
        connection_key(org, "live"), STDIO, McpCredentials(), "grow", {}, timeout_s=30
    )
    assert not result.is_error
    pins: dict[str, str] = {}
    for _ in range(100):  # the debounced refresh: half a second, then a listing
        pins = {
            p.tool: p.status.value for p in (await runtime.connectors.get_mcp(org, "live")).pins
        }
        if "grown_1" in pins:
            break
        await asyncio.sleep(0.1)
    assert pins.get("grown_1") == "pending", pins
    assert pins["echo"] == "approved"
    assert "live__grown_1" not in await _names(runtime, org)

    rows = [r for r in await runtime.store.audit_rows(org) if r["tool"] == "connectors.mcp.refresh"]
    system = [r for r in rows if r["principal_id"] == SYSTEM_REFRESHER]
    assert [(r["args"]["tool"], r["args"]["change"], r["args"]["status"]) for r in system] == [
        ("grown_1", "new", "pending")
    ]

    # The periodic sweep lists again: nothing changed, so nothing is audited (two API
    # replicas sweeping the same server do not double-audit).
    swept = await runtime.mcp_refresher.sweep()
    assert swept[(org, "live")] == []
    again = [
        r for r in await runtime.store.audit_rows(org) if r["tool"] == "connectors.mcp.refresh"
    ]
    assert len(again) == len(rows)

    await runtime.connectors.approve_mcp_tool(
        org, "live", "grown_1", principal=Principal.operator(org)
    )
    assert "live__grown_1" in await _names(runtime, org)


async def test_one_failing_server_does_not_stop_the_sweep(runtime: Runtime, org: str) -> None:
    broken = McpServerConfig(transport=McpTransport.STDIO, command="/nonexistent/mcp-server")
    await runtime.connectors.register_mcp(org, "broken", broken, local_operator=True)
    await runtime.connectors.register_mcp(org, "good", STDIO, local_operator=True)
    swept = await runtime.mcp_refresher.sweep()
    assert swept[(org, "broken")] is None
    assert swept[(org, "good")] == []
    view = await runtime.connectors.get_mcp(org, "broken")
    assert view.health.startswith("failing:"), view.health
