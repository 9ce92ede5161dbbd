"""API keys (stored hashed) and step intents (crash-resume without repeating side effects).

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE api_keys (
            org_id       text NOT NULL,
            id           uuid NOT NULL,
            principal_id text NOT NULL,
            key_hash     bytea NOT NULL UNIQUE,
            prefix       text NOT NULL,
            name         text NOT NULL DEFAULT '',
            created_at   timestamptz NOT NULL DEFAULT now(),
            revoked_at   timestamptz,
            PRIMARY KEY (org_id, id),
            FOREIGN KEY (org_id, principal_id) REFERENCES principals (org_id, id)
        );

        -- Written before a side-effecting (non-idempotent) tool runs, deleted in the step's
        -- own transaction. One left behind means the process died mid-step: the step is
        -- decided again rather than blindly re-executed.
        CREATE TABLE step_intents (
            org_id      text NOT NULL,
            run_id      uuid NOT NULL,
            step_index  integer NOT NULL,
            action      jsonb NOT NULL,
            started_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, run_id, step_index),
            FOREIGN KEY (org_id, run_id) REFERENCES task_runs (org_id, id)
        );
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE step_intents, api_keys")
