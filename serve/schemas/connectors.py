"""MCP servers as connectors: registrations, pinned tool definitions, pin changes."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from cortex_ray import CapabilityTier
from cortex_ray.governance import PinChange, PinnedTool, PinStatus
from cortex_ray.mcp import McpServerConfig, McpTransport, mcp_tool_name
from cortex_ray.runtime import McpServerView
from serve.schemas._common import Name, Number, SafeName, Text, _Body, _clean, _Out

SecretRef = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$")]
"""The name of a secret of the organisation's secret store (never a value)."""
ToolName = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_clean)]
_Key = Annotated[str, Field(max_length=200), AfterValidator(_clean)]


class McpServerBody(_Body):
    """How to reach the server; credentials are named secrets, never values."""

    transport: McpTransport = Field(
        description="`http` (streamable HTTP); `stdio` is refused over HTTP (403): only the "
        "local operator (CLI, Python) registers a command"
    )
    url: Text | None = Field(default=None, max_length=2000)
    headers: dict[_Key, SecretRef] = Field(
        default_factory=dict, description="header name → the secret holding its value"
    )
    bearer_secret: SecretRef | None = None
    per_principal: bool = Field(
        default=False,
        description="each caller's own credentials: `<secret>.principal.<principal id>`",
    )
    command: Text | None = None
    args: list[Text] = Field(default_factory=list, max_length=100)
    env: dict[_Key, SecretRef] = Field(default_factory=dict)
    cwd: Text | None = None
    timeout_s: Number | None = Field(default=None, gt=0)

    def config(self) -> McpServerConfig:
        return McpServerConfig(**self.model_dump())


class McpRegister(_Body):
    name: SafeName = Field(description="the connector's name: an identifier without `__`")
    server: McpServerBody
    tier_overrides: dict[ToolName, CapabilityTier] = Field(default_factory=dict)
    enabled_tools: list[ToolName] | None = Field(
        default=None, description="the server's tools offered (null: every approved one)"
    )
    refresh: bool = Field(default=True, description="list and pin its tools now")


class PinBody(_Out):
    tool: str
    name: str = Field(description="the tool's cortex-ray name (`<connector>__<tool>`)")
    digest: str
    status: PinStatus
    approved_digest: str | None
    definition: dict[str, Any]
    first_seen: datetime
    changed_at: datetime
    approved_by: str | None
    approved_at: datetime | None

    @classmethod
    def of(cls, pin: PinnedTool) -> PinBody:
        fields = pin.model_dump(exclude={"org_id", "connector"})
        return cls(name=mcp_tool_name(pin.connector, pin.tool), **fields)


class McpServerOut(_Out):
    name: str
    config: dict[str, Any]
    tier_overrides: dict[str, CapabilityTier]
    enabled_tools: list[str] | None
    enabled: bool
    health: str
    created_by: str
    created_at: datetime
    refreshed_at: datetime | None
    tools: list[PinBody]

    @classmethod
    def of(cls, view: McpServerView) -> McpServerOut:
        r = view.registration
        return cls(
            name=r.name,
            config=r.config,
            tier_overrides=r.tier_overrides,
            enabled_tools=None if r.enabled_tools is None else list(r.enabled_tools),
            enabled=r.enabled,
            health=view.health,
            created_by=r.created_by,
            created_at=r.created_at,
            refreshed_at=r.refreshed_at,
            tools=[PinBody.of(p) for p in view.pins],
        )


class McpServerList(_Out):
    servers: list[McpServerOut]


class PinChangeBody(_Out):
    tool: str
    change: Literal["pinned", "new", "changed", "removed", "restored"]
    status: PinStatus
    digest: str

    @classmethod
    def of(cls, change: PinChange) -> PinChangeBody:
        return cls(**change.model_dump())


class PinChanges(_Out):
    changes: list[PinChangeBody]


class PinApprove(_Body):
    digest: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = Field(
        default=None, description="the pending digest reviewed (refused if it changed since)"
    )


class TierSet(_Body):
    tier: CapabilityTier | None = Field(description="null: back to the annotations' default")


class ToolsSet(_Body):
    tools: list[Name] | None = Field(description="the server's tools offered (null: all)")


class OwnCredentialPut(_Body):
    """A person's own value of a secret a per-principal server's configuration names."""

    value: Annotated[str, AfterValidator(_clean)] = Field(
        min_length=1, max_length=16_384, description="never returned; no NUL"
    )


class OwnCredentialOut(_Out):
    name: str = Field(description="the secret it is stored as: <secret>.principal.<caller>")
    connector: str | None
    created_by: str
    created_at: datetime
    updated_at: datetime
