"""MCP servers as governed connectors (issue 31): registrations and pinned tool definitions.

``mcp_connectors`` is one row per MCP server an organisation registered: its name (also the
name of its ``connector_instances`` row, which the gate's grants hang from), the server
configuration as JSON (``McpServerConfig``: where to reach it and the NAMES of the secrets
it uses, never their values), who registered it and when, per-tool tier overrides and the
enabled subset of its tools (null: all). ``mcp_tool_pins`` holds each tool definition the
server listed, pinned by the sha256 of its canonical JSON: ``approved`` (its tool is
offered), ``pending`` (new, or changed since it was approved: not offered until an admin
approves the new digest) or ``removed`` (no longer listed).

Revision ID: 0022
Revises: 0021
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE mcp_connectors (
            org_id         text NOT NULL,
            name           text NOT NULL,
            config         jsonb NOT NULL,
            tier_overrides jsonb NOT NULL DEFAULT '{}',
            enabled_tools  text[],
            created_by     text NOT NULL,
            created_at     timestamptz NOT NULL DEFAULT now(),
            refreshed_at   timestamptz,
            PRIMARY KEY (org_id, name),
            FOREIGN KEY (org_id, name) REFERENCES connector_instances (org_id, connector)
                ON DELETE CASCADE
        );
        CREATE TABLE mcp_tool_pins (
            org_id      text NOT NULL,
            connector   text NOT NULL,
            tool        text NOT NULL,
            digest      text NOT NULL CHECK (digest ~ '^[0-9a-f]{64}$'),
            definition  jsonb NOT NULL,
            status      text NOT NULL CHECK (status IN ('approved', 'pending', 'removed')),
            approved_digest text,
            first_seen  timestamptz NOT NULL DEFAULT now(),
            changed_at  timestamptz NOT NULL DEFAULT now(),
            approved_by text,
            approved_at timestamptz,
            PRIMARY KEY (org_id, connector, tool),
            FOREIGN KEY (org_id, connector) REFERENCES mcp_connectors (org_id, name)
                ON DELETE CASCADE
        );
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE mcp_tool_pins;
        -- grants reference the instances: they stay, the connectors are switched off
        UPDATE connector_instances i SET enabled = false FROM mcp_connectors m
            WHERE i.org_id = m.org_id AND i.connector = m.name;
        DROP TABLE mcp_connectors;
        """
    )
