"""MCP overhead (issue 31, point 5): a call through cortex-ray's gate to an MCP tool against
the official SDK's own ``call_tool`` on the same server, side by side in one run.

Two servers, each started here: ``mcp-server-time`` (stdio, from PyPI; ``get_current_time``)
and a streamable-HTTP server on the SDK's MCPServer (``bench/_mcp_http_server.py``: a
read-only ``weather`` tool with structured output) behind a bearer token, which cortex-ray
reads from the organisation's secret store on every call.

SDK     ``mcp.Client.call_tool`` on one open session (the SDK's own client, nothing else).
CLIENT  cortex-ray's MCP client alone (``SdkMcpClient.call_tool``, a client of its own with
        the runtime's settings and one open session): the client's share, without the gate.
GATE    ``Runtime.invoke_tool`` (the use case behind ``POST …/tools/{name}/call``): a real
        Runtime on the embedded PostgreSQL, the server registered as a connector
        (``register_mcp(..., local_operator=True)``), a connector grant, an agent holding
        the tool, a caller; the gate checks the agent's and the caller's grants and the
        connector grant, validates the arguments against the pinned ``inputSchema``, reads
        the secrets, calls the server on the runtime's one shared session
        (``SdkMcpClient``), redacts, writes the audit row (its own transaction) and the
        ``execute_tool`` span (tracing on, the default).
PARTS   the same gated call timed in its parts: the lookups ``invoke_tool`` makes first
        (the tool in the registry, the agent from the store), ``dispatcher.execute``
        (grants, validation, secrets, the server call, redaction, the span: everything but
        the audit write) and the audit write alone (``store.insert_audit`` in its own
        transaction, the row that call produced): what the audit write costs. For the HTTP
        server, reading its secret alone (``SecretStore.reveal``) is timed too: a part of
        ``execute``.

The four are warmed, then interleaved in blocks (the order rotating) so drift cancels.
Printed: median and p95 per call, the ratio GATE/SDK of the medians (target ≤ 1.2×) and
the audit write's share.

Then connection reuse: ``--sessions`` (16) concurrent callers (asyncio tasks, as 16 session
actors sharing one connection would be) each making ``--per-session`` calls, through the
gate (one shared connection per organisation, connector and credential) against 16
independent SDK sessions (what a connection per session would be), and the same callers
sharing one SDK session (what one connection allows without the gate); calls per second and the
server processes (stdio: this process's children running the server) or TCP connections
(HTTP: established connections to the server's port) counted while they run.

Run: ``.venv/bin/python bench/mcp_overhead.py [--calls 200] [--blocks 10] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Benchmark the working tree this file sits in, whatever is installed in the venv.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx2
from _mcp_measure import (
    children_running,
    connections_to,
    free_port,
    report,
    stats,
    wait_listening,
)
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from cortex_ray import AgentMode, CapabilityTier, Grant, ObservationStatus, Runtime, Settings
from cortex_ray._types import Principal, PrincipalKind
from cortex_ray.act import InvocationContext
from cortex_ray.governance import GrantRequest
from cortex_ray.mcp import (
    McpCredentials,
    McpServerConfig,
    McpTransport,
    SdkMcpClient,
    mcp_tool_name,
)
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import HashEmbedder

ROOT = Path(__file__).resolve().parent.parent
HTTP_SERVER = ROOT / "bench" / "_mcp_http_server.py"
TOKEN = "bench-" + uuid.uuid4().hex


@dataclass
class Server:
    """One MCP server, as the bench reaches it both ways."""

    name: str  # the connector's name
    tool: str
    args: dict[str, Any]
    config: McpServerConfig
    count: Callable[[], int]  # server processes or connections open now
    counted: str  # what ``count`` counts

    def sdk_target(self) -> Any:
        if self.config.transport is McpTransport.STDIO:
            assert self.config.command is not None
            return StdioServerParameters(command=self.config.command)
        assert self.config.url is not None
        return _http_target(self.config.url)


@contextlib.asynccontextmanager
async def _http_target(url: str) -> AsyncIterator[Any]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30.0) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


async def measure(rt: Runtime, org: str, server: Server, calls: int, blocks: int) -> dict[str, Any]:
    """SDK, CLIENT, GATE and PARTS on one server, interleaved."""
    tool = mcp_tool_name(server.name, server.tool)
    agent = await rt.get_agent(org, "bench")
    caller = Principal(
        id="user:bench",
        org_id=org,
        kind=PrincipalKind.USER,
        name="bench",
        grant=Grant(tools=frozenset({"*"})),
    )
    per_block = max(1, calls // blocks)
    timings: dict[str, list[float]] = {
        "sdk": [], "client": [], "gate": [], "lookup": [], "execute": [], "audit": [],
        "secret": [],
    }  # fmt: skip
    # cortex-ray's MCP client alone: a client of its own, closed after (its server with it)
    own = SdkMcpClient(rt.settings.connectors)
    bare = server.config.model_copy(update={"bearer_secret": None})
    headers = {"Authorization": f"Bearer {TOKEN}"} if server.config.bearer_secret else {}
    credentials = McpCredentials(headers=headers)

    async with Client(server.sdk_target()) as sdk:

        async def sdk_block(record: bool) -> None:
            for _ in range(per_block):
                started = time.perf_counter()
                result = await sdk.call_tool(server.tool, server.args)
                elapsed = time.perf_counter() - started
                assert not result.is_error, result
                if record:
                    timings["sdk"].append(elapsed)

        async def client_block(record: bool) -> None:
            for _ in range(per_block):
                started = time.perf_counter()
                result = await own.call_tool(
                    f"{org}/client-only/{server.name}", bare, credentials, server.tool,
                    server.args, timeout_s=30.0,
                )  # fmt: skip
                elapsed = time.perf_counter() - started
                assert not result.is_error, result
                if record:
                    timings["client"].append(elapsed)

        async def gate_block(record: bool) -> None:
            for _ in range(per_block):
                started = time.perf_counter()
                obs = await rt.invoke_tool(org, agent.id, caller, tool, server.args)
                elapsed = time.perf_counter() - started
                assert obs.status is ObservationStatus.OK, obs.summary
                if record:
                    timings["gate"].append(elapsed)

        async def parts_block(record: bool) -> None:
            for _ in range(per_block):
                started = time.perf_counter()
                # what invoke_tool does before the gate: the tool and the agent looked up
                await rt.registry.load(org)
                assert rt.registry.get(tool, org) is not None
                held = await rt.store.get_agent(org, agent.id)
                looked_up = time.perf_counter()
                call = InvocationContext(agent=held, caller=caller, mode=AgentMode.INTERACTIVE)
                dispatch = await rt.dispatcher.execute(call, tool, server.args)
                executed = time.perf_counter()
                async with rt.store.db.transaction() as conn:
                    await rt.store.insert_audit(conn, dispatch.audit)
                written = time.perf_counter()
                assert dispatch.observation.status is ObservationStatus.OK
                if server.config.bearer_secret:  # what reading its secret costs, alone
                    secret = server.config.bearer_secret
                    await rt.secrets.reveal(org, secret, connector=server.name)
                revealed = time.perf_counter()
                if record:
                    timings["lookup"].append(looked_up - started)
                    timings["execute"].append(executed - looked_up)
                    timings["audit"].append(written - executed)
                    if server.config.bearer_secret:
                        timings["secret"].append(revealed - written)

        arms: list[Callable[[bool], Awaitable[None]]] = [
            sdk_block, client_block, gate_block, parts_block
        ]  # fmt: skip
        for arm in arms * 2:  # warm: sessions, validators, caches, the plan of each statement
            await arm(False)
        for i in range(blocks):
            for arm in arms[i % 4 :] + arms[: i % 4]:
                await arm(True)
    await own.aclose()
    out: dict[str, Any] = {k: stats(v) for k, v in timings.items() if v}
    out["ratio_gate_sdk"] = out["gate"]["median_ms"] / out["sdk"]["median_ms"]
    out["audit_share_of_gate"] = out["audit"]["median_ms"] / out["gate"]["median_ms"]
    return out


async def reuse(
    rt: Runtime, org: str, server: Server, sessions: int, per_session: int
) -> dict[str, Any]:
    """``sessions`` concurrent callers: through the gate (one shared connection) against as
    many independent SDK sessions."""
    tool = mcp_tool_name(server.name, server.tool)
    agent = await rt.get_agent(org, "bench")
    peak = {"gate": 0, "sdk": 0, "shared": 0}
    running = True

    async def sample(arm: str) -> None:
        while running:
            peak[arm] = max(peak[arm], server.count())
            await asyncio.sleep(0.01)

    async def gate_caller(i: int) -> None:
        caller = Principal(
            id=f"user:bench-{i}",
            org_id=org,
            kind=PrincipalKind.USER,
            name=f"bench {i}",
            grant=Grant(tools=frozenset({"*"})),
        )
        for _ in range(per_session):
            obs = await rt.invoke_tool(org, agent.id, caller, tool, server.args)
            assert obs.status is ObservationStatus.OK, obs.summary

    sampler = asyncio.create_task(sample("gate"))
    started = time.perf_counter()
    await asyncio.gather(*(gate_caller(i) for i in range(sessions)))
    gate_s = time.perf_counter() - started
    running = False
    await sampler

    baseline = server.count()  # the runtime's own connection, still open
    async with contextlib.AsyncExitStack() as stack:
        opened = time.perf_counter()
        clients = [
            await stack.enter_async_context(Client(server.sdk_target())) for _ in range(sessions)
        ]
        open_s = time.perf_counter() - opened
        for c in clients:  # warm each
            await c.call_tool(server.tool, server.args)

        async def sdk_caller(c: Client) -> None:
            for _ in range(per_session):
                result = await c.call_tool(server.tool, server.args)
                assert not result.is_error, result

        running = True
        sampler = asyncio.create_task(sample("sdk"))
        started = time.perf_counter()
        await asyncio.gather(*(sdk_caller(c) for c in clients))
        sdk_s = time.perf_counter() - started
        running = False
        await sampler

    # the same callers sharing one SDK session (the 16 closed): what one connection allows
    baseline_shared = server.count()
    async with Client(server.sdk_target()) as shared:
        await shared.call_tool(server.tool, server.args)
        running = True
        sampler = asyncio.create_task(sample("shared"))
        started = time.perf_counter()
        await asyncio.gather(*(sdk_caller(shared) for _ in range(sessions)))
        shared_s = time.perf_counter() - started
        running = False
        await sampler

    total = sessions * per_session
    return {
        "sessions": sessions,
        "calls": total,
        "gate_calls_per_s": total / gate_s,
        "sdk_calls_per_s": total / sdk_s,
        "sdk_shared_calls_per_s": total / shared_s,
        "gate_open": peak["gate"],
        "sdk_open": peak["sdk"] - baseline,
        "sdk_shared_open": peak["shared"] - baseline_shared,
        "sdk_open_s": open_s,
        "counted": server.counted,
    }


async def main(ns: argparse.Namespace) -> int:
    load_before = os.getloadavg()
    time_cmd = shutil.which("mcp-server-time") or str(
        Path(sys.executable).parent / "mcp-server-time"
    )
    port = free_port()
    state = Path(tempfile.mkdtemp(prefix="cortex-ray-mcp-bench-", dir="/tmp"))
    http = await asyncio.create_subprocess_exec(  # quiet: --json prints to stdout
        sys.executable, str(HTTP_SERVER), str(port), TOKEN, stdout=asyncio.subprocess.DEVNULL
    )
    servers = [
        Server(
            "time",
            "get_current_time",
            {"timezone": "UTC"},
            McpServerConfig(transport=McpTransport.STDIO, command=time_cmd),
            lambda: children_running("mcp-server-time"),
            "server processes",
        ),
        Server(
            "weather",
            "weather",
            {"city": "Paris"},
            McpServerConfig(
                transport=McpTransport.HTTP,
                url=f"http://127.0.0.1:{port}/mcp",
                bearer_secret="weather_token",
            ),
            lambda: connections_to(port),
            "TCP connections",
        ),
    ]
    settings = Settings.model_validate({"data_dir": state / "data", "embedding_backend": "hash"})
    rt: Runtime | None = None
    try:
        await wait_listening(port)
        rt = await Runtime.open(
            settings,
            model=None,
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            connectors=[],
        )
        org = f"bench-{uuid.uuid4().hex[:8]}"
        operator = Principal.operator(org)
        await rt.store.ensure_org(org)
        for s in servers:
            await rt.connectors.register_mcp(
                org, s.name, s.config, local_operator=True, principal=operator, refresh=False
            )
            if s.config.bearer_secret:
                await rt.governance.put_secret(
                    org, s.config.bearer_secret, TOKEN, connector=s.name, principal=operator
                )
            await rt.connectors.refresh_mcp(org, s.name, principal=operator)
            await rt.governance.create_grant(
                org,
                GrantRequest(principal_id="*", connector=s.name, max_tier=CapabilityTier.READ),
                principal=operator,
            )
        tools = [mcp_tool_name(s.name, s.tool) for s in servers]
        await rt.create_agent(
            org, "bench", mode=AgentMode.INTERACTIVE, tools=tools,
            grant=Grant(tools=frozenset(tools)),
        )  # fmt: skip
        results: dict[str, Any] = {"calls": ns.calls, "blocks": ns.blocks}
        for s in servers:
            results[s.name] = {
                "transport": s.config.transport.value,
                "latency": await measure(rt, org, s, ns.calls, ns.blocks),
                "reuse": await reuse(rt, org, s, ns.sessions, ns.per_session),
            }
        results["loadavg_before"] = load_before
        results["loadavg_after"] = os.getloadavg()
        results["cpus"] = os.cpu_count()
        if ns.json:
            print(json.dumps(results, indent=2))
        else:
            report(results)
        return 0
    finally:
        if rt is not None:
            await rt.close()
        http.terminate()
        await http.wait()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per arm and server")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--per-session", type=int, default=25)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    sys.exit(asyncio.run(main(parser.parse_args())))
