"""Knowledge: collections, sources and their versions, generations and publications,
sections and passages with exact ranges, BM25 postings and per-publication term statistics.

Passages belong to a source *version*, not to a generation: a generation is the set of
(source, version) pairs listed in ``kb_generation_sources``, so carrying an unchanged source
into a new generation is one small row. A collection serves the generation its
``published_generation`` names; publishing swaps that pointer in one transaction.

``kb_postings`` is the lexical index: one row per (passage, term) with the term frequency and
a precomputed BM25 term-frequency factor (``impact``). The index on
``(org_id, collection, term, impact DESC)`` lets a query read only the best postings of each
term; candidates are then rescored exactly with the publication's statistics
(``kb_term_stats`` for document frequencies, ``kb_generations`` for N and the total length).
See docs/knowledge.md.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE kb_collections (
            org_id               text NOT NULL REFERENCES organisations (id),
            name                 text NOT NULL
                CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$'),
            published_generation bigint,
            published_at         timestamptz,
            created_at           timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, name)
        );

        CREATE TABLE kb_generations (
            org_id       text NOT NULL,
            id           bigint GENERATED ALWAYS AS IDENTITY,
            collection   text NOT NULL,
            status       text NOT NULL
                CHECK (status IN ('BUILDING', 'PUBLISHED', 'RETIRED', 'ABANDONED')),
            created_at   timestamptz NOT NULL DEFAULT now(),
            published_at timestamptz,
            passages     bigint,
            total_length bigint,
            publish_ms   double precision,
            PRIMARY KEY (org_id, id),
            FOREIGN KEY (org_id, collection) REFERENCES kb_collections (org_id, name)
        );
        CREATE INDEX kb_generations_collection ON kb_generations (org_id, collection, status);
        ALTER TABLE kb_collections ADD FOREIGN KEY (org_id, published_generation)
            REFERENCES kb_generations (org_id, id);

        CREATE TABLE kb_sources (
            org_id        text NOT NULL,
            id            uuid NOT NULL,
            collection    text NOT NULL,
            path          text NOT NULL CHECK (length(path) > 0),
            next_version  integer NOT NULL DEFAULT 1,
            health        text
                CHECK (health IN ('READ_OK', 'READ_FAILURE', 'DISAPPEARED', 'SKIPPED')),
            health_detail text NOT NULL DEFAULT '',
            health_at     timestamptz,
            created_at    timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, id),
            UNIQUE (org_id, collection, path),
            FOREIGN KEY (org_id, collection) REFERENCES kb_collections (org_id, name)
        );

        CREATE TABLE kb_source_events (
            org_id     text NOT NULL,
            id         bigint GENERATED ALWAYS AS IDENTITY,
            source_id  uuid NOT NULL,
            event      text NOT NULL
                CHECK (event IN ('READ_OK', 'READ_FAILURE', 'DISAPPEARED', 'SKIPPED')),
            detail     text NOT NULL DEFAULT '',
            at         timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, id),
            FOREIGN KEY (org_id, source_id) REFERENCES kb_sources (org_id, id)
        );
        CREATE INDEX kb_source_events_source ON kb_source_events (org_id, source_id, at DESC);

        CREATE TABLE kb_source_versions (
            org_id       text NOT NULL,
            source_id    uuid NOT NULL,
            version      integer NOT NULL CHECK (version > 0),
            content_hash text NOT NULL,
            size_bytes   bigint NOT NULL CHECK (size_bytes >= 0),
            created_at   timestamptz NOT NULL DEFAULT now(),
            -- Last registration: garbage collection spares versions a running ingest touched.
            touched_at   timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, source_id, version),
            UNIQUE (org_id, source_id, content_hash),
            FOREIGN KEY (org_id, source_id) REFERENCES kb_sources (org_id, id)
        );

        CREATE TABLE kb_generation_sources (
            org_id     text NOT NULL,
            generation bigint NOT NULL,
            source_id  uuid NOT NULL,
            version    integer NOT NULL,
            carried    boolean NOT NULL DEFAULT false,
            PRIMARY KEY (org_id, generation, source_id),
            FOREIGN KEY (org_id, generation) REFERENCES kb_generations (org_id, id)
                ON DELETE CASCADE,
            FOREIGN KEY (org_id, source_id, version)
                REFERENCES kb_source_versions (org_id, source_id, version)
        );
        CREATE INDEX kb_generation_sources_version
            ON kb_generation_sources (org_id, source_id, version);

        CREATE TABLE kb_sections (
            org_id       text NOT NULL,
            id           bigint GENERATED ALWAYS AS IDENTITY,
            source_id    uuid NOT NULL,
            version      integer NOT NULL,
            ordinal      integer NOT NULL CHECK (ordinal >= 0),
            collection   text NOT NULL,
            heading_path text[] NOT NULL DEFAULT '{}',
            line_start   integer NOT NULL,
            line_end     integer NOT NULL,
            byte_start   bigint NOT NULL,
            byte_end     bigint NOT NULL,
            summary_text text NOT NULL DEFAULT '',
            embedding    halfvec(384),
            PRIMARY KEY (org_id, id),
            UNIQUE (org_id, source_id, version, ordinal),
            FOREIGN KEY (org_id, source_id, version)
                REFERENCES kb_source_versions (org_id, source_id, version) ON DELETE CASCADE,
            CHECK (line_start <= line_end AND byte_start <= byte_end)
        );
        CREATE INDEX kb_sections_embedding ON kb_sections
            USING hnsw (embedding halfvec_cosine_ops);

        CREATE TABLE kb_passages (
            org_id          text NOT NULL,
            id              bigint GENERATED ALWAYS AS IDENTITY,
            source_id       uuid NOT NULL,
            version         integer NOT NULL,
            ordinal         integer NOT NULL CHECK (ordinal >= 0),
            section_ordinal integer NOT NULL CHECK (section_ordinal >= 0),
            collection      text NOT NULL,
            text            text NOT NULL,
            line_start      integer NOT NULL,
            line_end        integer NOT NULL,
            byte_start      bigint NOT NULL,
            byte_end        bigint NOT NULL,
            length          integer NOT NULL CHECK (length >= 0),
            embedding       halfvec(384),
            PRIMARY KEY (org_id, id),
            UNIQUE (org_id, source_id, version, ordinal),
            FOREIGN KEY (org_id, source_id, version)
                REFERENCES kb_source_versions (org_id, source_id, version) ON DELETE CASCADE,
            CHECK (line_start <= line_end AND byte_start <= byte_end)
        );
        CREATE INDEX kb_passages_section
            ON kb_passages (org_id, source_id, version, section_ordinal);
        CREATE INDEX kb_passages_embedding ON kb_passages
            USING hnsw (embedding halfvec_cosine_ops);
        CREATE INDEX kb_passages_unembedded ON kb_passages (org_id, collection, id)
            WHERE embedding IS NULL;

        -- Usage lives apart from the passages so that counting a hit never rewrites a
        -- passage row (and its HNSW entry).
        CREATE TABLE kb_passage_usage (
            org_id       text NOT NULL,
            passage_id   bigint NOT NULL,
            hits         bigint NOT NULL DEFAULT 0,
            last_used_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, passage_id),
            FOREIGN KEY (org_id, passage_id) REFERENCES kb_passages (org_id, id)
                ON DELETE CASCADE
        );

        CREATE TABLE kb_postings (
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
        CREATE INDEX kb_postings_impact
            ON kb_postings (org_id, collection, term, impact DESC) INCLUDE (passage_id);

        CREATE TABLE kb_term_stats (
            org_id     text NOT NULL,
            generation bigint NOT NULL,
            term       text NOT NULL,
            df         integer NOT NULL CHECK (df > 0),
            PRIMARY KEY (org_id, generation, term),
            FOREIGN KEY (org_id, generation) REFERENCES kb_generations (org_id, id)
                ON DELETE CASCADE
        );
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE kb_collections DROP COLUMN published_generation;
        DROP TABLE kb_term_stats, kb_postings, kb_passage_usage, kb_passages, kb_sections,
                   kb_generation_sources, kb_source_versions, kb_source_events, kb_sources,
                   kb_generations, kb_collections
        """
    )
