"""Approvals in interactive turns, cancelled approvals, and wall-time caps (issue 18).

An approval request belongs to a run's step (``run_id``, ``step_index``) or to an
interactive turn's tool round (``session_id``, ``turn_id``, ``step_index`` as the round):
one of the two, and a turn's round has at most one request, so a recovered turn finds its
own again. A request whose run was cancelled while it waited is CANCELLED. A run may carry a
``deadline_at`` (a schedule's ``max_seconds`` from when it fired): past it, the run ends
FAILED at its next step.

Revision ID: 0019
Revises: 0017
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE approvals
            ALTER COLUMN run_id DROP NOT NULL,
            ADD COLUMN session_id uuid,
            ADD COLUMN turn_id uuid,
            DROP CONSTRAINT approvals_status_check,
            ADD CONSTRAINT approvals_status_check
                CHECK (status IN ('PENDING', 'APPROVED', 'REJECTED', 'EXPIRED', 'CANCELLED')),
            ADD CONSTRAINT approvals_run_or_turn
                CHECK ((run_id IS NULL) <> (turn_id IS NULL)
                       AND (turn_id IS NULL) = (session_id IS NULL));
        CREATE UNIQUE INDEX approvals_turn_round ON approvals (org_id, turn_id, step_index)
            WHERE turn_id IS NOT NULL;
        ALTER TABLE schedules
            ADD COLUMN max_seconds integer CHECK (max_seconds IS NULL OR max_seconds > 0);
        ALTER TABLE task_runs ADD COLUMN deadline_at timestamptz;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE task_runs DROP COLUMN deadline_at;
        ALTER TABLE schedules DROP COLUMN max_seconds;
        DELETE FROM approvals WHERE turn_id IS NOT NULL;
        UPDATE approvals SET status = 'EXPIRED' WHERE status = 'CANCELLED';
        DROP INDEX approvals_turn_round;
        ALTER TABLE approvals
            DROP CONSTRAINT approvals_run_or_turn,
            DROP CONSTRAINT approvals_status_check,
            ADD CONSTRAINT approvals_status_check
                CHECK (status IN ('PENDING', 'APPROVED', 'REJECTED', 'EXPIRED')),
            DROP COLUMN turn_id,
            DROP COLUMN session_id,
            ALTER COLUMN run_id SET NOT NULL;
        """
    )
