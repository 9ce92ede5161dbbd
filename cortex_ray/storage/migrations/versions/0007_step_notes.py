"""Step notes (why the planner chose what it chose) and the per-agent critic switch.

``run_steps.note`` keeps the decision's reason for an acting step (a finish step keeps it
in ``message`` when it has no answer): "single valid candidate; not scored", "evaluation
scores follow the proposal order (1, 2, 3); not used", "every candidate repeated an earlier
call; asked again", ... Readers of the step log (``cortex-ray runs show``, the API, the
agent benchmark) see why a step went the way it did.

``agents.critic`` turns the inner voice on for an agent: an independent review of each
final answer or reply before it is given, revised once (issue 14, point 4).

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE run_steps ADD COLUMN note text")
    op.execute("ALTER TABLE agents ADD COLUMN critic boolean NOT NULL DEFAULT false")


def downgrade() -> None:
    op.execute("ALTER TABLE agents DROP COLUMN critic")
    op.execute("ALTER TABLE run_steps DROP COLUMN note")
