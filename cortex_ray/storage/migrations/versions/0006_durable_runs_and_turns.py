"""Durable runs and turns: run leases, idempotent side effects, accepted turns.

- ``task_runs`` gets a lease (owner, fencing token, expiry) and an attempt count: one driver
  at a time, a crashed holder's lease expires, and a run that keeps failing to make progress
  is ended after the retry limit.
- ``memories`` and ``procedural_proposals`` get an idempotency key (unique per organisation
  where set): a built-in tool retried with its step's key finds the row it already wrote.
  Proposals also record the run, step and session that made them, as memories already do.
- ``session_turns`` records a turn when it is accepted, before any reply streams: its
  message, status, the events it emitted (a reconnecting client replays them) and its own
  lease. ``session_messages.turn_id`` ties each message to its turn.

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE task_runs
            ADD COLUMN lease_owner      text,
            ADD COLUMN lease_token      bigint NOT NULL DEFAULT 0,
            ADD COLUMN lease_expires_at timestamptz,
            ADD COLUMN attempts         integer NOT NULL DEFAULT 0;

        ALTER TABLE memories ADD COLUMN idempotency_key text;
        CREATE UNIQUE INDEX memories_idempotency ON memories (org_id, idempotency_key)
            WHERE idempotency_key IS NOT NULL;

        ALTER TABLE procedural_proposals
            ADD COLUMN idempotency_key text,
            ADD COLUMN run_id          uuid,
            ADD COLUMN step_index      integer,
            ADD COLUMN session_id      uuid;
        CREATE UNIQUE INDEX procedural_proposals_idempotency
            ON procedural_proposals (org_id, idempotency_key)
            WHERE idempotency_key IS NOT NULL;

        CREATE TABLE session_turns (
            org_id           text NOT NULL,
            session_id       uuid NOT NULL,
            id               uuid NOT NULL,
            ordinal          integer NOT NULL CHECK (ordinal >= 0),
            caller_id        text NOT NULL,
            message          text NOT NULL CHECK (length(message) > 0),
            status           text NOT NULL
                             CHECK (status IN ('ACCEPTED', 'RUNNING', 'DONE', 'FAILED')),
            reply            text,
            refused          text,
            reason           text,
            events           jsonb NOT NULL DEFAULT '[]',
            attempts         integer NOT NULL DEFAULT 0,
            lease_owner      text,
            lease_token      bigint NOT NULL DEFAULT 0,
            lease_expires_at timestamptz,
            accepted_at      timestamptz NOT NULL DEFAULT now(),
            finished_at      timestamptz,
            PRIMARY KEY (org_id, session_id, id),
            UNIQUE (org_id, session_id, ordinal),
            FOREIGN KEY (org_id, session_id) REFERENCES sessions (org_id, id)
        );
        CREATE INDEX session_turns_pending ON session_turns (accepted_at)
            WHERE status IN ('ACCEPTED', 'RUNNING');

        ALTER TABLE session_messages ADD COLUMN turn_id uuid;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE session_messages DROP COLUMN turn_id;
        DROP TABLE session_turns;
        DROP INDEX procedural_proposals_idempotency;
        ALTER TABLE procedural_proposals
            DROP COLUMN idempotency_key, DROP COLUMN run_id, DROP COLUMN step_index,
            DROP COLUMN session_id;
        DROP INDEX memories_idempotency;
        ALTER TABLE memories DROP COLUMN idempotency_key;
        ALTER TABLE task_runs
            DROP COLUMN lease_owner, DROP COLUMN lease_token, DROP COLUMN lease_expires_at,
            DROP COLUMN attempts;
        """
    )
