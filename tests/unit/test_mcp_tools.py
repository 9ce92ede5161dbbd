"""An MCP server's approved definitions as gated tools, with a scripted server: the name,
schema, tier and idempotence of each tool; through the real invocation gate, an ``isError``
answer and a dead or silent server are failed observations naming the connector (the
agent's other tools still work); a dry run never sends a WRITE call; per-principal
credentials are the caller's own copy of the secret, and the gate redacts them."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from fakes import FakeStore, ScriptedMcpClient, ScriptedServer, text_result

from cortex_ray._exceptions import AccessDeniedError, NotFoundError
from cortex_ray._types import (
    ActionType,
    Agent,
    AgentMode,
    CapabilityTier,
    Grant,
    ObservationStatus,
    Principal,
    RunMode,
)
from cortex_ray.access import AccessControlService
from cortex_ray.act import InvocationContext, Tool, ToolDispatcher, ToolRegistry, builtin_tools
from cortex_ray.governance import Verdict
from cortex_ray.mcp import (
    McpCallResult,
    McpContent,
    McpServerConfig,
    McpToolAnnotations,
    McpToolDefinition,
    McpTransport,
    mcp_tool_name,
    mcp_tools,
    principal_secret_name,
)
from cortex_ray.settings import ToolOptions

URL = "https://mcp.example.com/mcp"

LOOKUP = McpToolDefinition(
    name="lookup",
    description="Look a customer up.",
    input_schema={
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "required": ["id"],
        "additionalProperties": False,
    },
    annotations=McpToolAnnotations(read_only_hint=True, idempotent_hint=True),
)
UPDATE = McpToolDefinition(
    name="update-customer",
    description="Change a customer.",
    input_schema={"type": "object", "properties": {"id": {"type": "integer"}}},
)
PURGE = McpToolDefinition(
    name="purge", annotations=McpToolAnnotations(destructive_hint=True, read_only_hint=False)
)


class Secrets:
    """The secret store as a tool sees it (``reveal``), with connector binding."""

    def __init__(self, values: Mapping[str, tuple[str, str | None]]) -> None:
        self.values = dict(values)
        self.asked: list[str] = []

    async def reveal(self, org_id: str, name: str, *, connector: str | None) -> str:
        self.asked.append(name)
        if name not in self.values:
            raise NotFoundError(f"no secret {name!r} in this organisation")
        value, bound = self.values[name]
        if bound is not None and bound != connector:
            raise AccessDeniedError(f"secret {name!r} belongs to connector {bound!r}")
        return value


class AllowAll:
    """A connector policy that allows every call (the grants are tested elsewhere)."""

    def __init__(self) -> None:
        self.checked: list[tuple[str, str, CapabilityTier]] = []

    async def check(self, *, connector: str, tool: str, tier: CapabilityTier, **_: Any) -> Verdict:
        self.checked.append((connector, tool, tier))
        return Verdict("allow", "test")


class Overlay:
    """An ``OrgToolSource`` holding fixed tools for one organisation."""

    def __init__(self, org_id: str, tools: Sequence[Tool]) -> None:
        self.org_id = org_id
        self._tools = {t.name: t for t in tools}
        self.loads = 0

    def tools(self, org_id: str) -> Mapping[str, Tool]:
        return self._tools if org_id == self.org_id else {}

    async def load(self, org_id: str) -> None:
        self.loads += 1


def _config(**changes: Any) -> McpServerConfig:
    return McpServerConfig(transport=McpTransport.HTTP, url=URL, **changes)


def _gate(
    tools: Sequence[Tool], fake_store: FakeStore, secrets: Secrets | None = None
) -> tuple[ToolDispatcher, Overlay, AllowAll]:
    overlay = Overlay("acme", tools)
    registry = ToolRegistry(builtin_tools(), org_tools=overlay)
    policy = AllowAll()
    dispatcher = ToolDispatcher(
        registry,
        AccessControlService(),
        fake_store,  # type: ignore[arg-type]
        ToolOptions(),
        governance=policy,  # type: ignore[arg-type]
        secrets=secrets,
    )
    return dispatcher, overlay, policy


def _agent(tools: Sequence[str], org: str = "acme") -> Agent:
    return Agent(org_id=org, name="helper", tools=tuple(tools), grant=Grant(tools=frozenset(tools)))


def _ctx(agent: Agent, run_mode: RunMode = RunMode.EXECUTE) -> InvocationContext:
    return InvocationContext(agent=agent, caller=None, mode=AgentMode.AUTONOMOUS, run_mode=run_mode)


def test_each_definition_becomes_a_gated_tool_of_its_connector() -> None:
    client = ScriptedMcpClient()
    tools = mcp_tools(
        "crm",
        _config(timeout_s=7),
        [LOOKUP, UPDATE, PURGE],
        client,
        tier_overrides={"update-customer": CapabilityTier.ADMIN},
    )
    by = {t.name: t for t in tools}
    assert sorted(by) == sorted(
        ["crm__lookup", mcp_tool_name("crm", "update-customer"), "crm__purge"]
    )
    lookup = by["crm__lookup"]
    assert lookup.connector == "crm" and lookup.parameters == LOOKUP.input_schema
    assert lookup.tier is CapabilityTier.READ and lookup.idempotent
    assert lookup.action_type is ActionType.GROUNDING
    assert lookup.timeout_s is not None and lookup.timeout_s > 7  # the client's bound first
    update = by[mcp_tool_name("crm", "update-customer")]
    assert update.tier is CapabilityTier.ADMIN and not update.idempotent  # the override
    assert by["crm__purge"].tier is CapabilityTier.ADMIN  # destructive
    plain = mcp_tools("crm", _config(), [UPDATE], client)[0]
    assert plain.tier is CapabilityTier.WRITE  # unannotated: write


async def test_a_call_goes_to_the_server_and_its_answer_is_the_observation(
    fake_store: FakeStore,
) -> None:
    server = ScriptedServer(
        tools=[LOOKUP],
        answers={
            "lookup": lambda args: McpCallResult(
                content=[McpContent(kind="text", text="ignored")],
                structured={"id": args["id"], "name": "Ada"},
            )
        },
    )
    client = ScriptedMcpClient({URL: server})
    dispatcher, overlay, policy = _gate(mcp_tools("crm", _config(), [LOOKUP], client), fake_store)
    agent = _agent(["crm__lookup", "current_time"])
    obs = (await dispatcher.execute(_ctx(agent), "crm__lookup", {"id": 7})).observation
    assert obs.status is ObservationStatus.OK, obs.summary
    assert obs.output == {"id": 7, "name": "Ada"}
    assert [(c.key, c.tool, c.arguments) for c in client.calls] == [
        ("acme/crm", "lookup", {"id": 7})
    ]
    assert policy.checked == [("crm", "crm__lookup", CapabilityTier.READ)]
    assert overlay.loads >= 1
    # The inputSchema is the gate's: a bad argument never reaches the server.
    bad = (await dispatcher.execute(_ctx(agent), "crm__lookup", {"id": "seven"})).observation
    assert bad.status is ObservationStatus.REFUSED and "invalid arguments" in bad.summary
    assert len(client.calls) == 1


async def test_text_blocks_are_joined_and_binary_ones_summarised(fake_store: FakeStore) -> None:
    answer = McpCallResult(
        content=[
            McpContent(kind="text", text="line one"),
            McpContent(kind="image", mime_type="image/png", size=2048),
            McpContent(kind="text", text="line two"),
        ]
    )
    client = ScriptedMcpClient({URL: ScriptedServer(tools=[LOOKUP], answers={"lookup": answer})})
    dispatcher, _, _ = _gate(mcp_tools("crm", _config(), [LOOKUP], client), fake_store)
    obs = await dispatcher.execute(_ctx(_agent(["crm__lookup"])), "crm__lookup", {"id": 1})
    assert obs.observation.output == "line one\n[image image/png, 2048 bytes]\nline two"


async def test_is_error_is_a_failed_observation_with_the_servers_text(
    fake_store: FakeStore,
) -> None:
    answer = text_result("customer 7 is locked", is_error=True)
    client = ScriptedMcpClient({URL: ScriptedServer(tools=[LOOKUP], answers={"lookup": answer})})
    dispatcher, _, _ = _gate(mcp_tools("crm", _config(), [LOOKUP], client), fake_store)
    dispatch = await dispatcher.execute(_ctx(_agent(["crm__lookup"])), "crm__lookup", {"id": 7})
    assert dispatch.observation.status is ObservationStatus.ERROR
    assert "customer 7 is locked" in dispatch.observation.summary
    assert "'crm'" in dispatch.observation.summary
    assert dispatch.audit.status == "ERROR"


async def test_a_dead_server_fails_the_call_naming_it_and_other_tools_still_work(
    fake_store: FakeStore,
) -> None:
    client = ScriptedMcpClient({URL: ScriptedServer(tools=[LOOKUP], down=True)})
    dispatcher, _, _ = _gate(mcp_tools("crm", _config(), [LOOKUP], client), fake_store)
    agent = _agent(["crm__lookup", "current_time"])
    failed = (await dispatcher.execute(_ctx(agent), "crm__lookup", {"id": 7})).observation
    assert failed.status is ObservationStatus.ERROR
    assert "MCP server 'crm' could not be reached" in failed.summary
    space = [s.name for s in dispatcher.action_space(agent, None, AgentMode.AUTONOMOUS)]
    assert "crm__lookup" in space and "current_time" in space
    clock = (await dispatcher.execute(_ctx(agent), "current_time", {})).observation
    assert clock.status is ObservationStatus.OK


async def test_a_silent_server_times_out_naming_it_never_a_stuck_call(
    fake_store: FakeStore,
) -> None:
    class Silent(ScriptedMcpClient):
        async def call_tool(self, *args: Any, timeout_s: float, **kw: Any) -> McpCallResult:
            async with asyncio.timeout(timeout_s):  # what the real client does
                await asyncio.sleep(60)
            raise AssertionError("unreachable")

    client = Silent({URL: ScriptedServer(tools=[LOOKUP])})
    tools = mcp_tools("crm", _config(timeout_s=0.05), [LOOKUP], client)
    dispatcher, _, _ = _gate(tools, fake_store)
    obs = await dispatcher.execute(_ctx(_agent(["crm__lookup"])), "crm__lookup", {"id": 7})
    assert obs.observation.status is ObservationStatus.ERROR
    assert "MCP server 'crm' did not answer 'lookup' within 0.05s" in obs.observation.summary


async def test_a_dry_run_never_sends_a_write_call(fake_store: FakeStore) -> None:
    server = ScriptedServer(
        tools=[LOOKUP, UPDATE],
        answers={"lookup": text_result("read"), "update-customer": text_result("changed")},
    )
    client = ScriptedMcpClient({URL: server})
    tools = mcp_tools("crm", _config(), [LOOKUP, UPDATE], client)
    dispatcher, _, _ = _gate(tools, fake_store)
    update = mcp_tool_name("crm", "update-customer")
    agent = _agent(["crm__lookup", update])
    for mode, status in ((RunMode.DRY_RUN, "SIMULATED"), (RunMode.SHADOW, "PROPOSED")):
        obs = (await dispatcher.execute(_ctx(agent, mode), update, {"id": 1})).observation
        assert obs.status.value == status
    assert client.calls == []  # nothing with a side effect was sent
    read = await dispatcher.execute(_ctx(agent, RunMode.DRY_RUN), "crm__lookup", {"id": 1})
    assert read.observation.status is ObservationStatus.OK  # a READ call runs in a dry run
    assert [c.tool for c in client.calls] == ["lookup"]


async def test_credentials_come_from_the_secret_store_and_are_redacted(
    fake_store: FakeStore,
) -> None:
    echo = ScriptedServer(
        tools=[LOOKUP],
        answers={"lookup": lambda args: text_result("token s3cr3t-org-token seen")},
    )
    client = ScriptedMcpClient({URL: echo})
    secrets = Secrets({"crm_token": ("s3cr3t-org-token", "crm")})
    tools = mcp_tools("crm", _config(bearer_secret="crm_token"), [LOOKUP], client)
    dispatcher, _, _ = _gate(tools, fake_store, secrets)
    obs = await dispatcher.execute(_ctx(_agent(["crm__lookup"])), "crm__lookup", {"id": 1})
    assert client.calls[0].credentials.headers == {"Authorization": "Bearer s3cr3t-org-token"}
    assert "s3cr3t-org-token" not in str(obs.observation.output)
    assert "[REDACTED]" in str(obs.observation.output)


async def test_per_principal_credentials_are_the_callers_own(fake_store: FakeStore) -> None:
    client = ScriptedMcpClient({URL: ScriptedServer(tools=[LOOKUP], answers={
        "lookup": text_result("ok")
    })})  # fmt: skip
    agent = _agent(["crm__lookup"])
    alice = Principal(id="user:alice", org_id="acme", grant=Grant(tools=frozenset({"*"})))
    mine = principal_secret_name("crm_token", alice.id)
    theirs = principal_secret_name("crm_token", agent.principal().id)
    assert mine != theirs and mine.startswith("crm_token.principal.user_alice")
    secrets = Secrets({mine: ("alice-token", "crm"), "crm_token": ("org-token", "crm")})
    tools = mcp_tools(
        "crm", _config(bearer_secret="crm_token", per_principal=True), [LOOKUP], client
    )
    dispatcher, _, _ = _gate(tools, fake_store, secrets)
    ctx = InvocationContext(agent=agent, caller=alice, mode=AgentMode.INTERACTIVE)
    obs = (await dispatcher.execute(ctx, "crm__lookup", {"id": 1})).observation
    assert obs.status is ObservationStatus.OK, obs.summary
    call = client.calls[0]
    assert call.credentials.headers == {"Authorization": "Bearer alice-token"}
    assert call.key == "acme/crm/user:alice"  # a connection of her own
    # The agent acting on its own has no copy: a failed call, never the organisation's.
    auto = (await dispatcher.execute(_ctx(agent), "crm__lookup", {"id": 1})).observation
    assert auto.status is ObservationStatus.ERROR and "no secret" in auto.summary
    assert len(client.calls) == 1
    assert secrets.asked == [mine, theirs]


def test_principal_secret_names_never_meet() -> None:
    names = {principal_secret_name("t", p) for p in ("user:a", "user_a", "user-a", "a" * 200)}
    assert len(names) == 4
    assert all(len(n) <= 100 for n in names)


@pytest.mark.parametrize("org", ["acme", "globex"])
async def test_an_organisations_tools_are_its_own(fake_store: FakeStore, org: str) -> None:
    client = ScriptedMcpClient({URL: ScriptedServer(tools=[LOOKUP])})
    dispatcher, _, _ = _gate(mcp_tools("crm", _config(), [LOOKUP], client), fake_store)
    tool = dispatcher.registry.get("crm__lookup", org)
    assert (tool is not None) is (org == "acme")
    assert dispatcher.registry.get("crm__lookup") is None  # not process-wide
