"""CANCELLED runs, schedules of workflow runs, and approval payloads by reference (issue 18).

A run a person stops ends CANCELLED (it ended FAILED before; its reason still says who and
why). A schedule may name a workflow (``workflow``, optionally a pinned
``workflow_version``) and its ``inputs`` instead of a goal: each firing starts a run of that
workflow's version, the inputs checked against its schema then; a firing that fails the
check records a FAILED run and the finding in ``last_error``. Its ``run_mode`` may be null:
the version's default. An approval request's arguments, decision or evidence larger than
``payload_inline_bytes`` are stored in ``payloads`` and referenced (``args_ref``,
``decision_ref``, ``evidence_ref``), as audit rows' are.

Revision ID: 0021
Revises: 0020
"""

from alembic import op

revision = "0021"
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
        ALTER TABLE schedules
            ADD COLUMN workflow text,
            ADD COLUMN workflow_version integer
                CHECK (workflow_version IS NULL OR workflow_version >= 1),
            ADD COLUMN inputs jsonb,
            ADD COLUMN last_error text,
            ADD COLUMN last_error_at timestamptz,
            ALTER COLUMN run_mode DROP NOT NULL,
            DROP CONSTRAINT schedules_goal_check,
            ADD CONSTRAINT schedules_goal_check
                CHECK (length(goal) > 0 OR workflow IS NOT NULL),
            ADD CONSTRAINT schedules_workflow_fields
                CHECK (workflow IS NOT NULL
                       OR (workflow_version IS NULL AND inputs IS NULL AND run_mode IS NOT NULL));
        ALTER TABLE approvals
            ADD COLUMN args_ref text,
            ADD COLUMN decision_ref text,
            ADD COLUMN evidence_ref text;
        """
    )


def downgrade() -> None:
    # What the older schema cannot hold is made into what it can: a CANCELLED run becomes
    # FAILED (its reason keeps "cancelled by"), a workflow schedule is removed, a referenced
    # approval field gets its payload back inline.
    op.execute(
        """
        UPDATE approvals a SET args = p.body::jsonb
            FROM payloads p WHERE p.org_id = a.org_id AND p.sha256 = a.args_ref;
        UPDATE approvals a SET decision = p.body::jsonb
            FROM payloads p WHERE p.org_id = a.org_id AND p.sha256 = a.decision_ref;
        UPDATE approvals a SET evidence = p.body::jsonb
            FROM payloads p WHERE p.org_id = a.org_id AND p.sha256 = a.evidence_ref;
        ALTER TABLE approvals
            DROP COLUMN args_ref, DROP COLUMN decision_ref, DROP COLUMN evidence_ref;
        DELETE FROM schedules WHERE workflow IS NOT NULL;
        ALTER TABLE schedules
            DROP CONSTRAINT schedules_workflow_fields,
            DROP CONSTRAINT schedules_goal_check,
            ADD CONSTRAINT schedules_goal_check CHECK (length(goal) > 0),
            ALTER COLUMN run_mode SET NOT NULL,
            DROP COLUMN last_error_at,
            DROP COLUMN last_error,
            DROP COLUMN inputs,
            DROP COLUMN workflow_version,
            DROP COLUMN workflow;
        UPDATE task_runs SET status = 'FAILED' WHERE status = 'CANCELLED';
        ALTER TABLE task_runs
            DROP CONSTRAINT task_runs_status_check,
            ADD CONSTRAINT task_runs_status_check
                CHECK (status IN ('RUNNING', 'AWAITING_APPROVAL', 'COMPLETED', 'FAILED'));
        """
    )
