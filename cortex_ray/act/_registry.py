"""The tools a runtime knows by name, and the action classifier that gives each its CoALA
category and capability tier."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from cortex_ray._types import ActionType, CapabilityTier, ToolSpec
from cortex_ray.act._tools import Tool
from cortex_ray.act.builtins import builtin_declarations

__all__ = ["ActionClassifier", "OrgToolSource", "ToolRegistry"]


class ActionClassifier:
    """Maps tools to CoALA action types and capability tiers.

    A tool's own declaration (``Tool(action_type=..., tier=...)``) decides; every built-in
    declares both (``cortex_ray.act.builtins``), so a name is classified as the built-in of
    that name declares. ``overrides`` and ``tiers`` classify by name: they re-class a
    built-in and classify a tool that declares nothing, but never beat a third-party tool's
    own declaration. A tool that declares nothing and is named by no override is GROUNDING,
    and its tier follows its category (REASONING and RETRIEVAL read; anything else may
    change something, so WRITE).

    REASONING holds no built-in tool: reasoning happens inside the model call that decides.
    Reading the clock is GROUNDING (it observes the outside world) and READ (it changes
    nothing); storing a fact is LEARNING and WRITE.
    """

    def __init__(
        self,
        overrides: Mapping[str, ActionType] | None = None,
        *,
        tiers: Mapping[str, CapabilityTier] | None = None,
    ) -> None:
        self._overrides = dict(overrides or {})
        self._tier_overrides = dict(tiers or {})
        self._builtins = {t.name: t for t in builtin_declarations()}

    def _declared(self, tool: Tool | str) -> Tool | None:
        """What decides for ``tool``: the tool itself, else the built-in of that name."""
        if isinstance(tool, Tool):
            return tool
        return self._builtins.get(tool)

    def classify(self, tool: Tool | str) -> ActionType:
        name = tool.name if isinstance(tool, Tool) else tool
        declared = self._declared(tool)
        if name in self._overrides and (declared is None or name in self._builtins):
            return self._overrides[name]
        if declared is not None and declared.action_type is not None:
            return declared.action_type
        return self._overrides.get(name, ActionType.GROUNDING)

    def tier(self, tool: Tool | str) -> CapabilityTier:
        """The tool's capability tier (see the class docstring)."""
        name = tool.name if isinstance(tool, Tool) else tool
        declared = self._declared(tool)
        if name in self._tier_overrides and (declared is None or name in self._builtins):
            return self._tier_overrides[name]
        if declared is not None and declared.tier is not None:
            return declared.tier
        known = self._tier_overrides.get(name)
        if known is not None:
            return known
        if self.classify(tool) in (ActionType.REASONING, ActionType.RETRIEVAL):
            return CapabilityTier.READ
        return CapabilityTier.WRITE


class OrgToolSource(Protocol):
    """Tools that exist in one organisation only (its registered MCP servers' approved
    tools): a view kept in memory, reloaded by ``load`` when it is stale."""

    def tools(self, org_id: str) -> Mapping[str, Tool]:
        """The organisation's tools as last loaded (empty before the first load)."""
        ...

    async def load(self, org_id: str) -> None:
        """Reload the organisation's tools if what this process holds may be stale."""
        ...


class ToolRegistry:
    """The tools this runtime knows, by name: the process-wide ones (built-ins, code
    connectors' tools), and with ``org_id`` an organisation's own from the attached
    ``OrgToolSource`` (a process-wide name wins; an organisation's tool names carry their
    connector's, ``<connector>__<tool>``). Callers that hold an organisation ``load`` it
    before they read (the gate, the assembler, the use cases)."""

    def __init__(
        self,
        tools: Iterable[Tool] = (),
        classifier: ActionClassifier | None = None,
        *,
        org_tools: OrgToolSource | None = None,
    ) -> None:
        self.classifier = classifier or ActionClassifier()
        self.org_tools = org_tools
        self._tools: dict[str, Tool] = {}
        # Every cycle lists the agent's tools: one ToolSpec per tool, built once (valid while
        # the same Tool and classifier are in place; ToolSpec is frozen).
        self._specs: dict[str, tuple[Tool, ActionClassifier, ToolSpec]] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if not tool.name.isidentifier():
            raise ValueError(f"tool names must be identifiers: {tool.name!r}")
        self._tools[tool.name] = tool

    def attach(self, source: OrgToolSource) -> None:
        """Consult ``source`` for organisations' own tools (the composition root does)."""
        self.org_tools = source

    async def load(self, org_id: str) -> None:
        """Bring the organisation's own tools up to date (see ``OrgToolSource.load``)."""
        if self.org_tools is not None:
            await self.org_tools.load(org_id)

    def get(self, name: str, org_id: str | None = None) -> Tool | None:
        tool = self._tools.get(name)
        if tool is None and org_id is not None and self.org_tools is not None:
            tool = self.org_tools.tools(org_id).get(name)
        return tool

    def names(self, org_id: str | None = None) -> list[str]:
        if org_id is None or self.org_tools is None:
            return sorted(self._tools)
        return sorted({*self._tools, *self.org_tools.tools(org_id)})

    def spec(self, tool: Tool) -> ToolSpec:
        # Keyed by name; two organisations' tools of one name are told apart by identity.
        cached = self._specs.get(tool.name)
        if cached is not None and cached[0] is tool and cached[1] is self.classifier:
            return cached[2]
        spec = ToolSpec(
            name=tool.name,
            description=tool.description,
            parameters=dict(tool.parameters),
            action_type=self.classifier.classify(tool),
            tier=self.classifier.tier(tool),
        )
        self._specs[tool.name] = (tool, self.classifier, spec)
        return spec
