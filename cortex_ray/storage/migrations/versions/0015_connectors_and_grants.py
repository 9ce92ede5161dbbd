"""Connectors installed per organisation, grants per principal, and the governed audit row.

``connector_instances`` is one row per connector an organisation installed (its non-secret
configuration, enabled or not, its last health check). ``connector_grants`` says which
principal (``*``: every principal of the organisation) may call which of a connector's
tools, up to which tier, under which argument constraints, until when, and whether a call
needs approval; a revoked grant keeps its row (``revoked_at``). Every ``audit_log`` row now
also records the gate's decision (allowed, denied, approval_required, refused, error,
cancelled; later simulated and proposed), hashes of the arguments and the (redacted)
result, the result's source ids, the connector and the grants that allowed it, and the
workflow and run mode it ran under.

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE connector_instances (
            org_id            text NOT NULL REFERENCES organisations (id),
            connector         text NOT NULL,
            config            jsonb NOT NULL DEFAULT '{}',
            enabled           boolean NOT NULL DEFAULT true,
            health            text NOT NULL DEFAULT 'unknown',
            health_checked_at timestamptz,
            created_at        timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, connector)
        );
        CREATE TABLE connector_grants (
            org_id       text NOT NULL,
            id           uuid NOT NULL,
            principal_id text NOT NULL,
            connector    text NOT NULL,
            tools        text[] NOT NULL DEFAULT '{}',
            max_tier     text NOT NULL CHECK (max_tier IN ('read', 'write', 'admin')),
            constraints  jsonb NOT NULL DEFAULT '{}',
            approval     text NOT NULL CHECK (approval IN ('never', 'writes', 'always')),
            expires_at   timestamptz,
            created_by   text NOT NULL DEFAULT '',
            created_at   timestamptz NOT NULL DEFAULT now(),
            revoked_at   timestamptz,
            PRIMARY KEY (org_id, id),
            FOREIGN KEY (org_id, connector) REFERENCES connector_instances (org_id, connector)
        );
        CREATE INDEX connector_grants_call ON connector_grants (org_id, connector, principal_id)
            WHERE revoked_at IS NULL;
        ALTER TABLE audit_log
            ADD COLUMN decision      text,
            ADD COLUMN input_sha256  text,
            ADD COLUMN result_sha256 text,
            ADD COLUMN source_ids    text[],
            ADD COLUMN connector     text,
            ADD COLUMN grant_ids     uuid[],
            ADD COLUMN workflow_id   uuid,
            ADD COLUMN run_mode      text;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE audit_log DROP COLUMN decision, DROP COLUMN input_sha256,
            DROP COLUMN result_sha256, DROP COLUMN source_ids, DROP COLUMN connector,
            DROP COLUMN grant_ids, DROP COLUMN workflow_id, DROP COLUMN run_mode;
        DROP TABLE connector_grants;
        DROP TABLE connector_instances;
        """
    )
