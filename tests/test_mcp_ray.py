"""MCP connections on Ray (``actors._mcp``): one named actor per organisation and server,
shared by every caller, against the real ``mcp-server-time`` from PyPI over stdio on the
shared local Ray."""

from __future__ import annotations

import asyncio
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cortex_ray import ConnectorUnavailableError, Settings
from cortex_ray.mcp import (
    McpCredentials,
    McpElicitation,
    McpElicitationAnswer,
    McpServerConfig,
    McpTransport,
)

pytestmark = pytest.mark.timeout(300)

BIN = Path(sys.executable).parent
TIME = McpServerConfig(transport=McpTransport.STDIO, command=str(BIN / "mcp-server-time"))
NONE = McpCredentials()
# the tests' own handshake-era server (tests/mcp_servers): ``ask`` asks the client for input
ASKER = McpServerConfig(
    transport=McpTransport.STDIO,
    command=sys.executable,
    args=[str(Path(__file__).parent / "mcp_servers" / "stdio_server.py")],
)


@pytest.fixture
def namespace(ray_cluster: Any) -> Any:
    from actors._mcp import close_connections

    name = f"mcp-{uuid.uuid4().hex[:8]}"
    yield name
    asyncio.run(close_connections(name))


def _settings(namespace: str) -> Settings:
    settings = Settings()
    return settings.model_copy(
        update={"sessions": settings.sessions.model_copy(update={"namespace": namespace})}
    )


def _connection_actors(namespace: str) -> list[str]:
    from ray.util import list_named_actors

    from actors._mcp import MCP_PREFIX

    return sorted(
        a["name"]
        for a in list_named_actors(all_namespaces=True)
        if a["namespace"] == namespace and a["name"].startswith(MCP_PREFIX)
    )


def _utc_time(result: Any) -> datetime:
    assert not result.is_error, result
    data = result.structured or {}
    if not data:
        import json

        data = json.loads(result.content[0].text)
    return datetime.fromisoformat(data["datetime"]).astimezone(UTC)


async def test_callers_share_one_connection_actor_per_organisation_and_server(
    namespace: str,
) -> None:
    from actors._mcp import RayMcpClient

    first, second = RayMcpClient(_settings(namespace)), RayMcpClient(_settings(namespace))
    tools = await first.list_tools("acme/clock", TIME, NONE)
    assert "get_current_time" in {t.name for t in tools}

    async def now(client: RayMcpClient, key: str) -> datetime:
        result = await client.call_tool(
            key, TIME, NONE, "get_current_time", {"timezone": "UTC"}, timeout_s=30
        )
        return _utc_time(result)

    # 16 concurrent calls from two callers (two session actors, say), one a principal's own
    before = datetime.now(UTC)
    keys = ["acme/clock", "acme/clock/alice"]
    times = await asyncio.gather(
        *(now(client, key) for client in (first, second) for key in keys for _ in range(4))
    )
    after = datetime.now(UTC)
    # the server's real clock, read 16 times (whole seconds: it drops the fraction)
    assert all(before.replace(microsecond=0) <= t <= after for t in times)
    # one actor for the organisation's server, principals' sessions inside it
    assert _connection_actors(namespace) == ["cortex-ray:mcp/acme/clock"]
    await first.list_tools("other/clock", TIME, NONE)
    assert _connection_actors(namespace) == [
        "cortex-ray:mcp/acme/clock",
        "cortex-ray:mcp/other/clock",
    ]
    assert await second.health("acme/clock", TIME, NONE) is None


async def test_a_dead_connection_actor_fails_the_call_clearly_and_comes_back(
    namespace: str,
) -> None:
    import ray

    from actors._mcp import RayMcpClient

    client = RayMcpClient(_settings(namespace))
    await client.list_tools("acme/clock", TIME, NONE)
    actor = ray.get_actor("cortex-ray:mcp/acme/clock", namespace=namespace)
    ray.kill(actor, no_restart=False)  # as a crash: Ray restarts it
    for _ in range(60):
        try:
            result = await client.call_tool(
                "acme/clock", TIME, NONE, "get_current_time", {"timezone": "UTC"}, timeout_s=30
            )
            break
        except ConnectorUnavailableError as exc:
            assert "connection actor stopped" in str(exc)
            await asyncio.sleep(0.5)
    else:
        pytest.fail("the restarted connection actor never served a call")
    assert abs((_utc_time(result) - datetime.now(UTC)).total_seconds()) < 30


async def test_a_server_that_cannot_start_is_a_clear_error_through_the_actor(
    namespace: str,
) -> None:
    from actors._mcp import RayMcpClient

    client = RayMcpClient(_settings(namespace))
    missing = McpServerConfig(transport=McpTransport.STDIO, command="/nonexistent/mcp-server")
    with pytest.raises(ConnectorUnavailableError, match="acme/nothing"):
        await client.list_tools("acme/nothing", missing, NONE)


async def test_a_servers_request_for_input_reaches_the_callers_hook_across_the_actor(
    namespace: str,
) -> None:
    from actors._mcp import RayMcpClient

    client = RayMcpClient(_settings(namespace))
    asked: list[str] = []

    async def answer(request: McpElicitation) -> McpElicitationAnswer:
        asked.append(request.message)
        return McpElicitationAnswer(action="accept", content={"colour": "teal"})

    result = await client.call_tool("acme/asker", ASKER, NONE, "ask", {}, timeout_s=30,
                                    on_elicit=answer)  # fmt: skip
    assert (result.content[0].text, asked) == ("accept: teal", ["Which colour?"])
    declined = await client.call_tool("acme/asker", ASKER, NONE, "ask", {}, timeout_s=30)
    assert declined.content[0].text == "decline: None"  # no hook: declined, never hangs
