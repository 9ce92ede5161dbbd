"""Where a run's trace belongs, so every attempt of it is one trace.

``task_runs.trace_parent`` is the W3C ``traceparent`` of the context the run was submitted
in (the HTTP request's span, a caller's own span, or a fresh context standing for the run):
whichever process drives an attempt (a session actor, a resumed run on another node) starts
its ``invoke_agent`` span under it, so the trace context crosses the actor hop through the
run's own row. ``trace_attempt`` is the span id of the latest attempt's ``invoke_agent``
span: the next attempt links to it. Both are NULL for runs submitted without tracing (and
for every run from before this migration, which then trace per attempt as before).

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE task_runs ADD COLUMN trace_parent text, ADD COLUMN trace_attempt text;
        """
    )


def downgrade() -> None:
    op.execute("ALTER TABLE task_runs DROP COLUMN trace_parent, DROP COLUMN trace_attempt;")
