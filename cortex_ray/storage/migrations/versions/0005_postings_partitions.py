"""Postings partitioned by collection, and a staging table per collection for bulk loads.

``kb_postings`` becomes a table partitioned by ``collection_id`` (a new surrogate key of
``kb_collections``): one partition per collection, named ``kb_postings_<id>``. The text
``collection`` column gives way to ``collection_id``, the partition key; the impact index
leads with it, and the foreign key to the passage includes it, so that the cascade of a
passage's deletion reads one partition, not all (``kb_passages`` gains ``collection_id``
and a unique key on ``(collection_id, id)`` for it; a collection id belongs to one
organisation, and every posting still carries its ``org_id``).

Why: a collection's first corpus-scale load no longer pays an index insertion and a
foreign-key check per posting. Until the collection has a partition, writers COPY its
postings into ``kb_postings_stage_<id>``, a plain table without indexes or foreign keys;
publishing attaches it as the partition, which builds the indexes by sorting and checks the
foreign key with one join (measured: about half the database work of inserting row by row).
Later runs write into the partition directly; anything left in the stage (a run that wrote
there when the partition did not exist yet) is moved in at the next publish. See
docs/knowledge.md.

Upgrading a big store takes a while: every passage row is rewritten once (for its
``collection_id``), the passages' HNSW index is rebuilt, and every posting is copied into its
collection's partition, whose indexes are then built by sorting (docs/operations.md: what
was measured at 1M passages, and what was not).

Revision ID: 0005
Revises: 0004
"""

from alembic import op
from sqlalchemy import text

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE kb_collections ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY;
        ALTER TABLE kb_collections ADD CONSTRAINT kb_collections_id_key UNIQUE (id);

        -- Filled by rewriting the table (ALTER ... TYPE ... USING), not by an UPDATE: an
        -- UPDATE of every passage leaves a dead copy of each row and inserts into the HNSW
        -- graph once per passage (or, with the index dropped and rebuilt, leaves a VACUUM
        -- through every index to do: 17 min at 1M passages). The rewrite writes each row
        -- once and rebuilds every index, the HNSW one included, by bulk build.
        ALTER TABLE kb_passages ADD COLUMN collection_id bigint;
        CREATE FUNCTION pg_temp.kb_collection_id(text, text) RETURNS bigint
            LANGUAGE sql STABLE
            AS 'SELECT id FROM kb_collections WHERE org_id = $1 AND name = $2';
        SET LOCAL maintenance_work_mem = '1GB';
        ALTER TABLE kb_passages ALTER COLUMN collection_id TYPE bigint
            USING pg_temp.kb_collection_id(org_id, collection);
        RESET maintenance_work_mem;
        ALTER TABLE kb_passages ALTER COLUMN collection_id SET NOT NULL;
        ALTER TABLE kb_passages ADD CONSTRAINT kb_passages_collection_key
            UNIQUE (collection_id, id);

        ALTER TABLE kb_postings RENAME TO kb_postings_before_0005;
        ALTER TABLE kb_postings_before_0005
            RENAME CONSTRAINT kb_postings_pkey TO kb_postings_before_0005_pkey;
        ALTER INDEX kb_postings_impact RENAME TO kb_postings_before_0005_impact;

        CREATE TABLE kb_postings (
            org_id        text NOT NULL,
            collection_id bigint NOT NULL,
            passage_id    bigint NOT NULL,
            term          text NOT NULL,
            tf            integer NOT NULL CHECK (tf > 0),
            impact        real NOT NULL,
            PRIMARY KEY (collection_id, passage_id, term),
            FOREIGN KEY (collection_id, passage_id)
                REFERENCES kb_passages (collection_id, id) ON DELETE CASCADE
        ) PARTITION BY LIST (collection_id);
        CREATE INDEX kb_postings_impact
            ON kb_postings (collection_id, term, impact DESC) INCLUDE (passage_id);
        """
    )
    bind = op.get_bind()
    collections = bind.execute(
        text(
            "SELECT c.id, c.org_id, c.name FROM kb_collections c WHERE EXISTS ("
            " SELECT 1 FROM kb_postings_before_0005 po"
            " WHERE po.org_id = c.org_id AND po.collection = c.name) ORDER BY c.id"
        )
    ).fetchall()
    for cid, org_id, name in collections:
        # Filled before it is attached: the attach builds the indexes by sorting.
        part = f"kb_postings_{int(cid)}"
        op.execute(
            f"CREATE TABLE {part} (LIKE kb_postings INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        bind.execute(
            text(
                f"INSERT INTO {part} (org_id, collection_id, passage_id, term, tf, impact) "
                "SELECT org_id, :cid, passage_id, term, tf, impact FROM kb_postings_before_0005 "
                "WHERE org_id = :org AND collection = :name"
            ),
            {"cid": cid, "org": org_id, "name": name},
        )
        op.execute(f"ALTER TABLE {part} ADD CHECK (collection_id = {int(cid)})")
        op.execute(f"ALTER TABLE kb_postings ATTACH PARTITION {part} FOR VALUES IN ({int(cid)})")
    op.execute("DROP TABLE kb_postings_before_0005")


def downgrade() -> None:
    bind = op.get_bind()
    stages = bind.execute(
        text(
            "SELECT relname FROM pg_class WHERE relkind = 'r' "
            "AND relname ~ '^kb_postings_stage_[0-9]+$'"
        )
    ).fetchall()
    op.execute(
        """
        CREATE TABLE kb_postings_0004 (
            org_id     text NOT NULL,
            passage_id bigint NOT NULL,
            term       text NOT NULL,
            collection text NOT NULL,
            tf         integer NOT NULL CHECK (tf > 0),
            impact     real NOT NULL,
            PRIMARY KEY (org_id, passage_id, term),
            FOREIGN KEY (org_id, passage_id) REFERENCES kb_passages (org_id, id)
                ON DELETE CASCADE
        );
        INSERT INTO kb_postings_0004 (org_id, passage_id, term, collection, tf, impact)
        SELECT po.org_id, po.passage_id, po.term, c.name, po.tf, po.impact
        FROM kb_postings po JOIN kb_collections c ON c.id = po.collection_id;
        """
    )
    for (stage,) in stages:
        op.execute(
            f"""
            INSERT INTO kb_postings_0004 (org_id, passage_id, term, collection, tf, impact)
            SELECT po.org_id, po.passage_id, po.term, c.name, po.tf, po.impact
            FROM {stage} po JOIN kb_collections c ON c.id = po.collection_id
            WHERE EXISTS (SELECT 1 FROM kb_passages p
                          WHERE p.org_id = po.org_id AND p.id = po.passage_id)
            ON CONFLICT DO NOTHING;
            DROP TABLE {stage};
            """
        )
    op.execute(
        """
        DROP TABLE kb_postings;
        ALTER TABLE kb_postings_0004 RENAME TO kb_postings;
        ALTER TABLE kb_postings RENAME CONSTRAINT kb_postings_0004_pkey TO kb_postings_pkey;
        CREATE INDEX kb_postings_impact
            ON kb_postings (org_id, collection, term, impact DESC) INCLUDE (passage_id);
        ALTER TABLE kb_passages DROP CONSTRAINT kb_passages_collection_key;
        ALTER TABLE kb_passages DROP COLUMN collection_id;
        ALTER TABLE kb_collections DROP COLUMN id;
        """
    )
