"""Agents: create, change, read."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import Field, model_validator

from cortex_ray import Agent, AgentChanges, AgentMode
from serve.schemas._common import GrantBody, LongText, Name, SafeName, _Body, _grant_body, _Out

# agents ----------------------------------------------------------------------------------


class AgentCreate(_Body):
    name: SafeName = Field(
        description="1-128 of A-Z a-z 0-9 _ . -, starting with a letter or digit "
        "(addressable in a path as it is)"
    )
    persona: LongText = ""
    mode: AgentMode = AgentMode.INTERACTIVE
    tools: list[Name] | None = Field(
        default=None, max_length=256, description="tool names; default: every built-in tool"
    )
    skills: list[LongText] = Field(default_factory=list, max_length=64)
    grant: GrantBody | None = Field(
        default=None, description="default: a grant for exactly the agent's tools"
    )
    critic: bool = Field(
        default=False,
        description="the inner voice: review each final answer or reply before it is given",
    )


class AgentUpdate(_Body):
    """Only the fields given change; ``grant: null`` removes the agent's policy (deny all)."""

    persona: LongText | None = None
    mode: AgentMode | None = None
    tools: list[Name] | None = Field(default=None, max_length=256)
    skills: list[LongText] | None = Field(default=None, max_length=64)
    grant: GrantBody | None = None
    critic: bool | None = None

    @model_validator(mode="after")
    def _something(self) -> AgentUpdate:
        if not self.model_fields_set:
            raise ValueError(
                "nothing to update: give persona, mode, tools, skills, grant or critic"
            )
        for field in ("persona", "mode", "tools", "skills", "critic"):
            if field in self.model_fields_set and getattr(self, field) is None:
                raise ValueError(f"{field} cannot be null")
        return self

    def to_changes(self) -> AgentChanges:
        """The core's partial update: the same fields set."""
        given = self.model_fields_set
        values: dict[str, Any] = {}
        if "persona" in given:
            values["persona"] = self.persona
        if "mode" in given:
            values["mode"] = self.mode
        if "tools" in given and self.tools is not None:
            values["tools"] = tuple(self.tools)
        if "skills" in given and self.skills is not None:
            values["skills"] = tuple(self.skills)
        if "grant" in given:
            values["grant"] = None if self.grant is None else self.grant.to_grant()
        if "critic" in given:
            values["critic"] = self.critic
        return AgentChanges(**values)


class AgentBody(_Out):
    id: UUID
    name: str
    persona: str
    mode: AgentMode
    tools: list[str]
    skills: list[str]
    grant: GrantBody | None
    critic: bool
    created_at: datetime
    updated_at: datetime


def from_agent(agent: Agent) -> AgentBody:
    return AgentBody(
        id=agent.id,
        name=agent.name,
        persona=agent.persona,
        mode=agent.mode,
        tools=list(agent.tools),
        skills=list(agent.skills),
        grant=_grant_body(agent.grant),
        critic=agent.critic,
        created_at=agent.created_at,
        updated_at=agent.updated_at,
    )


class AgentList(_Out):
    agents: list[AgentBody]
