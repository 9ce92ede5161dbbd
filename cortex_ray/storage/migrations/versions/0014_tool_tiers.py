"""Every audit row records the capability tier (read, write, admin) of what it audits: the
tool's for a gate dispatch, the use case's for a use-case row. Older rows keep NULL.

Revision ID: 0014
Revises: 0013
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE audit_log ADD COLUMN tier text
            CHECK (tier IS NULL OR tier IN ('read', 'write', 'admin'));
        """
    )


def downgrade() -> None:
    op.execute("ALTER TABLE audit_log DROP COLUMN tier;")
