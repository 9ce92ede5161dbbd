"""Direct tool calls and the tool list."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from cortex_ray import ActionType, CapabilityTier, ToolSpec
from serve.schemas._common import JsonObject, Name, _Body, _Out

# tools -----------------------------------------------------------------------------------


class ToolCall(_Body):
    agent_id: Name = Field(description="the agent whose tool is called (id or name)")
    args: JsonObject = Field(default_factory=dict)


class ToolBody(_Out):
    name: str
    description: str
    parameters: dict[str, Any]
    action_type: ActionType
    tier: CapabilityTier = Field(description="read, write or admin: what a call may change")

    @classmethod
    def of(cls, spec: ToolSpec) -> ToolBody:
        return cls(
            name=spec.name,
            description=spec.description,
            parameters=spec.parameters,
            action_type=spec.action_type,
            tier=spec.tier,
        )


class ToolList(_Out):
    tools: list[ToolBody]
