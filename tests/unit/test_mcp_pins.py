"""The pinning rule (``pin_listing``) and each organisation's MCP tools (``McpToolOverlay``)
without a database: the first listing approves; a changed digest or a new tool is pending
and its tool disappears from the agent until approved; a tool no longer listed is removed,
and restored without approval when it comes back unchanged."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fakes import ScriptedMcpClient

from cortex_ray._types import Agent, AgentMode, CapabilityTier, Grant
from cortex_ray.access import AccessControlService
from cortex_ray.act import ToolDispatcher, ToolRegistry, builtin_tools
from cortex_ray.governance import McpRegistration, PinnedTool, PinStatus, pin_listing
from cortex_ray.mcp import McpToolAnnotations, McpToolDefinition, McpToolOverlay
from cortex_ray.settings import ToolOptions

NOW = datetime(2026, 12, 3, tzinfo=UTC)
LOOKUP = McpToolDefinition(
    name="lookup", annotations=McpToolAnnotations(read_only_hint=True), description="Look up."
)
CHANGED = LOOKUP.model_copy(update={"description": "Look up, then email everyone."})
EXPORT = McpToolDefinition(name="export", description="Export.")


def _pin(d: McpToolDefinition, status: PinStatus, approved: str | None) -> PinnedTool:
    return PinnedTool(
        org_id="acme", connector="crm", tool=d.name, digest=d.digest(),
        definition=d.model_dump(mode="json"), status=status, approved_digest=approved,
        first_seen=NOW, changed_at=NOW,
    )  # fmt: skip


def _listing(*definitions: McpToolDefinition) -> list[tuple[str, str]]:
    return [(d.name, d.digest()) for d in definitions]


def _changes(pinned: dict[str, PinnedTool], *listed: McpToolDefinition, first: bool = False):
    found = pin_listing(pinned, _listing(*listed), first=first)
    return sorted((c.tool, c.change, c.status.value) for c in found)


def test_the_first_listing_approves_every_definition() -> None:
    assert _changes({}, LOOKUP, EXPORT, first=True) == [
        ("export", "pinned", "approved"),
        ("lookup", "pinned", "approved"),
    ]


def test_later_a_changed_or_new_tool_is_pending_and_a_missing_one_removed() -> None:
    pinned = {"lookup": _pin(LOOKUP, PinStatus.APPROVED, LOOKUP.digest())}
    assert _changes(pinned, LOOKUP) == []  # unchanged: nothing
    assert _changes(pinned, CHANGED, EXPORT) == [
        ("export", "new", "pending"),
        ("lookup", "changed", "pending"),
    ]
    assert _changes(pinned) == [("lookup", "removed", "removed")]
    # Changed back to what was approved: restored, no approval needed.
    pending = {"lookup": _pin(CHANGED, PinStatus.PENDING, LOOKUP.digest())}
    assert _changes(pending, LOOKUP) == [("lookup", "restored", "approved")]
    assert _changes(pending, CHANGED) == []  # still pending, no new row
    removed = {"lookup": _pin(LOOKUP, PinStatus.REMOVED, LOOKUP.digest())}
    assert _changes(removed, LOOKUP) == [("lookup", "restored", "approved")]
    assert _changes(removed, CHANGED) == [("lookup", "changed", "pending")]
    assert _changes(removed) == []  # removed stays removed
    never = {"export": _pin(EXPORT, PinStatus.REMOVED, None)}
    assert _changes(never, EXPORT) == [("export", "new", "pending")]


class Pins:
    """What ``McpConnectorStore.offered`` reads: registrations with approved pins."""

    def __init__(self) -> None:
        self.pins: dict[str, PinnedTool] = {}
        self.registration = McpRegistration(
            org_id="acme", name="crm",
            config={"transport": "http", "url": "https://crm.example.com/mcp"},
            tier_overrides={"export": CapabilityTier.ADMIN}, created_by="root", created_at=NOW,
        )  # fmt: skip

    async def offered(self, org_id: str) -> list[tuple[McpRegistration, list[PinnedTool]]]:
        if org_id != "acme":
            return []
        approved = [p for p in self.pins.values() if p.status is PinStatus.APPROVED]
        return [(self.registration, approved)]


async def test_a_pending_tool_disappears_from_the_agent_until_approved(fake_store: Any) -> None:
    pins = Pins()
    overlay = McpToolOverlay(pins, ScriptedMcpClient(), cache_s=3600)  # type: ignore[arg-type]
    registry = ToolRegistry(builtin_tools(), org_tools=overlay)
    dispatcher = ToolDispatcher(registry, AccessControlService(), fake_store, ToolOptions())
    agent = Agent(
        org_id="acme", name="clerk", tools=("crm__lookup", "crm__export", "current_time"),
        grant=Grant(tools=frozenset({"*"})),
    )  # fmt: skip

    async def space() -> dict[str, str]:
        await dispatcher.load_tools("acme")
        specs = dispatcher.action_space(agent, None, AgentMode.AUTONOMOUS)
        return {s.name: s.tier.value for s in specs}

    pins.pins = {
        "lookup": _pin(LOOKUP, PinStatus.APPROVED, LOOKUP.digest()),
        "export": _pin(EXPORT, PinStatus.APPROVED, EXPORT.digest()),
    }
    assert await space() == {"crm__lookup": "read", "crm__export": "admin", "current_time": "read"}
    # Changed on the server: pending. Within cache_s this process still holds the old view
    # until the change made here invalidates it (the use cases do).
    pins.pins["lookup"] = _pin(CHANGED, PinStatus.PENDING, LOOKUP.digest())
    assert "crm__lookup" in await space()
    overlay.invalidate("acme")
    assert await space() == {"crm__export": "admin", "current_time": "read"}
    assert registry.get("crm__lookup", "acme") is None
    # Approved: back, with the new definition.
    pins.pins["lookup"] = _pin(CHANGED, PinStatus.APPROVED, CHANGED.digest())
    overlay.invalidate("acme")
    assert "crm__lookup" in await space()
    tool = registry.get("crm__lookup", "acme")
    assert tool is not None and "email everyone" in tool.description
    # Another organisation has none of it.
    await registry.load("globex")
    assert registry.get("crm__lookup", "globex") is None


async def test_only_the_enabled_subset_is_offered() -> None:
    pins = Pins()
    pins.pins = {
        "lookup": _pin(LOOKUP, PinStatus.APPROVED, LOOKUP.digest()),
        "export": _pin(EXPORT, PinStatus.APPROVED, EXPORT.digest()),
    }
    pins.registration = pins.registration.model_copy(update={"enabled_tools": ("lookup",)})
    overlay = McpToolOverlay(pins, ScriptedMcpClient())  # type: ignore[arg-type]
    await overlay.load("acme")
    assert sorted(overlay.tools("acme")) == ["crm__lookup"]


async def test_a_definition_whose_schema_is_not_one_is_not_offered() -> None:
    pins = Pins()
    broken = McpToolDefinition(name="broken", input_schema={"type": "objekt"})
    pins.pins = {
        "lookup": _pin(LOOKUP, PinStatus.APPROVED, LOOKUP.digest()),
        "broken": _pin(broken, PinStatus.APPROVED, broken.digest()),
    }
    overlay = McpToolOverlay(pins, ScriptedMcpClient())  # type: ignore[arg-type]
    await overlay.load("acme")
    assert sorted(overlay.tools("acme")) == ["crm__lookup"]
