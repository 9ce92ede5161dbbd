"""The BM25 analyzer of each knowledge generation.

``kb_generations.analyzer`` records how the generation's postings were tokenised
(``cortex_ray.knowledge.Analyzer``: ``{"stem": bool, "identifiers": bool}``). A search
tokenises its query with the analyzer of each generation it reads, so a change of the setting
never mixes two vocabularies. The default, ``{}`` (every option off), is the analyzer every
generation written before this migration used, so existing rows need no rewrite (a constant
default is a catalogue change in PostgreSQL, not a table rewrite). The downgrade drops the
column: a collection written with an option on then answers queries tokenised without it
(re-ingest it after a downgrade).

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE kb_generations ADD COLUMN analyzer jsonb NOT NULL DEFAULT '{}';
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE kb_generations DROP COLUMN analyzer;
        """
    )
