"""Which source versions an extractor (method and version) has extracted.

``graph_extracted_versions`` is the extractors' ledger: one row per (source version,
method, method version), written in the transaction that writes the version's facts. A
rerun of an extraction job skips what is here, so it neither asks a model again nor
duplicates anything (a version that yielded no facts is here too, with ``assertions`` 0).

Revision ID: 0020
Revises: 0017
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE graph_extracted_versions (
            org_id         text NOT NULL,
            source_id      uuid NOT NULL,
            version        integer NOT NULL,
            method         text NOT NULL,
            method_version text NOT NULL,
            run_id         bigint NOT NULL,
            passages       integer NOT NULL DEFAULT 0,
            assertions     integer NOT NULL DEFAULT 0,
            extracted_at   timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, source_id, version, method, method_version),
            FOREIGN KEY (org_id, source_id) REFERENCES kb_sources (org_id, id),
            FOREIGN KEY (org_id, run_id) REFERENCES graph_extraction_runs (org_id, id)
        );
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE graph_extracted_versions")
