"""Tools, their registry, and the action classifier."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from cortex_ray._types import (
    ActionType,
    Agent,
    AgentMode,
    CapabilityTier,
    Principal,
    ToolSpec,
    utcnow,
)

if TYPE_CHECKING:
    from cortex_ray.memory import MemoryService

__all__ = ["ActionClassifier", "Tool", "ToolContext", "ToolHandler", "ToolRegistry"]


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool handler may use: who calls, for which agent and step, and the services."""

    org_id: str
    agent: Agent
    principal: Principal
    mode: AgentMode
    run_id: UUID | None = None
    session_id: UUID | None = None
    step_index: int | None = None
    memory: MemoryService | None = None
    clock: Callable[[], datetime] = utcnow
    call_key: str | None = None
    """The key the caller gave this call (a turn's round, a direct call's
    ``Idempotency-Key``); read :attr:`idempotency_key`, which falls back to the run step's."""
    secrets: Any = None
    """The organisation's secret store (``cortex_ray.governance.SecretStore``)."""
    connector: str | None = None
    """The connector of the tool called, if any: it may read that connector's secrets."""
    revealed: list[str] = field(default_factory=list)
    """The secret values this call read: the gate redacts them from what the call returns."""

    async def secret(self, name: str) -> str:
        """A credential from the organisation's secret store (a connector's tool reads its
        connector's secrets and those bound to none). Never return or log it: the gate
        redacts it from the result and error anyway.

        Raises:
            NotFoundError: No such secret in the organisation.
            AccessDeniedError: It belongs to another connector.
            ConfigurationError: No secret store, or it does not open with the key.
        """
        if self.secrets is None:
            from cortex_ray._exceptions import ConfigurationError

            raise ConfigurationError("this runtime has no secret store")
        value: str = await self.secrets.reveal(self.org_id, name, connector=self.connector)
        self.revealed.append(value)
        return value

    @property
    def idempotency_key(self) -> str | None:
        """The key a side-effecting tool uses to never act twice (docs/tools.md).

        In a run ``f"{run_id}:{step_index}"``; in a turn ``f"turn:{turn_id}:{round}"``; for a
        direct call the caller's ``Idempotency-Key`` (namespaced by caller, agent and tool);
        ``None`` when the call has none (a direct call without the header). A retry of the
        same step or round (after a crash, on resume) carries the same key.
        """
        if self.call_key is not None:
            return self.call_key
        if self.run_id is None or self.step_index is None:
            return None
        return f"{self.run_id}:{self.step_index}"


ToolHandler = Callable[[ToolContext, dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Tool:
    """A callable action. ``parameters`` is the JSON schema its arguments are validated against.

    ``action_type`` and ``tier`` override the classifier for this tool; ``None`` lets the
    classifier decide. ``connector`` names the connector the tool belongs to: the gate then
    also needs a connector grant (``cortex_ray.governance``).
    """

    name: str
    description: str
    handler: ToolHandler
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}, "additionalProperties": False}
    )
    action_type: ActionType | None = None
    timeout_s: float | None = None
    idempotent: bool = False
    tier: CapabilityTier | None = None
    connector: str | None = None


class ActionClassifier:
    """Maps tools to CoALA action types: per-tool override, then by name, then GROUNDING;
    and to capability tiers: per-tool override, then by name, then by category (REASONING
    and RETRIEVAL read; anything else may change something, so WRITE).

    REASONING holds no built-in tool: reasoning happens inside the model call that decides.
    Reading the clock is GROUNDING (it observes the outside world) and READ (it changes
    nothing); storing a fact is LEARNING and WRITE.
    """

    BUILTIN: Mapping[str, ActionType] = {
        "memory_search": ActionType.RETRIEVAL,
        "knowledge_search": ActionType.RETRIEVAL,
        "remember_fact": ActionType.LEARNING,
        "propose_procedural_edit": ActionType.LEARNING,
        "current_time": ActionType.GROUNDING,
        "reply": ActionType.GROUNDING,
    }

    BUILTIN_TIERS: Mapping[str, CapabilityTier] = {
        "memory_search": CapabilityTier.READ,
        "knowledge_search": CapabilityTier.READ,
        "current_time": CapabilityTier.READ,
        "remember_fact": CapabilityTier.WRITE,
        "propose_procedural_edit": CapabilityTier.WRITE,
        # A reply reaches a person: it changes what they know.
        "reply": CapabilityTier.WRITE,
    }

    def __init__(
        self,
        overrides: Mapping[str, ActionType] | None = None,
        *,
        tiers: Mapping[str, CapabilityTier] | None = None,
    ) -> None:
        self._by_name = {**self.BUILTIN, **(overrides or {})}
        self._tiers = {**self.BUILTIN_TIERS, **(tiers or {})}

    def classify(self, tool: Tool | str) -> ActionType:
        if isinstance(tool, Tool):
            if tool.action_type is not None:
                return tool.action_type
            name = tool.name
        else:
            name = tool
        return self._by_name.get(name, ActionType.GROUNDING)

    def tier(self, tool: Tool | str) -> CapabilityTier:
        """The tool's capability tier (see the class docstring)."""
        if isinstance(tool, Tool) and tool.tier is not None:
            return tool.tier
        name = tool.name if isinstance(tool, Tool) else tool
        known = self._tiers.get(name)
        if known is not None:
            return known
        category = self.classify(tool)
        if category in (ActionType.REASONING, ActionType.RETRIEVAL):
            return CapabilityTier.READ
        return CapabilityTier.WRITE


class ToolRegistry:
    """The tools this runtime knows, by name."""

    def __init__(
        self, tools: Iterable[Tool] = (), classifier: ActionClassifier | None = None
    ) -> None:
        self.classifier = classifier or ActionClassifier()
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

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def spec(self, tool: Tool) -> ToolSpec:
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
