"""The vocabulary of MCP servers registered as connectors, and the pinning rule.

A listing of a server's tools is compared with what is pinned (:func:`pin_listing`): the
first listing approves every definition; later a new tool or a changed digest is
``pending`` (its tool is withdrawn until an admin approves that digest); a tool no longer
listed is ``removed``; one listed again with its approved digest is ``restored``. A pure
function, so the rule is tested without a database; ``McpConnectorStore`` applies it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cortex_ray._types import CapabilityTier
from cortex_ray.governance._types import ConnectorInstance

__all__ = [
    "MCP_KIND",
    "McpRegistration",
    "PinChange",
    "PinStatus",
    "PinnedTool",
    "is_mcp_instance",
    "pin_listing",
]


MCP_KIND = "mcp"
"""``ConnectorInstance.config["kind"]`` of an MCP server's instance."""


def is_mcp_instance(instance: ConnectorInstance) -> bool:
    """Whether an installed connector is a registered MCP server (its definition is the
    registration, not code)."""
    return instance.config.get("kind") == MCP_KIND


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PinStatus(StrEnum):
    APPROVED = "approved"
    """Offered as a tool (its digest is the approved one)."""
    PENDING = "pending"
    """New, or changed since approved: disabled until an admin approves this digest."""
    REMOVED = "removed"
    """The server no longer lists it."""


class McpRegistration(_Model):
    """An MCP server registered in one organisation."""

    org_id: str
    name: str
    config: dict[str, Any]
    tier_overrides: dict[str, CapabilityTier] = Field(default_factory=dict)
    """Server tool name → the tier the gate uses instead of the annotations' default."""
    enabled_tools: tuple[str, ...] | None = None
    """The server's tools offered (``None``: all approved ones)."""
    created_by: str
    created_at: datetime
    refreshed_at: datetime | None = None
    enabled: bool = True


class PinnedTool(_Model):
    """One tool definition as pinned (``tool`` is the server's own name)."""

    org_id: str
    connector: str
    tool: str
    digest: str
    definition: dict[str, Any]
    status: PinStatus
    approved_digest: str | None = None
    first_seen: datetime
    changed_at: datetime
    approved_by: str | None = None
    approved_at: datetime | None = None


class PinChange(_Model):
    """What one listing changed for one tool (each is audited)."""

    tool: str
    change: Literal["pinned", "new", "changed", "removed", "restored"]
    status: PinStatus
    digest: str


def pin_listing(
    pinned: Mapping[str, PinnedTool], listed: Sequence[tuple[str, str]], *, first: bool
) -> list[PinChange]:
    """What a listing (``(tool, digest)`` each) changes against ``pinned`` (by tool name):
    one :class:`PinChange` per tool whose pin changes (see the module docstring)."""
    changes: list[PinChange] = []
    for tool, digest in listed:
        old = pinned.get(tool)
        if old is None:
            status = PinStatus.APPROVED if first else PinStatus.PENDING
            change: Literal["pinned", "new", "changed", "restored"] = "pinned" if first else "new"
            changes.append(PinChange(tool=tool, change=change, status=status, digest=digest))
            continue
        if old.digest == digest and old.status is not PinStatus.REMOVED:
            continue  # unchanged (still pending if it was)
        if digest == old.approved_digest:
            status, change = PinStatus.APPROVED, "restored"
        else:
            status, change = PinStatus.PENDING, "changed"
            if old.approved_digest is None:
                change = "new"  # never approved: as new as it was
        changes.append(PinChange(tool=tool, change=change, status=status, digest=digest))
    names = {tool for tool, _ in listed}
    for tool, old in pinned.items():
        if tool not in names and old.status is not PinStatus.REMOVED:
            changes.append(
                PinChange(tool=tool, change="removed", status=PinStatus.REMOVED, digest=old.digest)
            )
    return changes
