"""Capability tiers (issue 18, point 1): every tool has a tier beside its action category,
classified by name for the built-ins, overridable per tool, shown in the action space and
recorded on every dispatch."""

from __future__ import annotations

from typing import Any, cast

from cortex_ray import (
    ActionType,
    Agent,
    AgentMode,
    CapabilityTier,
    Grant,
    ObservationStatus,
    Settings,
)
from cortex_ray.access import AccessControlService, Tier
from cortex_ray.act import (
    ActionClassifier,
    InvocationContext,
    Tool,
    ToolContext,
    ToolDispatcher,
    ToolRegistry,
    builtin_declarations,
    builtin_tools,
)
from cortex_ray.graph import graph_search_tool
from cortex_ray.knowledge import knowledge_search_tool
from cortex_ray.perceive import PromptComposer
from cortex_ray.storage import Store


async def noop(ctx: ToolContext, args: dict[str, Any]) -> str:
    return "done"


SEND = Tool(name="send_mail", description="Send an e-mail.", handler=noop)
LOOKUP = Tool(
    name="lookup", description="Look a thing up.", handler=noop, action_type=ActionType.RETRIEVAL
)
DROP = Tool(name="drop_table", description="Drop a table.", handler=noop, tier=CapabilityTier.ADMIN)


def test_builtins_are_classified_by_name() -> None:
    classifier = ActionClassifier()
    tiers = {t.name: classifier.tier(t) for t in builtin_tools()}
    assert tiers == {
        "current_time": CapabilityTier.READ,
        "memory_search": CapabilityTier.READ,
        "remember_fact": CapabilityTier.WRITE,
        "propose_procedural_edit": CapabilityTier.WRITE,
        "reply": CapabilityTier.WRITE,  # a reply reaches a person
    }
    assert classifier.tier("knowledge_search") is CapabilityTier.READ


# Every built-in tool: its CoALA category and capability tier (issue 29: each declares both
# on its Tool, so a new one has no name map to be forgotten in).
BUILTINS = {
    "current_time": (ActionType.GROUNDING, CapabilityTier.READ),
    "reply": (ActionType.GROUNDING, CapabilityTier.WRITE),
    "memory_search": (ActionType.RETRIEVAL, CapabilityTier.READ),
    "remember_fact": (ActionType.LEARNING, CapabilityTier.WRITE),
    "propose_procedural_edit": (ActionType.LEARNING, CapabilityTier.WRITE),
    "knowledge_search": (ActionType.RETRIEVAL, CapabilityTier.READ),
    "graph_search": (ActionType.RETRIEVAL, CapabilityTier.READ),
}


def test_every_builtin_declares_its_category_and_tier() -> None:
    bound = [
        *builtin_tools(),
        knowledge_search_tool(cast(Any, None)),
        graph_search_tool(cast(Any, None)),
    ]
    for tools in (bound, builtin_declarations()):
        assert {t.name: (t.action_type, t.tier) for t in tools} == BUILTINS
    classifier = ActionClassifier()
    registry = ToolRegistry(bound)
    for name, (category, tier) in BUILTINS.items():
        assert (classifier.classify(name), classifier.tier(name)) == (category, tier)
    specs = {t.name: registry.spec(t) for t in bound}
    assert {n: (s.action_type, s.tier) for n, s in specs.items()} == BUILTINS


def test_unclassified_tools_follow_their_category_and_default_to_write() -> None:
    classifier = ActionClassifier()
    assert classifier.tier(SEND) is CapabilityTier.WRITE  # GROUNDING, unknown: may change things
    assert classifier.tier(LOOKUP) is CapabilityTier.READ  # RETRIEVAL reads
    assert classifier.tier(DROP) is CapabilityTier.ADMIN  # the tool's own override wins


def test_overrides_by_name_and_per_tool() -> None:
    classifier = ActionClassifier(
        tiers={"send_mail": CapabilityTier.ADMIN, "current_time": CapabilityTier.WRITE}
    )
    assert classifier.tier(SEND) is CapabilityTier.ADMIN
    assert classifier.tier("current_time") is CapabilityTier.WRITE
    pinned = Tool(name="send_mail", description="", handler=noop, tier=CapabilityTier.READ)
    assert classifier.tier(pinned) is CapabilityTier.READ  # the tool's own beats the name map


def test_use_case_tiers_are_the_same_tiers() -> None:
    assert Tier is CapabilityTier
    assert Tier.ADMIN.value == "admin"


def test_the_action_space_shows_each_tool_tier() -> None:
    registry = ToolRegistry([*builtin_tools(), SEND, LOOKUP, DROP])
    specs = {s.name: s for s in (registry.spec(t) for t in [SEND, LOOKUP, DROP])}
    assert specs["send_mail"].tier is CapabilityTier.WRITE
    assert specs["lookup"].tier is CapabilityTier.READ
    assert specs["drop_table"].tier is CapabilityTier.ADMIN
    from cortex_ray import MemorySnapshot, WorkingMemory

    for mode in AgentMode:
        wm = WorkingMemory(
            mode=mode,
            agent_name="a",
            persona="",
            objective="o",
            snapshot=MemorySnapshot(query="o"),
            action_space=tuple(specs.values()),
        )
        block = PromptComposer().action_space_block(wm)
        assert "Send an e-mail. (tier: write)" in block
        assert "Look a thing up. (tier: read)" in block
        assert "Drop a table. (tier: admin)" in block


async def test_every_dispatch_records_its_tier(store: Store, org: str) -> None:
    registry = ToolRegistry([*builtin_tools(), SEND, DROP])
    gate = ToolDispatcher(registry, AccessControlService(), store, Settings().tools)
    agent = Agent(
        org_id=org,
        name="a",
        mode=AgentMode.AUTONOMOUS,
        tools=("send_mail", "current_time", "drop_table"),
        grant=Grant(tools=frozenset({"send_mail", "current_time"})),
    )
    ctx = InvocationContext(agent=agent, caller=None, mode=AgentMode.AUTONOMOUS)
    assert (await gate.invoke(ctx, "send_mail", {})).status is ObservationStatus.OK
    assert (await gate.invoke(ctx, "current_time", {})).status is ObservationStatus.OK
    denied = await gate.invoke(ctx, "drop_table", {})
    assert denied.status is ObservationStatus.REFUSED
    unknown = await gate.invoke(ctx, "nope", {})
    assert unknown.status is ObservationStatus.REFUSED
    rows = await store.audit_rows(org)
    assert [(r["tool"], r["tier"]) for r in rows] == [
        ("send_mail", "write"),
        ("current_time", "read"),
        ("drop_table", "admin"),  # a refused call records it too
        ("nope", "write"),  # an unknown tool is assumed to write
    ]
