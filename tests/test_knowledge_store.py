"""The knowledge store: publications, carry-forward, garbage collection, lazy tiers,
filtered dense search, citations and the retrieval tool, on the real embedded PostgreSQL."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from knowledge_fixtures import ingest, split_markdown

from cortex_ray import (
    ActionType,
    Agent,
    AgentMode,
    ConfigurationError,
    Grant,
    InvalidRequestError,
    ObservationStatus,
    Runtime,
    Settings,
)
from cortex_ray.access import AccessControlService
from cortex_ray.act import InvocationContext, ToolDispatcher, ToolRegistry
from cortex_ray.knowledge import (
    Fusion,
    KnowledgeService,
    KnowledgeWriter,
    RetrievalConfig,
    Span,
    SplitPassage,
    Tier,
    knowledge_search_tool,
    term_counts,
    vector_literal,
)
from cortex_ray.models import CrossEncoderReranker, HashEmbedder, RerankHit, packaged_minilm_path
from cortex_ray.storage import Database, Store

GUIDE_V1 = b"""# Guide

Cortex runs agents on Ray clusters.

## Install

Install the package with pip and start the embedded database.
The zebra installer needs no network.

## Usage

Agents retrieve knowledge with citations.
"""

GUIDE_V2 = GUIDE_V1.replace(b"zebra installer", b"giraffe installer")

NOTES = b"""# Notes

Quarterly planning notes about the aquarium budget.

Another paragraph about penguins and their habitat.
"""


@pytest.fixture(scope="module")
def writer(db: Database) -> Iterator[KnowledgeWriter]:
    with KnowledgeWriter(db.dsn) as w:
        yield w


@pytest.fixture(scope="module")
def service(db: Database, hash_embedder: HashEmbedder) -> KnowledgeService:
    return KnowledgeService(db, hash_embedder)


async def rows(db: Database, sql: str, *params: Any) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute(sql, params)
        return await cur.fetchall()


async def texts(service: KnowledgeService, org: str, query: str, **kw: Any) -> list[str]:
    result = await service.search(org, query, tiers=["bm25"], **kw)
    return [h.text for h in result.hits]


async def test_search_serves_the_previous_publication_until_publish(writer, service, org) -> None:
    ingest(writer, org, "docs", {"guide.md": GUIDE_V1})
    assert any("zebra" in t for t in await texts(service, org, "zebra installer"))

    run = ingest(writer, org, "docs", {"guide.md": GUIDE_V2}, publish=False)
    # The new text is written but not published: searches still see the old generation.
    assert await texts(service, org, "giraffe") == []
    assert any("zebra" in t for t in await texts(service, org, "zebra installer"))

    report = writer.publish(run.generation)
    assert report.added_sources == 1 and report.removed_sources == 1
    assert any("giraffe" in t for t in await texts(service, org, "giraffe"))
    assert await texts(service, org, "zebra") == []
    assert writer.publish(run.generation).already_published  # idempotent


async def test_a_killed_run_is_invisible_collected_and_a_rerun_has_no_duplicates(
    writer, service, db, org
) -> None:
    ingest(writer, org, "docs", {"guide.md": GUIDE_V1, "notes.md": NOTES})
    # A run that dies midway: the changed guide is half written, nothing is published.
    killed = writer.begin_generation(org, "docs")
    source = writer.register_source(
        org, "docs", "guide.md", hashlib.sha256(GUIDE_V2).hexdigest(), len(GUIDE_V2)
    )
    _, passages = split_markdown(GUIDE_V2)
    writer.write_passages(killed, source, passages[:2])
    writer.write_passages(killed, source, passages[:2])  # a retried batch writes nothing twice
    assert await texts(service, org, "giraffe") == []
    assert any("zebra" in t for t in await texts(service, org, "zebra"))

    # The rerun reuses the half-written version (same content hash) and completes it.
    rerun = ingest(writer, org, "docs", {"guide.md": GUIDE_V2, "notes.md": NOTES})
    assert rerun.sources["guide.md"].version == source.version
    assert rerun.sources["notes.md"].unchanged
    count = await rows(
        db,
        "SELECT count(*) AS n, count(DISTINCT ordinal) AS d FROM kb_passages "
        "WHERE org_id = %s AND source_id = %s AND version = %s",
        org,
        source.source_id,
        source.version,
    )
    assert count[0]["n"] == count[0]["d"] == len(passages)
    hits = await service.search(org, "giraffe installer", tiers=["bm25"], k=20)
    assert len({h.passage_id for h in hits.hits}) == len(hits.hits)
    assert [h.text for h in hits.hits if "installer" in h.text] == [
        p.text for p in passages if "installer" in p.text
    ]

    garbage = writer.collect_garbage(org, "docs")
    assert garbage.generations == 2  # the killed run and the first publication
    assert garbage.source_versions == 1  # guide.md v1
    left = await rows(
        db, "SELECT id, status FROM kb_generations WHERE org_id = %s ORDER BY id", org
    )
    assert [r["status"] for r in left] == ["PUBLISHED"]
    postings = await rows(
        db,
        "SELECT count(*) AS n FROM kb_postings po WHERE po.org_id = %s AND NOT EXISTS "
        "(SELECT 1 FROM kb_passages p WHERE p.org_id = po.org_id AND p.id = po.passage_id)",
        org,
    )
    assert postings[0]["n"] == 0
    assert any("giraffe" in t for t in await texts(service, org, "giraffe"))
    assert writer.collect_garbage(org, "docs").generations == 0


async def test_unchanged_sources_are_carried_forward_not_rewritten(
    writer, service, db, org
) -> None:
    first = ingest(writer, org, "docs", {"guide.md": GUIDE_V1, "notes.md": NOTES})
    before = await rows(db, "SELECT id FROM kb_passages WHERE org_id = %s ORDER BY id", org)
    second = ingest(writer, org, "docs", {"guide.md": GUIDE_V1, "notes.md": NOTES})
    assert all(s.unchanged for s in second.sources.values())
    assert {p: s.source_id for p, s in second.sources.items()} == {
        p: s.source_id for p, s in first.sources.items()
    }
    after = await rows(db, "SELECT id FROM kb_passages WHERE org_id = %s ORDER BY id", org)
    assert after == before  # nothing rewritten
    assert second.report is not None and second.report.added_sources == 0
    assert first.report is not None and second.report.passages == first.report.passages
    carried = await rows(
        db,
        "SELECT bool_and(carried) AS carried FROM kb_generation_sources "
        "WHERE org_id = %s AND generation = %s",
        org,
        second.generation.id,
    )
    assert carried[0]["carried"] is True
    assert any("penguins" in t for t in await texts(service, org, "penguins"))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_bulk_registration_and_batched_writes_keep_every_guarantee(
    writer, service, db, org
) -> None:
    first = ingest(writer, org, "docs", {"guide.md": GUIDE_V1, "notes.md": NOTES})
    new_doc = b"# New\n\nA brand new page about otters.\n"
    batch = [
        ("guide.md", _sha(GUIDE_V2), len(GUIDE_V2)),  # changed
        ("notes.md", _sha(NOTES), len(NOTES)),  # unchanged
        ("new.md", _sha(new_doc), len(new_doc)),  # new
    ]
    gen = writer.begin_generation(org, "docs")
    guide, notes, new = writer.register_sources(org, "docs", batch)
    # Stable ids per path, a new version per new content, unchanged → carried forward.
    assert guide.source_id == first.sources["guide.md"].source_id
    assert (guide.version, guide.unchanged) == (first.sources["guide.md"].version + 1, False)
    assert notes == first.sources["notes.md"].model_copy(update={"unchanged": True})
    assert (new.version, new.unchanged) == (1, False)
    assert writer.register_sources(org, "docs", batch) == [guide, notes, new]  # no new versions
    with pytest.raises(InvalidRequestError, match="twice with different content"):
        writer.register_sources(org, "docs", [batch[0], ("guide.md", "other", 1)])

    writer.carry_forward_sources(gen, [notes.source_id])
    documents = [(guide, *split_markdown(GUIDE_V2)), (new, *split_markdown(new_doc))]
    health = [
        ("guide.md", "READ_OK", ""),
        ("notes.md", "READ_OK", "unchanged"),
        ("new.md", "READ_OK", ""),
        ("image.md", "SKIPPED", "binary"),
    ]
    expected = sum(len(passages) for _, _, passages in documents)

    async def stored() -> dict[str, Any]:
        got = await rows(
            db,
            "SELECT (SELECT count(*) FROM kb_passages WHERE org_id = %s) AS passages, "
            "(SELECT count(*) FROM kb_postings WHERE org_id = %s) AS postings, "
            "(SELECT count(*) FROM kb_sections WHERE org_id = %s) AS sections",
            org,
            org,
            org,
        )
        return got[0]

    empty = await stored()
    # A batch prepared by one writer can be written by another (the job's writing thread).
    other = KnowledgeWriter(writer.dsn)
    try:
        written = other.write_prepared(writer.prepare_documents(gen, documents[:1]))
    finally:
        other.close()
    assert written == len(documents[0][2])
    # Half of the batch is there already (a retry): the rest is inserted, with its postings.
    assert writer.write_documents(gen, documents, health) == expected - written
    before = await stored()
    assert before == {
        "passages": empty["passages"] + expected,
        "postings": empty["postings"]
        + sum(len(term_counts(p.text)[0]) for _, _, passages in documents for p in passages),
        "sections": empty["sections"] + sum(len(sections) for _, sections, _ in documents),
    }
    assert writer.write_documents(gen, documents) == 0  # a retried batch writes nothing twice
    assert await stored() == before

    members = await rows(
        db,
        "SELECT s.path, m.version, m.carried FROM kb_generation_sources m "
        "JOIN kb_sources s ON s.org_id = m.org_id AND s.id = m.source_id "
        "WHERE m.org_id = %s AND m.generation = %s ORDER BY s.path",
        org,
        gen.id,
    )
    assert members == [
        {"path": "guide.md", "version": guide.version, "carried": False},
        {"path": "new.md", "version": 1, "carried": False},
        {"path": "notes.md", "version": notes.version, "carried": True},
    ]
    sources = await rows(
        db,
        "SELECT path, health, health_detail FROM kb_sources WHERE org_id = %s ORDER BY path",
        org,
    )
    assert sources == [
        {"path": "guide.md", "health": "READ_OK", "health_detail": ""},
        {"path": "image.md", "health": "SKIPPED", "health_detail": "binary"},
        {"path": "new.md", "health": "READ_OK", "health_detail": ""},
        {"path": "notes.md", "health": "READ_OK", "health_detail": "unchanged"},
    ]

    report = writer.publish(gen)
    assert (report.added_sources, report.removed_sources) == (2, 1)  # guide v2 + new; guide v1
    assert any("giraffe" in t for t in await texts(service, org, "giraffe"))
    assert any("otters" in t for t in await texts(service, org, "otters"))
    assert any("penguins" in t for t in await texts(service, org, "penguins"))
    assert await texts(service, org, "zebra") == []
    with pytest.raises(InvalidRequestError, match="not BUILDING"):
        writer.write_documents(gen, documents)
    with pytest.raises(InvalidRequestError, match="not BUILDING"):
        writer.carry_forward_sources(gen, [notes.source_id])


async def test_a_source_that_disappears_stops_being_served(writer, service, db, org) -> None:
    ingest(writer, org, "docs", {"guide.md": GUIDE_V1, "notes.md": NOTES})
    gen = writer.begin_generation(org, "docs")
    guide = writer.register_source(
        org, "docs", "guide.md", hashlib.sha256(GUIDE_V1).hexdigest(), len(GUIDE_V1)
    )
    writer.carry_forward(gen, guide.source_id)
    assert writer.mark_disappeared(gen, ["guide.md"]) == ["notes.md"]
    writer.publish(gen)
    assert await texts(service, org, "penguins") == []
    health = await rows(
        db, "SELECT path, health FROM kb_sources WHERE org_id = %s ORDER BY path", org
    )
    assert health == [
        {"path": "guide.md", "health": "READ_OK"},
        {"path": "notes.md", "health": "DISAPPEARED"},
    ]


async def test_bad_input_is_refused_with_a_reason(writer, service, org) -> None:
    from cortex_ray import InvalidRequestError

    run = ingest(writer, org, "docs", {"guide.md": GUIDE_V1})
    with pytest.raises(InvalidRequestError, match="not BUILDING"):
        writer.write_passages(run.generation, run.sources["guide.md"], [])
    with pytest.raises(InvalidRequestError, match="query is empty"):
        await service.search(org, "   ")
    # a new collection's name is in the core's safe set: addressable in a path as it is
    for name in ("no spaces allowed", "a/b", "../up"):
        with pytest.raises(InvalidRequestError, match=r"collection name .*: 1 to 128 characters"):
            writer.begin_generation(org, name)


async def test_a_collection_named_before_the_safe_set_keeps_being_written(
    writer, service, org, db: Database
) -> None:
    async with db.connection() as conn:  # made when ':' was allowed (the table still allows it)
        await conn.execute("INSERT INTO organisations (id) VALUES (%s)", (org,))
        await conn.execute(
            "INSERT INTO kb_collections (org_id, name) VALUES (%s, %s)", (org, "team:docs")
        )
    ingest(writer, org, "team:docs", {"guide.md": GUIDE_V1})
    hits = await service.search(org, "guide", collection=["team:docs"])
    assert hits.hits and {h.collection for h in hits.hits} == {"team:docs"}


async def test_citations_read_back_from_the_file(writer, service, org, tmp_path: Path) -> None:
    doc = tmp_path / "docs" / "guide.md"
    doc.parent.mkdir()
    data = ("# Guide\n\nIntro line.\n\n## Install\n\nRun the ünïcode installer.\n" * 3).encode()
    doc.write_bytes(data)
    ingest(writer, org, "docs", {"docs/guide.md": data})
    result = await service.search(org, "ünïcode installer", tiers=["bm25"], k=3)
    assert result.hits
    for hit in result.hits:
        raw = doc.read_bytes()[hit.byte_start : hit.byte_end].decode()
        assert raw == hit.text and "installer" in raw
        lines = doc.read_text().splitlines(keepends=True)[hit.line_start - 1 : hit.line_end]
        assert "".join(lines) == hit.text
        assert hit.heading_path == ("Guide", "Install")
        assert hit.citation == (
            f"docs/guide.md:{hit.line_start}-{hit.line_end} (Guide › Install) @v1"
        )
        assert hit.path == "docs/guide.md" and hit.version == 1


async def test_tiers_lazy_passage_vectors_and_backfill_in_order_of_use(
    writer, db, org, minilm
) -> None:
    service = KnowledgeService(db, minilm, config=RetrievalConfig(sections=2, lazy_passages=3))
    files = {
        "pets.md": b"# Pets\n\nCats sleep most of the day.\n\nDogs like long walks.\n\n"
        b"Parrots can imitate speech.\n\nHamsters run on wheels at night.\n",
        "space.md": b"# Space\n\nThe Moon orbits the Earth.\n\nMars has two small moons.\n",
    }
    ingest(writer, org, "kb", files, embedder=minilm)  # type: ignore[arg-type]
    lexical = await service.search(org, "walks", tiers=["bm25"])
    assert lexical.tiers == [Tier.BM25] and lexical.lazily_embedded == 0

    result = await service.search(
        org, "which bird talks?", tiers=["section_dense", "passage_dense"]
    )
    assert Tier.SECTION_DENSE in result.tiers and Tier.PASSAGE_DENSE in result.tiers
    assert result.lazily_embedded == 3  # bounded per query
    assert result.reranked is False
    assert result.skipped == ["rerank: no reranker available"]
    assert "Parrots" in result.hits[0].text
    assert Tier.PASSAGE_DENSE in result.hits[0].tiers
    embedded = await rows(
        db,
        "SELECT count(*) AS n FROM kb_passages WHERE org_id = %s AND embedding IS NOT NULL",
        org,
    )
    assert embedded[0]["n"] == 3  # kept for the next query

    for _ in range(3):
        await service.search(org, "Mars", tiers=["bm25"])  # stemmed, "moons" finds the Moon
    assert await service.backfill_passage_vectors(org, "kb", 1) == 1
    mars = await rows(
        db,
        "SELECT embedding IS NOT NULL AS done FROM kb_passages "
        "WHERE org_id = %s AND text LIKE 'Mars%%'",
        org,
    )
    assert mars == [{"done": True}]  # the most used passage went first
    assert await service.backfill_passage_vectors(org, "kb", 100) == 2
    assert await service.backfill_passage_vectors(org, "kb", 100) == 0


class FakeReranker:
    """Prefers shorter passages: enough to see that the stage ran."""

    name = "fake:shortest-first"
    available = True
    reason = None

    async def rerank(
        self, query: str, documents: list[str], top_n: int | None = None
    ) -> list[RerankHit]:
        hits = [RerankHit(index=i, score=-len(d)) for i, d in enumerate(documents)]
        return sorted(hits, key=lambda h: -h.score)[:top_n]


async def test_a_reranker_reorders_when_available(writer, db, org, hash_embedder) -> None:
    ingest(writer, org, "docs", {"guide.md": GUIDE_V1, "notes.md": NOTES})
    service = KnowledgeService(db, hash_embedder, reranker=FakeReranker())
    result = await service.search(org, "install agents penguins", k=3)
    assert result.reranked and result.skipped == []
    assert result.reranker == "fake:shortest-first"
    assert [len(h.text) for h in result.hits] == sorted(len(h.text) for h in result.hits)
    assert all(h.rerank_score is not None for h in result.hits)


async def test_a_real_cross_encoder_reranks_and_is_named(writer, db, org, hash_embedder) -> None:
    """The real path: a sentence-transformers CrossEncoder in this process. The packaged
    MiniLM loaded as one has an untrained head, so only the mechanics are checked: the hits
    come back in the cross-encoder's order, scored by it, and the result names it."""
    ingest(writer, org, "docs", {"guide.md": GUIDE_V1, "notes.md": NOTES})
    reranker = CrossEncoderReranker(packaged_minilm_path())
    assert reranker.available and reranker.reason is None
    service = KnowledgeService(db, hash_embedder, reranker=reranker)
    result = await service.search(org, "install agents penguins", k=3)
    assert result.reranked and result.reranker == f"cross-encoder:{packaged_minilm_path()}"
    scores = [h.rerank_score for h in result.hits]
    assert None not in scores and scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    direct = await reranker.rerank("install agents penguins", [h.text for h in result.hits])
    assert [h.index for h in direct] == list(range(len(result.hits)))  # same order, same model


async def test_the_runtime_loads_the_cross_encoder_the_settings_name(
    settings: Settings, db: Database, tmp_path: Path
) -> None:
    base = settings.model_copy(update={"embedding_backend": "hash"})
    named = base.model_copy(update={"reranker_model": str(packaged_minilm_path())})
    runtime = await Runtime.open(named, model=None, embedder=HashEmbedder(384), db=db)
    try:
        assert runtime.knowledge is not None and runtime.knowledge.reranker is not None
        assert runtime.knowledge.reranker.name == f"cross-encoder:{packaged_minilm_path()}"
    finally:
        await runtime.close()
    missing = base.model_copy(update={"reranker_model": str(tmp_path / "nowhere")})
    with pytest.raises(ConfigurationError, match=r"reranker_model=.*did not load"):
        await Runtime.open(missing, model=None, embedder=HashEmbedder(384), db=db)


async def test_a_cross_encoder_that_cannot_load_is_skipped_with_its_reason(
    writer, db, org, hash_embedder, tmp_path
) -> None:
    ingest(writer, org, "docs", {"guide.md": GUIDE_V1})
    for reranker, says in [
        (CrossEncoderReranker(None), "no cross-encoder model is configured"),
        (CrossEncoderReranker(tmp_path / "missing"), "did not load"),
    ]:
        assert not reranker.available and says in (reranker.reason or "")
        with pytest.raises(RuntimeError, match="unavailable"):
            await reranker.rerank("q", ["a"])
        service = KnowledgeService(db, hash_embedder, reranker=reranker)
        result = await service.search(org, "install agents", k=3)
        assert not result.reranked and result.reranker is None
        assert any(says in s for s in result.skipped) and result.hits


async def test_filtered_dense_search_does_not_lose_results(writer, db, org) -> None:
    rng = np.random.default_rng(7)
    centers = rng.normal(size=(8, 384))
    for name, count in (("big", 3000), ("small", 40)):
        gen = writer.begin_generation(org, name)
        source = writer.register_source(org, name, f"{name}.txt", f"hash-{name}", count)
        passages = [
            SplitPassage(i, 0, f"passage {i}", Span(i + 1, i + 1, i * 10, i * 10 + 9))
            for i in range(count)
        ]
        writer.write_passages(gen, source, passages)
        writer.publish(gen)
        todo = writer.passages_to_embed(org, name, count)
        vectors = centers[rng.integers(0, 8, len(todo))] + rng.normal(size=(len(todo), 384))
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        writer.write_passage_vectors(org, [i for i, _ in todo], vectors.astype(np.float32))
    service = KnowledgeService(db, HashEmbedder(384), config=RetrievalConfig(ef_search=40))
    pub = await service.publication(org, "small")
    query = centers[0] / np.linalg.norm(centers[0])
    found = await service.passage_dense(org, pub, query.astype(np.float32), 30)
    assert len(found) == 30  # 40 of 3,040 rows pass the filter; all 30 asked for come back

    # Force the HNSW plan (at this size the planner may prefer an exact sort), then compare
    # with and without iterative scans: without them most of the 30 are lost.
    from cortex_ray.knowledge._sql import PASSAGE_DENSE_SQL

    params = {
        "org": org,
        "q": vector_literal(query),
        "cols": ["small"],
        "gens": list(pub.generations.values()),
        "k": 30,
    }
    counts = {}
    for mode in ("relaxed_order", "off"):
        async with db.transaction() as conn:
            await conn.execute("SET LOCAL enable_sort = off")
            await conn.execute("SET LOCAL hnsw.ef_search = 40")
            await conn.execute(f"SET LOCAL hnsw.iterative_scan = {mode}")
            plan = await conn.execute("EXPLAIN " + PASSAGE_DENSE_SQL, params)
            assert "kb_passages_embedding" in str(await plan.fetchall())
            cur = await conn.execute(PASSAGE_DENSE_SQL, params)
            counts[mode] = len(await cur.fetchall())
    assert counts["relaxed_order"] == 30 and counts["off"] < 10


async def test_the_retrieval_tool_goes_through_the_gate_with_citations(
    writer, service, store: Store, org
) -> None:
    ingest(writer, org, "docs", {"guide.md": GUIDE_V1})
    tool = knowledge_search_tool(service, collections=["docs"])
    dispatcher = ToolDispatcher(
        ToolRegistry([tool]), AccessControlService(), store, Settings(tool_output_chars=4000).tools
    )
    agent = Agent(
        org_id=org,
        name="reader",
        mode=AgentMode.AUTONOMOUS,
        tools=("knowledge_search",),
        grant=Grant(tools=frozenset({"knowledge_search"})),
    )
    ctx = InvocationContext(agent=agent, caller=None, mode=AgentMode.AUTONOMOUS)
    obs = await dispatcher.invoke(ctx, "knowledge_search", {"query": "install pip", "k": 2})
    assert obs.status is ObservationStatus.OK
    assert obs.action_type is ActionType.RETRIEVAL
    hit = obs.output["hits"][0]
    assert hit["citation"].startswith("guide.md:") and "(Guide › Install) @v1" in hit["citation"]
    assert "pip" in hit["text"] and "guide.md" in obs.summary
    refused = await dispatcher.invoke(ctx, "knowledge_search", {"query": "x", "k": 99})
    assert refused.status is ObservationStatus.REFUSED
    other = await dispatcher.invoke(ctx, "knowledge_search", {"query": "x", "collection": "hr"})
    assert other.status is ObservationStatus.ERROR and "not searchable" in other.summary
    # A collection name a model guessed searches every collection, and says so (not an
    # empty result, nor an error the model repeats).
    everything = ToolDispatcher(
        ToolRegistry([knowledge_search_tool(service)]),
        AccessControlService(),
        store,
        Settings().tools,
    )
    guessed = await everything.invoke(
        ctx, "knowledge_search", {"query": "install pip", "collection": "manuals"}
    )
    assert guessed.status is ObservationStatus.OK
    assert (
        guessed.output["note"] == "no published collection 'manuals': searched all of docs instead"
    )
    assert guessed.output["hits"][0]["citation"].startswith("guide.md:")
    assert guessed.summary.startswith('{"note": "no published collection')
    named = await everything.invoke(ctx, "knowledge_search", {"query": "pip", "collection": "docs"})
    assert named.status is ObservationStatus.OK and named.output["hits"]
    rows_ = await store.audit_rows(org)
    assert {r["action_type"] for r in rows_} == {"RETRIEVAL"}


async def test_sections_written_again_with_vectors_get_them(writer, db, org) -> None:
    gen = writer.begin_generation(org, "docs")
    source = writer.register_source(org, "docs", "guide.md", "h1", len(GUIDE_V1))
    sections, _ = split_markdown(GUIDE_V1)
    assert writer.write_sections(gen, source, [*sections, sections[0]]) == len(sections)
    vectors = HashEmbedder(384).embed_sync([s.summary_text for s in sections])
    writer.write_sections(gen, source, sections, vectors)
    got = await rows(
        db,
        "SELECT count(*) AS n, count(embedding) AS v FROM kb_sections WHERE org_id = %s",
        org,
    )
    assert got == [{"n": len(sections), "v": len(sections)}]


async def test_an_agent_run_searches_knowledge_and_its_ledger_keeps_the_citations(
    writer, db, settings, org
) -> None:
    """The whole path: Runtime.open wires the service, the agent names the tool, a run's
    step calls it through the gate, and the step's observation carries the citation."""
    from cortex_ray import RunStatus, Runtime
    from cortex_ray.memory import HeuristicImportanceScorer
    from cortex_ray.models import ChatRequest, ScriptedModelClient

    ingest(writer, org, "docs", {"guide.md": GUIDE_V1})

    def plan(request: ChatRequest) -> str:
        if request.schema_name != "proposals":
            raise AssertionError(request.schema_name)
        if "Step 1 of" in "\n".join(m.content or "" for m in request.messages):
            search = {"tool": "knowledge_search", "args": {"query": "zebra installer"}}
            return json.dumps({"candidates": [{**search, "rationale": "look it up"}]})
        done = {"finish": True, "message": "It needs no network.", "rationale": "cited"}
        return json.dumps({"candidates": [done]})

    tuned = settings.knowledge.model_copy(update={"fusion": Fusion.RRF, "postings_per_term": 500})
    runtime = await Runtime.open(
        settings.model_copy(update={"candidates": 1, "knowledge": tuned}),
        model=ScriptedModelClient(responder=plan),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
    )
    try:
        assert runtime.knowledge is not None
        assert runtime.knowledge.config == tuned  # Settings.knowledge reaches the service
        agent = await runtime.create_agent(
            org, "librarian", mode=AgentMode.AUTONOMOUS, tools=["knowledge_search"]
        )
        run = await runtime.run_autonomous(org, agent.id, "Does the installer need a network?")
        assert run.status is RunStatus.COMPLETED, run.reason
        observation = run.steps[0].observation
        assert observation is not None and observation.action_type is ActionType.RETRIEVAL
        top = observation.output["hits"][0]
        assert top["citation"].startswith("guide.md:") and "zebra" in top["text"]
        assert GUIDE_V1[top["bytes"][0] : top["bytes"][1]].decode() == top["text"]
    finally:
        await runtime.close(close_db=False)
