"""Task runs keep who asked for them and the contact context they came with.

``contact_context`` is the caller's JSON object (at most 8 KiB, checked at the API);
``requested_by`` is the principal that submitted the run, which may differ from the
caller the run acts for (``caller_id``).

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE task_runs
            ADD COLUMN contact_context jsonb
                CHECK (contact_context IS NULL OR jsonb_typeof(contact_context) = 'object'),
            ADD COLUMN requested_by text;
        -- A supervisor's start-up scan reads the RUNNING runs: keep that read small.
        CREATE INDEX task_runs_running ON task_runs (created_at) WHERE status = 'RUNNING';
        """
    )


def downgrade() -> None:
    op.execute("DROP INDEX task_runs_running")
    op.execute("ALTER TABLE task_runs DROP COLUMN contact_context, DROP COLUMN requested_by")
