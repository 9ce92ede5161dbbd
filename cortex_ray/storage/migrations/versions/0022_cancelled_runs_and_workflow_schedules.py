"""CANCELLED runs (issue 18).

A run a person stops ends CANCELLED (it ended FAILED before; its reason still says who and
why).

Revision ID: 0022
Revises: 0020
"""

from alembic import op

revision = "0022"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE task_runs
            DROP CONSTRAINT task_runs_status_check,
            ADD CONSTRAINT task_runs_status_check
                CHECK (status IN ('RUNNING', 'AWAITING_APPROVAL', 'COMPLETED', 'FAILED',
                                  'CANCELLED'));
        """
    )


def downgrade() -> None:
    # What the older schema cannot hold is made into what it can: a CANCELLED run becomes
    # FAILED (its reason keeps "cancelled by").
    op.execute(
        """
        UPDATE task_runs SET status = 'FAILED' WHERE status = 'CANCELLED';
        ALTER TABLE task_runs
            DROP CONSTRAINT task_runs_status_check,
            ADD CONSTRAINT task_runs_status_check
                CHECK (status IN ('RUNNING', 'AWAITING_APPROVAL', 'COMPLETED', 'FAILED'));
        """
    )
