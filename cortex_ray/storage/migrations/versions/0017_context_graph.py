"""Context graph: entities and relationship assertions with provenance and two time axes,
extraction runs, the projection outbox, and collection readers.

- ``graph_entities``: (type, key) is unique per organisation, ``key`` the normalised canonical
  name (``graph_key``); aliases in ``graph_entity_aliases`` (each with its record time).
- ``graph_assertions``: subject, predicate, object; the source id and version (``NULL`` for
  a triple a principal submitted), confidence, extraction method and version, the evidence
  span as byte range (0-based, end exclusive) and line range (1-based, inclusive); valid
  time ``[valid_from, valid_to)`` and record time ``recorded_at`` / ``invalidated_at`` (when
  ``valid_to`` was set: Graphiti's ``expired_at``). Rows are never deleted: a newer
  contradicting assertion (same subject, a *functional* predicate, another object) sets the
  older one's ``valid_to`` and ``invalidated_at``. ``fingerprint`` makes writes idempotent.
- ``graph_assert(org, run, rows jsonb)`` is the one write: entities, aliases, assertions,
  the closing of contradicted assertions and the outbox rows, in the caller's transaction.
  ``graph_close_superseded`` closes what an older version of a source asserted.
- ``graph_outbox``: one row per changed entity or assertion, with the writing transaction's
  id (``txid``); the projection reads rows in (txid, id) order below the oldest running
  transaction (``pg_snapshot_xmin``), so a watermark never skips a row that commits late.
- ``kb_collection_readers``: a collection with rows here is readable only by the principals
  listed (and admins); a collection without rows by every member (as before).
- Source health: ``kb_freshness_policies`` (a collection's expected update interval, or one
  source's), ``kb_health_reports`` and their typed ``kb_health_findings`` (with the source's
  latest version); ``kb_source_findings`` is each collection's latest report's findings.

Revision ID: 0017
Revises: 0016
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        r"""
        CREATE FUNCTION graph_key(name text) RETURNS text
            LANGUAGE sql IMMUTABLE PARALLEL SAFE
            RETURN lower(btrim(regexp_replace(name, '\s+', ' ', 'g')));

        CREATE TABLE kb_collection_readers (
            org_id       text NOT NULL,
            collection   text NOT NULL,
            principal_id text NOT NULL,
            PRIMARY KEY (org_id, collection, principal_id),
            FOREIGN KEY (org_id, collection) REFERENCES kb_collections (org_id, name)
        );

        CREATE TABLE kb_freshness_policies (
            org_id              text NOT NULL,
            collection          text NOT NULL,
            source_id           uuid,
            expected_interval_s double precision NOT NULL CHECK (expected_interval_s > 0),
            expires_after_s     double precision
                CHECK (expires_after_s IS NULL OR expires_after_s >= expected_interval_s),
            updated_at          timestamptz NOT NULL DEFAULT now(),
            UNIQUE NULLS NOT DISTINCT (org_id, collection, source_id),
            FOREIGN KEY (org_id, collection) REFERENCES kb_collections (org_id, name),
            FOREIGN KEY (org_id, source_id) REFERENCES kb_sources (org_id, id)
        );

        CREATE TABLE kb_health_reports (
            org_id     text NOT NULL,
            id         bigint GENERATED ALWAYS AS IDENTITY,
            collection text NOT NULL,
            checked_at timestamptz NOT NULL DEFAULT now(),
            sources    integer NOT NULL,
            findings   integer NOT NULL,
            PRIMARY KEY (org_id, id),
            FOREIGN KEY (org_id, collection) REFERENCES kb_collections (org_id, name)
        );
        CREATE INDEX kb_health_reports_latest ON kb_health_reports (org_id, collection, id DESC);

        CREATE TABLE kb_health_findings (
            org_id         text NOT NULL,
            report_id      bigint NOT NULL,
            source_id      uuid NOT NULL,
            kind           text NOT NULL CHECK (kind IN ('STALE', 'EXPIRED', 'DEGRADED', 'DOWN',
                                                        'PERMISSION_DENIED', 'UNKNOWN_FRESHNESS')),
            latest_version integer,
            detail         text NOT NULL DEFAULT '',
            PRIMARY KEY (org_id, report_id, source_id, kind),
            FOREIGN KEY (org_id, report_id) REFERENCES kb_health_reports (org_id, id)
                ON DELETE CASCADE,
            FOREIGN KEY (org_id, source_id) REFERENCES kb_sources (org_id, id)
        );
        CREATE INDEX kb_health_findings_source ON kb_health_findings (org_id, source_id);

        CREATE VIEW kb_source_findings AS
        SELECT f.* FROM kb_health_findings f
        JOIN (SELECT DISTINCT ON (org_id, collection) org_id, id FROM kb_health_reports
              ORDER BY org_id, collection, id DESC) latest
          ON latest.org_id = f.org_id AND latest.id = f.report_id;

        CREATE TABLE graph_extraction_runs (
            org_id         text NOT NULL REFERENCES organisations (id),
            id             bigint GENERATED ALWAYS AS IDENTITY,
            method         text NOT NULL CHECK (method ~ '^[a-z][a-z0-9_-]{0,63}$'),
            method_version text NOT NULL,
            collection     text,
            generation     bigint,
            principal_id   text,
            status         text NOT NULL DEFAULT 'RUNNING'
                CHECK (status IN ('RUNNING', 'DONE', 'FAILED')),
            sources        integer NOT NULL DEFAULT 0,
            assertions     integer NOT NULL DEFAULT 0,
            detail         text NOT NULL DEFAULT '',
            started_at     timestamptz NOT NULL DEFAULT now(),
            finished_at    timestamptz,
            PRIMARY KEY (org_id, id)
        );

        CREATE TABLE graph_entities (
            org_id         text NOT NULL REFERENCES organisations (id),
            id             uuid NOT NULL,
            type           text NOT NULL CHECK (type ~ '^[a-z][a-z0-9_]{0,63}$'),
            canonical_name text NOT NULL CHECK (length(canonical_name) BETWEEN 1 AND 2000),
            key            text NOT NULL,
            valid_from     timestamptz NOT NULL DEFAULT now(),
            valid_to       timestamptz,
            recorded_at    timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, id),
            UNIQUE (org_id, type, key)
        );
        CREATE INDEX graph_entities_key ON graph_entities (org_id, key text_pattern_ops);

        CREATE TABLE graph_entity_aliases (
            org_id      text NOT NULL,
            entity_id   uuid NOT NULL,
            alias       text NOT NULL CHECK (length(alias) BETWEEN 1 AND 2000),
            key         text NOT NULL,
            recorded_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, entity_id, key),
            FOREIGN KEY (org_id, entity_id) REFERENCES graph_entities (org_id, id)
        );
        CREATE INDEX graph_entity_aliases_key
            ON graph_entity_aliases (org_id, key text_pattern_ops);

        CREATE TABLE graph_predicates (
            org_id     text NOT NULL REFERENCES organisations (id),
            name       text NOT NULL CHECK (name ~ '^[a-z][a-z0-9_]{0,63}$'),
            functional boolean NOT NULL DEFAULT false,
            PRIMARY KEY (org_id, name)
        );

        CREATE TABLE graph_assertions (
            org_id         text NOT NULL,
            id             bigint GENERATED ALWAYS AS IDENTITY,
            subject_id     uuid NOT NULL,
            predicate      text NOT NULL,
            object_id      uuid NOT NULL,
            source_id      uuid,
            source_version integer,
            -- the source's collection (a source never changes collection): what reads filter
            -- on, without a join (kb_collection_readers)
            collection     text,
            confidence     real NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
            method         text NOT NULL,
            method_version text NOT NULL,
            run_id         bigint NOT NULL,
            byte_start     bigint,
            byte_end       bigint,
            line_start     integer,
            line_end       integer,
            submitted_by   text,
            valid_from     timestamptz NOT NULL,
            valid_to       timestamptz,
            recorded_at    timestamptz NOT NULL DEFAULT now(),
            invalidated_at timestamptz,
            invalidated_by bigint,
            fingerprint    text NOT NULL,
            PRIMARY KEY (org_id, id),
            UNIQUE (org_id, fingerprint),
            FOREIGN KEY (org_id, subject_id) REFERENCES graph_entities (org_id, id),
            FOREIGN KEY (org_id, object_id) REFERENCES graph_entities (org_id, id),
            FOREIGN KEY (org_id, predicate) REFERENCES graph_predicates (org_id, name),
            FOREIGN KEY (org_id, source_id) REFERENCES kb_sources (org_id, id),
            FOREIGN KEY (org_id, run_id) REFERENCES graph_extraction_runs (org_id, id),
            CHECK ((source_id IS NULL) = (source_version IS NULL)),
            CHECK ((source_id IS NULL) = (collection IS NULL)),
            CHECK ((byte_start IS NULL) = (source_id IS NULL)
                   AND (byte_start IS NULL) = (byte_end IS NULL)
                   AND (byte_start IS NULL) = (line_start IS NULL)
                   AND (byte_start IS NULL) = (line_end IS NULL)),
            CHECK (byte_start IS NULL OR (0 <= byte_start AND byte_start <= byte_end
                                          AND 1 <= line_start AND line_start <= line_end)),
            CHECK ((valid_to IS NULL) = (invalidated_at IS NULL)),
            CHECK (valid_to IS NULL OR valid_to >= valid_from)
        );
        -- In retrieval's order (best first), so a hub's top facts are read without a sort.
        CREATE INDEX graph_assertions_subject
            ON graph_assertions (org_id, subject_id, confidence DESC, valid_from DESC, id);
        CREATE INDEX graph_assertions_object
            ON graph_assertions (org_id, object_id, confidence DESC, valid_from DESC, id);
        CREATE INDEX graph_assertions_source
            ON graph_assertions (org_id, source_id, source_version) WHERE source_id IS NOT NULL;
        CREATE INDEX graph_assertions_open ON graph_assertions (org_id, subject_id, predicate)
            WHERE valid_to IS NULL;

        CREATE TABLE graph_outbox (
            id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            org_id     text NOT NULL,
            kind       text NOT NULL CHECK (kind IN ('entity', 'assertion')),
            ref        text NOT NULL,
            txid       xid8 NOT NULL DEFAULT pg_current_xact_id(),
            created_at timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX graph_outbox_order ON graph_outbox (txid, id);

        CREATE TABLE graph_projection_state (
            target     text PRIMARY KEY,
            txid       xid8 NOT NULL DEFAULT '0',
            last_id    bigint NOT NULL DEFAULT 0,
            projected  bigint NOT NULL DEFAULT 0,
            updated_at timestamptz NOT NULL DEFAULT now()
        );

        -- The one write: p_rows is a JSON array of objects with s_type, s_name, p, o_type,
        -- o_name and optionally s_aliases, o_aliases, functional, source_id, source_version,
        -- byte_start, byte_end, line_start, line_end, confidence, method, method_version,
        -- valid_from, submitted_by. Returns {"entities", "assertions", "closed"}: the new
        -- rows and the assertions whose validity it closed.
        CREATE FUNCTION graph_assert(p_org text, p_run bigint, p_rows jsonb) RETURNS jsonb
        LANGUAGE plpgsql AS $$
        DECLARE
            n_entities integer;
            n_assertions integer;
            n_closed integer := 0;
            c integer;
            r record;
            later timestamptz;
        BEGIN
            CREATE TEMP TABLE IF NOT EXISTS graph_rows (
                ord int, s_type text, s_name text, s_aliases text[], p text, o_type text,
                o_name text, o_aliases text[], functional boolean, source_id uuid,
                source_version int, byte_start bigint, byte_end bigint, line_start int,
                line_end int, confidence real, method text, method_version text,
                valid_from timestamptz, submitted_by text, sid uuid, oid uuid
            ) ON COMMIT DELETE ROWS;  -- kept by the session: no catalog churn per call
            DELETE FROM graph_rows;
            INSERT INTO graph_rows
            SELECT ord::int, e->>'s_type', e->>'s_name',
                   ARRAY(SELECT jsonb_array_elements_text(coalesce(e->'s_aliases', '[]'))),
                   e->>'p', e->>'o_type', e->>'o_name',
                   ARRAY(SELECT jsonb_array_elements_text(coalesce(e->'o_aliases', '[]'))),
                   (e->>'functional')::boolean, (e->>'source_id')::uuid,
                   (e->>'source_version')::int, (e->>'byte_start')::bigint,
                   (e->>'byte_end')::bigint, (e->>'line_start')::int, (e->>'line_end')::int,
                   coalesce((e->>'confidence')::real, 1.0), e->>'method', e->>'method_version',
                   coalesce((e->>'valid_from')::timestamptz, now()), e->>'submitted_by',
                   NULL, NULL
            FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS t(e, ord);

            -- Entities, in key order (concurrent writers cannot deadlock on them).
            WITH wanted AS (
                SELECT DISTINCT ON (t, graph_key(n)) t, n FROM (
                    SELECT s_type AS t, s_name AS n, ord FROM graph_rows
                    UNION ALL SELECT o_type, o_name, ord FROM graph_rows
                ) x ORDER BY t, graph_key(n), ord
            ), inserted AS (
                INSERT INTO graph_entities (org_id, id, type, canonical_name, key)
                SELECT p_org, gen_random_uuid(), t, n, graph_key(n) FROM wanted
                ORDER BY t, graph_key(n)
                ON CONFLICT (org_id, type, key) DO NOTHING
                RETURNING id
            )
            INSERT INTO graph_outbox (org_id, kind, ref) SELECT p_org, 'entity', id::text
            FROM inserted;
            GET DIAGNOSTICS n_entities = ROW_COUNT;

            UPDATE graph_rows g SET sid = s.id, oid = o.id
            FROM graph_entities s, graph_entities o
            WHERE s.org_id = p_org AND s.type = g.s_type AND s.key = graph_key(g.s_name)
              AND o.org_id = p_org AND o.type = g.o_type AND o.key = graph_key(g.o_name);

            WITH aliases AS (
                SELECT DISTINCT ON (id, graph_key(a)) id, a FROM (
                    SELECT sid AS id, unnest(s_aliases || s_name) AS a FROM graph_rows
                    UNION ALL SELECT oid, unnest(o_aliases || o_name) FROM graph_rows
                ) x WHERE length(btrim(a)) > 0
                ORDER BY id, graph_key(a)
            ), inserted AS (
                INSERT INTO graph_entity_aliases (org_id, entity_id, alias, key)
                SELECT p_org, id, a, graph_key(a) FROM aliases
                ON CONFLICT DO NOTHING RETURNING entity_id
            )
            -- (an entity recorded in this transaction is queued already)
            INSERT INTO graph_outbox (org_id, kind, ref)
            SELECT DISTINCT p_org, 'entity', i.entity_id::text FROM inserted i
            JOIN graph_entities e ON e.org_id = p_org AND e.id = i.entity_id
            WHERE e.recorded_at < now();

            INSERT INTO graph_predicates (org_id, name, functional)
            SELECT DISTINCT ON (p) p_org, p, coalesce(functional, false) FROM graph_rows
            ORDER BY p, functional DESC NULLS LAST
            ON CONFLICT (org_id, name) DO UPDATE
                SET functional = graph_predicates.functional OR EXCLUDED.functional;

            CREATE TEMP TABLE IF NOT EXISTS graph_new (id bigint, subject_id uuid,
                predicate text, object_id uuid, valid_from timestamptz) ON COMMIT DELETE ROWS;
            DELETE FROM graph_new;
            WITH inserted AS (
                INSERT INTO graph_assertions (
                    org_id, subject_id, predicate, object_id, source_id, source_version,
                    collection, confidence, method, method_version, run_id, byte_start,
                    byte_end, line_start, line_end, submitted_by, valid_from, fingerprint)
                SELECT p_org, sid, p, oid, source_id, source_version,
                       (SELECT s.collection FROM kb_sources s
                        WHERE s.org_id = p_org AND s.id = graph_rows.source_id),
                       confidence, method,
                       method_version, p_run, byte_start, byte_end, line_start, line_end,
                       submitted_by, valid_from,
                       md5(concat_ws('|', sid, p, oid, source_id, source_version, method,
                                     byte_start, byte_end,
                                     CASE WHEN source_id IS NULL THEN concat_ws('|',
                                         submitted_by, extract(epoch FROM valid_from))
                                     END))
                FROM graph_rows ORDER BY ord
                ON CONFLICT (org_id, fingerprint) DO NOTHING
                RETURNING id, subject_id, predicate, object_id, valid_from
            )
            INSERT INTO graph_new SELECT * FROM inserted;
            GET DIAGNOSTICS n_assertions = ROW_COUNT;
            INSERT INTO graph_outbox (org_id, kind, ref)
            SELECT p_org, 'assertion', id::text FROM graph_new ORDER BY id;

            -- Contradictions: a functional predicate holds one object per subject at a time.
            FOR r IN
                SELECT n.* FROM graph_new n JOIN graph_predicates gp
                  ON gp.org_id = p_org AND gp.name = n.predicate AND gp.functional
                ORDER BY n.valid_from, n.id
            LOOP
                WITH closed AS (
                    UPDATE graph_assertions a
                    SET valid_to = r.valid_from, invalidated_at = now(), invalidated_by = r.id
                    WHERE a.org_id = p_org AND a.subject_id = r.subject_id
                      AND a.predicate = r.predicate AND a.object_id <> r.object_id
                      AND a.valid_to IS NULL AND a.valid_from <= r.valid_from AND a.id <> r.id
                    RETURNING a.id
                )
                INSERT INTO graph_outbox (org_id, kind, ref)
                SELECT p_org, 'assertion', id::text FROM closed;
                GET DIAGNOSTICS c = ROW_COUNT;
                n_closed := n_closed + c;
                -- A fact that arrives late is closed by what was already known to follow it.
                SELECT min(a.valid_from) INTO later FROM graph_assertions a
                WHERE a.org_id = p_org AND a.subject_id = r.subject_id
                  AND a.predicate = r.predicate AND a.object_id <> r.object_id
                  AND a.valid_from > r.valid_from;
                IF later IS NOT NULL THEN
                    UPDATE graph_assertions SET valid_to = later, invalidated_at = now()
                    WHERE org_id = p_org AND id = r.id AND valid_to IS NULL;
                    GET DIAGNOSTICS c = ROW_COUNT;
                    n_closed := n_closed + c;
                END IF;
            END LOOP;
            RETURN jsonb_build_object('entities', n_entities, 'assertions', n_assertions,
                                      'closed', n_closed);
        END $$;

        -- What a source's older versions asserted by one method ends when a newer version
        -- has been extracted by it (the newer version asserts again what still holds).
        CREATE FUNCTION graph_close_superseded(
            p_org text, p_source uuid, p_version int, p_method text, p_at timestamptz
        ) RETURNS integer LANGUAGE sql AS $$
            WITH closed AS (
                UPDATE graph_assertions
                SET valid_to = greatest(p_at, valid_from), invalidated_at = now()
                WHERE org_id = p_org AND source_id = p_source AND source_version < p_version
                  AND method = p_method AND valid_to IS NULL
                RETURNING id
            ), queued AS (
                INSERT INTO graph_outbox (org_id, kind, ref)
                SELECT p_org, 'assertion', id::text FROM closed RETURNING 1
            )
            SELECT count(*)::int FROM queued
        $$;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP FUNCTION graph_close_superseded(text, uuid, int, text, timestamptz);
        DROP FUNCTION graph_assert(text, bigint, jsonb);
        DROP TABLE graph_projection_state, graph_outbox, graph_assertions, graph_predicates,
                   graph_entity_aliases, graph_entities, graph_extraction_runs,
                   kb_collection_readers;
        DROP FUNCTION graph_key(text);
        DROP VIEW kb_source_findings;
        DROP TABLE kb_health_findings, kb_health_reports, kb_freshness_policies;
        """
    )
