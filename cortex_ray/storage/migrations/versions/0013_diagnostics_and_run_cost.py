"""Per-run and per-turn diagnostic timelines, and what each run cost.

``diagnostics`` is append-only: one row per event of a run attempt's or a turn's timeline
(``cortex_ray.observability.diagnostics``), its data already scrubbed and bounded; rows
older than ``diagnostics.retention_days`` are deleted by the writer. ``task_runs.cost``
adds up, over the run's attempts, the tokens and the seconds spent waiting in line, in
model calls, in tool calls and in all (``RunCost``), and the loops seen.

Revision ID: 0013
Revises: 0012
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE diagnostics (
            id          bigserial PRIMARY KEY,
            org_id      text NOT NULL,
            run_id      uuid,
            session_id  uuid,
            turn_id     uuid,
            seq         integer NOT NULL,
            at          timestamptz NOT NULL,
            kind        text NOT NULL,
            step        integer,
            data        jsonb NOT NULL DEFAULT '{}',
            CHECK (run_id IS NOT NULL OR session_id IS NOT NULL)
        );
        CREATE INDEX diagnostics_run ON diagnostics (org_id, run_id, id) WHERE run_id IS NOT NULL;
        CREATE INDEX diagnostics_session ON diagnostics (org_id, session_id, id)
            WHERE session_id IS NOT NULL;
        CREATE INDEX diagnostics_at ON diagnostics (at);
        ALTER TABLE task_runs ADD COLUMN cost jsonb;
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE diagnostics; ALTER TABLE task_runs DROP COLUMN cost;")
