"""Postings partitioned by collection (migration 0005): a collection's first load is staged
without indexes and attached at publish; later runs write into the partition; what a run
left in the stage is merged; garbage collection cleans the stage; the migration moves
existing postings both ways. On the real embedded PostgreSQL."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from knowledge_fixtures import ingest, split_markdown

from cortex_ray.knowledge import KnowledgeService, KnowledgeWriter
from cortex_ray.knowledge._sql import partition_name, stage_name
from cortex_ray.models import HashEmbedder
from cortex_ray.storage import Database
from cortex_ray.storage._database import _alembic

ALPHA = b"# Alpha\n\nThe alpha reactor hums quietly.\n\nIts coolant is heavy water.\n"
BETA = b"# Beta\n\nThe beta telescope watches quasars.\n"
GAMMA = b"# Gamma\n\nGamma rays pass through the lead shield.\n"


@pytest.fixture(scope="module")
def writer(db: Database) -> Iterator[KnowledgeWriter]:
    with KnowledgeWriter(db.dsn) as w:
        yield w


@pytest.fixture(scope="module")
def service(db: Database, hash_embedder: HashEmbedder) -> KnowledgeService:
    return KnowledgeService(db, hash_embedder)


def one(dsn: str, query: str, *params: Any) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def collection_id(dsn: str, org: str, name: str) -> int:
    return int(one(dsn, "SELECT id FROM kb_collections WHERE org_id = %s AND name = %s", org, name))


def count(dsn: str, table: str) -> int:
    if one(dsn, "SELECT to_regclass(%s) IS NULL", table):
        return -1  # no such table
    return int(one(dsn, f"SELECT count(*) FROM {table}"))


def attached(dsn: str, table: str) -> bool:
    return bool(
        one(
            dsn,
            "SELECT EXISTS (SELECT 1 FROM pg_inherits "
            "WHERE inhrelid = to_regclass(%s) AND inhparent = 'kb_postings'::regclass)",
            table,
        )
    )


async def terms_found(service: KnowledgeService, org: str, query: str) -> list[str]:
    result = await service.search(org, query, tiers=["bm25"])
    return [h.text for h in result.hits]


def write(writer: KnowledgeWriter, gen: Any, path: str, data: bytes) -> None:
    source = writer.register_source(
        gen.org_id, gen.collection, path, hashlib.sha256(data).hexdigest(), len(data)
    )
    writer.write_passages(gen, source, split_markdown(data)[1])


async def test_a_first_load_is_staged_then_attached_as_the_partition_at_publish(
    writer, service, db, org
) -> None:
    run = ingest(writer, org, "docs", {"alpha.md": ALPHA, "beta.md": BETA}, publish=False)
    cid = collection_id(db.dsn, org, "docs")
    stage, part = stage_name(cid), partition_name(cid)
    staged = count(db.dsn, stage)
    assert staged > 0 and count(db.dsn, part) == -1  # no partition yet: nothing searchable
    assert await terms_found(service, org, "reactor") == []

    writer.publish(run.generation)
    # The stage became the partition, with the parent's indexes and foreign key; a new,
    # empty stage waits for the next run that finds no partition.
    assert attached(db.dsn, part) and count(db.dsn, part) == staged
    assert count(db.dsn, stage) == 0
    indexes = one(db.dsn, "SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass", part)
    assert indexes == 2  # the primary key and the impact index
    fk = one(
        db.dsn,
        "SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'f' "
        "AND conparentid <> 0",
        part,
    )
    assert fk == 1
    assert any("reactor" in t for t in await terms_found(service, org, "reactor"))
    assert any("quasars" in t for t in await terms_found(service, org, "quasars"))

    # A later run writes straight into the partition: the stage stays empty.
    later = ingest(writer, org, "docs", {"gamma.md": GAMMA}, publish=False)
    assert count(db.dsn, stage) == 0 and count(db.dsn, part) > staged
    assert await terms_found(service, org, "shield") == []  # written, not published
    writer.publish(later.generation)
    assert any("shield" in t for t in await terms_found(service, org, "shield"))
    assert await terms_found(service, org, "reactor") == []  # alpha.md was not in that run


async def test_a_run_begun_before_the_partition_existed_is_merged_at_its_publish(
    db, service, org
) -> None:
    with KnowledgeWriter(db.dsn) as first, KnowledgeWriter(db.dsn) as second:
        a = first.begin_generation(org, "docs")
        b = second.begin_generation(org, "docs")
        write(second, b, "alpha.md", ALPHA)  # b chooses the stage
        write(first, a, "beta.md", BETA)
        first.publish(a)  # the stage, with b's alpha too, becomes the partition
        cid = collection_id(db.dsn, org, "docs")
        write(second, b, "gamma.md", GAMMA)  # b still writes to the (new) stage
        assert count(db.dsn, stage_name(cid)) > 0
        second.publish(b)
        assert count(db.dsn, stage_name(cid)) == 0
    found = await terms_found(service, org, "reactor quasars shield")
    assert any("reactor" in t for t in found) and any("shield" in t for t in found)
    assert not any("quasars" in t for t in found)  # beta.md is not in b
    # Nothing is indexed twice.
    dupes = one(
        db.dsn,
        f"SELECT count(*) FROM (SELECT passage_id, term FROM {partition_name(cid)} "
        "GROUP BY 1, 2 HAVING count(*) > 1) d",
    )
    assert dupes == 0


async def test_garbage_collection_cleans_staged_postings_of_deleted_passages(db, org) -> None:
    with KnowledgeWriter(db.dsn) as killed, KnowledgeWriter(db.dsn) as runner:
        k = killed.begin_generation(org, "docs")
        write(killed, k, "alpha.md", ALPHA)
        p = runner.begin_generation(org, "docs")
        write(runner, p, "beta.md", BETA)
        runner.publish(p)
        write(killed, k, "gamma.md", GAMMA)  # into the new stage; this run never publishes
        cid = collection_id(db.dsn, org, "docs")
        assert count(db.dsn, stage_name(cid)) > 0
        report = runner.collect_garbage(org, "docs")
    assert report.generations == 1 and report.source_versions == 2  # the killed run's
    assert count(db.dsn, stage_name(cid)) == 0
    orphans = one(
        db.dsn,
        f"SELECT count(*) FROM {partition_name(cid)} po WHERE NOT EXISTS "
        "(SELECT 1 FROM kb_passages p WHERE p.id = po.passage_id)",
    )
    assert orphans == 0


_V4_ROWS = """
INSERT INTO organisations (id) VALUES ('acme');
INSERT INTO kb_collections (org_id, name) VALUES ('acme', 'docs'), ('acme', 'wiki');
INSERT INTO kb_sources (org_id, id, collection, path)
VALUES ('acme', '00000000-0000-0000-0000-000000000001', 'docs', 'a.md'),
       ('acme', '00000000-0000-0000-0000-000000000002', 'wiki', 'b.md');
INSERT INTO kb_source_versions (org_id, source_id, version, content_hash, size_bytes)
VALUES ('acme', '00000000-0000-0000-0000-000000000001', 1, 'h1', 10),
       ('acme', '00000000-0000-0000-0000-000000000002', 1, 'h2', 10);
INSERT INTO kb_passages (org_id, id, source_id, version, ordinal, section_ordinal, collection,
                         text, line_start, line_end, byte_start, byte_end, length)
OVERRIDING SYSTEM VALUE
VALUES ('acme', 1, '00000000-0000-0000-0000-000000000001', 1, 0, 0, 'docs', 'red fox',
        1, 1, 0, 7, 2),
       ('acme', 2, '00000000-0000-0000-0000-000000000002', 1, 0, 0, 'wiki', 'blue jay',
        1, 1, 0, 8, 2);
INSERT INTO kb_postings (org_id, passage_id, term, collection, tf, impact)
VALUES ('acme', 1, 'red', 'docs', 1, 0.5), ('acme', 1, 'fox', 'docs', 1, 0.5),
       ('acme', 2, 'blue', 'wiki', 1, 0.5), ('acme', 2, 'jay', 'wiki', 1, 0.5);
"""


async def test_the_migration_moves_postings_into_partitions_and_back(scratch_database) -> None:
    async with scratch_database("postings") as dsn:
        _alembic(dsn, "upgrade", "0004")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(_V4_ROWS)
        _alembic(dsn, "upgrade", "head")
        with psycopg.connect(dsn, autocommit=True) as conn:
            ids = dict(conn.execute("SELECT name, id FROM kb_collections").fetchall())
            for collection, terms in (("docs", ["fox", "red"]), ("wiki", ["blue", "jay"])):
                part = partition_name(ids[collection])
                got = conn.execute(f"SELECT term FROM {part} ORDER BY term").fetchall()
                assert [t for (t,) in got] == terms
                assert attached(dsn, part)
            passages = conn.execute(
                "SELECT id, collection_id FROM kb_passages ORDER BY id"
            ).fetchall()
            assert passages == [(1, ids["docs"]), (2, ids["wiki"])]
            # The rewrite that filled collection_id rebuilt the passages' indexes, HNSW too.
            hnsw = conn.execute(
                "SELECT am.amname FROM pg_class i JOIN pg_am am ON am.oid = i.relam "
                "WHERE i.relname = 'kb_passages_embedding'"
            ).fetchone()
            assert hnsw == ("hnsw",)
            # Deleting a passage cascades to its postings in its partition.
            conn.execute("DELETE FROM kb_passages WHERE id = 2")
            assert conn.execute("SELECT count(*) FROM kb_postings").fetchone() == (2,)
        _alembic(dsn, "downgrade", "0004")
        with psycopg.connect(dsn, autocommit=True) as conn:
            got = conn.execute(
                "SELECT passage_id, term, collection FROM kb_postings ORDER BY term"
            ).fetchall()
            assert got == [(1, "fox", "docs"), (1, "red", "docs")]
        _alembic(dsn, "upgrade", "head")
