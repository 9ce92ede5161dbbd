"""The store of MCP servers registered as connectors, and of the tool definitions each one
pinned (the vocabulary and the pinning rule: ``_pins``).

A registration is per organisation: the server configuration (``McpServerConfig`` as JSON:
where to reach it and the names of its secrets, never their values), tier overrides per
tool and the enabled subset of its tools. It is also a ``connector_instances`` row (config
``{"kind": "mcp"}``), so grants, health and the gate's connector policy treat it as any
connector. Each definition the server lists is pinned by its digest: the first listing
approves them all; later a new tool, or a changed digest, is ``pending`` (its tool is not
offered) until an admin approves it; a tool the server no longer lists is ``removed``.

This module knows no MCP type (``cortex_ray.mcp`` sits above governance): configurations
and definitions are JSON here, validated by the layer that builds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

from cortex_ray._exceptions import ConflictError, NotFoundError
from cortex_ray._types import CapabilityTier, utcnow
from cortex_ray.governance._pins import (
    MCP_KIND,
    McpRegistration,
    PinChange,
    PinnedTool,
    PinStatus,
    pin_listing,
)
from cortex_ray.storage import Database

__all__ = ["McpConnectorStore"]


def _registration(row: dict[str, Any]) -> McpRegistration:
    return McpRegistration(
        org_id=row["org_id"],
        name=row["name"],
        config=row["config"],
        tier_overrides=row["tier_overrides"] or {},
        enabled_tools=None if row["enabled_tools"] is None else tuple(row["enabled_tools"]),
        created_by=row["created_by"],
        created_at=row["created_at"],
        refreshed_at=row["refreshed_at"],
        enabled=row.get("enabled", True),
    )


def _pin(row: dict[str, Any]) -> PinnedTool:
    return PinnedTool(**{k: row[k] for k in PinnedTool.model_fields})


_SELECT = """
SELECT m.*, i.enabled FROM mcp_connectors m
JOIN connector_instances i ON i.org_id = m.org_id AND i.connector = m.name
"""


class McpConnectorStore:
    """Reads and writes of ``mcp_connectors`` and ``mcp_tool_pins`` (every statement
    filters by organisation, but the system sweep's ``all_registrations``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def register(self, registration: McpRegistration) -> McpRegistration:
        """Record a new registration and its connector instance, in one transaction.

        Raises:
            ConflictError: The organisation has a connector of that name already.
        """
        r = registration
        async with self.db.transaction() as conn:
            # A removed MCP server's instance is taken over (its grants stay revoked); an
            # installed code connector of that name is not.
            cur = await conn.execute(
                """
                INSERT INTO connector_instances (org_id, connector, config, enabled, created_at)
                VALUES (%s, %s, %s, true, %s)
                ON CONFLICT (org_id, connector) DO UPDATE SET config = EXCLUDED.config,
                    enabled = true, health = 'unknown', health_checked_at = NULL
                WHERE connector_instances.config->>'kind' = %s
                  AND NOT EXISTS (SELECT 1 FROM mcp_connectors m WHERE m.org_id = %s
                                  AND m.name = %s)
                RETURNING connector
                """,
                (r.org_id, r.name, Jsonb({"kind": MCP_KIND}), r.created_at, MCP_KIND,
                 r.org_id, r.name),
            )  # fmt: skip
            if await cur.fetchone() is None:
                raise ConflictError(f"a connector named {r.name!r} exists in this organisation")
            await conn.execute(
                """
                INSERT INTO mcp_connectors (org_id, name, config, tier_overrides, enabled_tools,
                    created_by, created_at)
                VALUES (%s, %s, %s, %s, %s, %s, %s)
                """,
                (r.org_id, r.name, Jsonb(r.config),
                 Jsonb({k: v.value for k, v in r.tier_overrides.items()}),
                 None if r.enabled_tools is None else list(r.enabled_tools),
                 r.created_by, r.created_at),
            )  # fmt: skip
        return await self.get(r.org_id, r.name)

    async def get(self, org_id: str, name: str) -> McpRegistration:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                _SELECT + "WHERE m.org_id = %s AND m.name = %s", (org_id, name)
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"no MCP server {name!r} is registered in this organisation")
        return _registration(row)

    async def find(self, org_id: str, name: str) -> McpRegistration | None:
        try:
            return await self.get(org_id, name)
        except NotFoundError:
            return None

    async def registrations(self, org_id: str) -> list[McpRegistration]:
        async with self.db.connection() as conn:
            cur = await conn.execute(_SELECT + "WHERE m.org_id = %s ORDER BY m.name", (org_id,))
            return [_registration(r) for r in await cur.fetchall()]

    async def all_registrations(self) -> list[McpRegistration]:
        """Every organisation's enabled registrations: the one read across organisations,
        for the system's periodic refresh (``McpListRefresher``)."""
        async with self.db.connection() as conn:
            cur = await conn.execute(_SELECT + "WHERE i.enabled ORDER BY m.org_id, m.name")
            return [_registration(r) for r in await cur.fetchall()]

    async def remove(self, org_id: str, name: str) -> None:
        """Remove a registration and its pins; its grants are revoked and its instance is
        disabled (grants and audit rows keep naming it)."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "DELETE FROM mcp_connectors WHERE org_id = %s AND name = %s RETURNING name",
                (org_id, name),
            )
            if await cur.fetchone() is None:
                raise NotFoundError(f"no MCP server {name!r} is registered in this organisation")
            await conn.execute(
                """
                UPDATE connector_grants SET revoked_at = coalesce(revoked_at, %s)
                WHERE org_id = %s AND connector = %s
                """,
                (utcnow(), org_id, name),
            )
            await conn.execute(
                "UPDATE connector_instances SET enabled = false "
                "WHERE org_id = %s AND connector = %s",
                (org_id, name),
            )

    async def set_tier(
        self, org_id: str, name: str, tool: str, tier: CapabilityTier | None
    ) -> McpRegistration:
        """Override one tool's tier (``None``: back to the annotations' default)."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                UPDATE mcp_connectors SET tier_overrides = CASE WHEN %s::text IS NULL
                    THEN tier_overrides - %s::text
                    ELSE tier_overrides || jsonb_build_object(%s::text, %s::text)
                    END
                WHERE org_id = %s AND name = %s RETURNING name
                """,
                (None if tier is None else tier.value, tool, tool,
                 None if tier is None else tier.value, org_id, name),
            )  # fmt: skip
            if await cur.fetchone() is None:
                raise NotFoundError(f"no MCP server {name!r} is registered in this organisation")
        return await self.get(org_id, name)

    async def set_enabled_tools(
        self, org_id: str, name: str, tools: Sequence[str] | None
    ) -> McpRegistration:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "UPDATE mcp_connectors SET enabled_tools = %s WHERE org_id = %s AND name = %s "
                "RETURNING name",
                (None if tools is None else list(tools), org_id, name),
            )
            if await cur.fetchone() is None:
                raise NotFoundError(f"no MCP server {name!r} is registered in this organisation")
        return await self.get(org_id, name)

    async def pins(self, org_id: str, name: str | None = None) -> list[PinnedTool]:
        """The pinned definitions of one server (or of every server) of the organisation."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM mcp_tool_pins WHERE org_id = %s
                  AND (%s::text IS NULL OR connector = %s)
                ORDER BY connector, tool
                """,
                (org_id, name, name),
            )
            return [_pin(r) for r in await cur.fetchall()]

    async def offered(self, org_id: str) -> list[tuple[McpRegistration, list[PinnedTool]]]:
        """Every enabled registration with its approved pins (what becomes tools), in one
        read."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                _SELECT + "WHERE m.org_id = %s AND i.enabled ORDER BY m.name", (org_id,)
            )
            registrations = [_registration(r) for r in await cur.fetchall()]
            cur = await conn.execute(
                """
                SELECT p.* FROM mcp_tool_pins p
                JOIN connector_instances i ON i.org_id = p.org_id AND i.connector = p.connector
                WHERE p.org_id = %s AND p.status = 'approved' AND i.enabled
                ORDER BY p.connector, p.tool
                """,
                (org_id,),
            )
            pins = [_pin(r) for r in await cur.fetchall()]
        return [(r, [p for p in pins if p.connector == r.name]) for r in registrations]

    async def apply_listing(
        self, org_id: str, name: str, listed: Sequence[tuple[str, str, dict[str, Any]]], by: str
    ) -> list[PinChange]:
        """Pin what a listing of the server returned (``(tool, digest, definition)`` each),
        under a lock of the registration, and say what changed (see the module docstring)."""
        now = utcnow()
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "SELECT refreshed_at FROM mcp_connectors WHERE org_id = %s AND name = %s "
                "FOR UPDATE",
                (org_id, name),
            )
            row = await cur.fetchone()
            if row is None:
                raise NotFoundError(f"no MCP server {name!r} is registered in this organisation")
            first = row["refreshed_at"] is None
            cur = await conn.execute(
                "SELECT * FROM mcp_tool_pins WHERE org_id = %s AND connector = %s",
                (org_id, name),
            )
            pinned = {r["tool"]: _pin(r) for r in await cur.fetchall()}
            definitions = {tool: definition for tool, _, definition in listed}
            changes = pin_listing(pinned, [(t, d) for t, d, _ in listed], first=first)
            for c in changes:
                if c.tool not in pinned:
                    approved = c.status is PinStatus.APPROVED
                    await conn.execute(
                        """
                        INSERT INTO mcp_tool_pins (org_id, connector, tool, digest, definition,
                            status, approved_digest, first_seen, changed_at, approved_by,
                            approved_at)
                        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
                        """,
                        (org_id, name, c.tool, c.digest, Jsonb(definitions[c.tool]),
                         c.status.value, c.digest if approved else None, now, now,
                         by if approved else None, now if approved else None),
                    )  # fmt: skip
                elif c.status is PinStatus.REMOVED:
                    await conn.execute(
                        """
                        UPDATE mcp_tool_pins SET status = 'removed', changed_at = %s
                        WHERE org_id = %s AND connector = %s AND tool = %s
                        """,
                        (now, org_id, name, c.tool),
                    )
                else:
                    await conn.execute(
                        """
                        UPDATE mcp_tool_pins SET digest = %s, definition = %s, status = %s,
                            changed_at = %s
                        WHERE org_id = %s AND connector = %s AND tool = %s
                        """,
                        (c.digest, Jsonb(definitions[c.tool]), c.status.value, now, org_id,
                         name, c.tool),
                    )  # fmt: skip
            await conn.execute(
                "UPDATE mcp_connectors SET refreshed_at = %s WHERE org_id = %s AND name = %s",
                (now, org_id, name),
            )
        return changes

    async def approve(
        self, org_id: str, name: str, tool: str, digest: str | None, by: str
    ) -> PinnedTool:
        """Approve a pending definition (``digest``, when given, must be the one pending:
        an admin approves what they reviewed, not what changed since).

        Raises:
            NotFoundError: No such pinned tool.
            ConflictError: It is not pending, or its digest is not ``digest``.
        """
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                UPDATE mcp_tool_pins SET status = 'approved', approved_digest = digest,
                    approved_by = %s, approved_at = %s, changed_at = %s
                WHERE org_id = %s AND connector = %s AND tool = %s AND status = 'pending'
                  AND (%s::text IS NULL OR digest = %s)
                RETURNING *
                """,
                (by, utcnow(), utcnow(), org_id, name, tool, digest, digest),
            )
            row = await cur.fetchone()
        if row is not None:
            return _pin(row)
        found = {p.tool: p for p in await self.pins(org_id, name)}.get(tool)
        if found is None:
            raise NotFoundError(f"MCP server {name!r} has no tool {tool!r}")
        if found.status is not PinStatus.PENDING:
            raise ConflictError(f"tool {tool!r} of {name!r} is {found.status.value}, not pending")
        raise ConflictError(
            f"tool {tool!r} of {name!r} changed again: its pending digest is {found.digest}"
        )
