"""Where a turn's trace belongs, so the actor that drives it joins the request's trace.

``session_turns.trace_parent`` is the W3C ``traceparent`` of the context the turn was
accepted in (the HTTP request's span, or a fresh context standing for the turn): the
session actor (or the recovering driver after a crash) starts the turn's ``invoke_agent``
span under it, so the trace crosses the actor hop through the turn's own row, as a run's
does through ``task_runs.trace_parent`` (0011). NULL for turns accepted without tracing.

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE session_turns ADD COLUMN trace_parent text;")


def downgrade() -> None:
    op.execute("ALTER TABLE session_turns DROP COLUMN trace_parent;")
