"""Run modes, shadow labels and approval requests (issue 18).

``task_runs.run_mode`` is execute, dry_run or shadow. ``run_labels`` holds a person's label
of a run (accepted, rejected, mixed: the acceptance report reads it). ``approvals`` holds
approval requests, one row each, never a waiting thread: the call (tool, arguments, tier),
the decision that chose it (candidates and scores), the evidence, who may decide, the
expiry, and the decision. A run waiting for one is AWAITING_APPROVAL. ``org_secrets`` holds
each organisation's connector credentials, AES-GCM encrypted at rest (the organisation and
the name are the associated data, so a ciphertext moved to another row does not decrypt).

Revision ID: 0016
Revises: 0015
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE task_runs
            ADD COLUMN run_mode text NOT NULL DEFAULT 'execute'
                CHECK (run_mode IN ('execute', 'dry_run', 'shadow')),
            DROP CONSTRAINT task_runs_status_check,
            ADD CONSTRAINT task_runs_status_check
                CHECK (status IN ('RUNNING', 'AWAITING_APPROVAL', 'COMPLETED', 'FAILED'));
        CREATE TABLE run_labels (
            org_id      text NOT NULL,
            run_id      uuid NOT NULL,
            label       text NOT NULL CHECK (label IN ('accepted', 'rejected', 'mixed')),
            note        text NOT NULL DEFAULT '',
            labelled_by text NOT NULL,
            labelled_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, run_id),
            FOREIGN KEY (org_id, run_id) REFERENCES task_runs (org_id, id)
        );
        CREATE TABLE approvals (
            org_id       text NOT NULL,
            id           uuid NOT NULL,
            run_id       uuid NOT NULL,
            step_index   integer NOT NULL,
            tool         text NOT NULL,
            args         jsonb NOT NULL,
            tier         text NOT NULL,
            decision     jsonb NOT NULL DEFAULT '{}',
            evidence     jsonb NOT NULL DEFAULT '[]',
            reason       text NOT NULL DEFAULT '',
            requested_by text NOT NULL,
            approvers    text[] NOT NULL DEFAULT '{}',
            status       text NOT NULL DEFAULT 'PENDING'
                CHECK (status IN ('PENDING', 'APPROVED', 'REJECTED', 'EXPIRED')),
            expires_at   timestamptz NOT NULL,
            decided_by   text,
            decided_at   timestamptz,
            note         text NOT NULL DEFAULT '',
            created_at   timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, id),
            UNIQUE (org_id, run_id, step_index),
            FOREIGN KEY (org_id, run_id) REFERENCES task_runs (org_id, id)
        );
        CREATE INDEX approvals_pending ON approvals (org_id, expires_at)
            WHERE status = 'PENDING';
        CREATE TABLE org_secrets (
            org_id      text NOT NULL REFERENCES organisations (id),
            name        text NOT NULL CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_.-]{0,99}$'),
            connector   text,
            nonce       bytea NOT NULL,
            ciphertext  bytea NOT NULL,
            created_by  text NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now(),
            updated_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, name)
        );
        CREATE TABLE schedules (
            org_id       text NOT NULL,
            id           uuid NOT NULL,
            agent_id     uuid NOT NULL,
            name         text NOT NULL DEFAULT '',
            goal         text NOT NULL CHECK (length(goal) > 0),
            cron         text,
            interval_s   integer CHECK (interval_s IS NULL OR interval_s >= 1),
            timezone     text NOT NULL DEFAULT 'UTC',
            next_run_at  timestamptz,
            max_steps    integer NOT NULL CHECK (max_steps > 0),
            run_mode     text NOT NULL DEFAULT 'execute',
            status       text NOT NULL DEFAULT 'ACTIVE'
                CHECK (status IN ('ACTIVE', 'SUSPENDED', 'CANCELLED', 'DONE')),
            created_by   text NOT NULL,
            created_at   timestamptz NOT NULL DEFAULT now(),
            fired        integer NOT NULL DEFAULT 0,
            last_run_id  uuid,
            last_fired_at timestamptz,
            PRIMARY KEY (org_id, id),
            FOREIGN KEY (org_id, agent_id) REFERENCES agents (org_id, id),
            CHECK (cron IS NULL OR interval_s IS NULL)
        );
        CREATE INDEX schedules_due ON schedules (next_run_at) WHERE status = 'ACTIVE';
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE schedules;
        DROP TABLE org_secrets;
        DROP TABLE approvals;
        DROP TABLE run_labels;
        ALTER TABLE task_runs DROP COLUMN run_mode,
            DROP CONSTRAINT task_runs_status_check,
            ADD CONSTRAINT task_runs_status_check
                CHECK (status IN ('RUNNING', 'COMPLETED', 'FAILED'));
        """
    )
