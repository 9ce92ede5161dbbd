"""Options of the connectors: how the MCP client reaches servers (``cortex_ray.mcp``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["ConnectorOptions"]


class ConnectorOptions(BaseModel):
    """Connectors to MCP servers (``cortex_ray.mcp``, docs/connectors.md): ``Settings.connectors``,
    ``CORTEX_CONNECTORS__<FIELD>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mcp_call_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="one MCP tool call's bound when its server sets none; past it the call is "
        "cancelled on the server and fails as a timeout",
    )
    mcp_connect_timeout_s: float = Field(
        default=20.0,
        gt=0,
        description="opening a session to an MCP server (start the process or reach the URL, "
        "then the protocol handshake)",
    )
    mcp_reconnect_backoff_s: float = Field(
        default=0.5,
        gt=0,
        description="after a failed connect, calls fail at once for this long before the next "
        "attempt; it doubles with each failure in a row",
    )
    mcp_reconnect_max_backoff_s: float = Field(
        default=30.0, gt=0, description="the longest wait between connect attempts"
    )
    mcp_allowed_hosts: list[str] = Field(
        default_factory=list,
        description="hosts an HTTP MCP server may be at: exact names or ``*.suffix`` (empty: any "
        "host but link-local and cloud metadata addresses, which are always refused)",
    )
    mcp_list_refresh_s: float = Field(
        default=300.0,
        gt=0,
        description="how often a server's tool list is listed again to find changed definitions",
    )

    @model_validator(mode="after")
    def _check(self) -> ConnectorOptions:
        if self.mcp_reconnect_backoff_s > self.mcp_reconnect_max_backoff_s:
            raise ValueError("mcp_reconnect_backoff_s must be <= mcp_reconnect_max_backoff_s")
        return self
