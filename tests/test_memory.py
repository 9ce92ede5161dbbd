"""Long-term memory: recall scoring, bitemporal facts, importance, extraction, procedural edits."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID

import psycopg
import pytest
from psycopg import sql

import cortex_ray.memory
from cortex_ray import (
    AccessDeniedError,
    Agent,
    ConfigurationError,
    InvalidRequestError,
    MemoryKind,
    NotFoundError,
    Principal,
    PrincipalKind,
    ProposalStatus,
    Settings,
    Turn,
)
from cortex_ray.memory import (
    HeuristicImportanceScorer,
    ImportanceScorer,
    MemoryService,
    ModelImportanceScorer,
    importance_scorer_for,
    normalise_subject,
)
from cortex_ray.models import Embedder, HashEmbedder, ScriptedModelClient
from cortex_ray.storage import Database, Store

SEMANTIC, EPISODIC, PROCEDURAL = MemoryKind.SEMANTIC, MemoryKind.EPISODIC, MemoryKind.PROCEDURAL
JAN, MAR, JUL = (datetime(2024, m, 1, tzinfo=UTC) for m in (1, 3, 7))


def service(
    db: Database,
    settings: Settings,
    embedder: Embedder | None = None,
    importance: ImportanceScorer | None = None,
    **weights: Any,
) -> MemoryService:
    tuned = settings.model_copy(update=weights)
    return MemoryService(
        db,
        embedder or HashEmbedder(384),
        tuned.memory,
        importance or HeuristicImportanceScorer(),
        structured_retries=tuned.models.structured_retries,
    )


async def new_agent(store: Store, org: str, agent_id: UUID | None = None) -> UUID:
    agent = Agent(org_id=org, name="a", **({"id": agent_id} if agent_id else {}))
    return (await store.create_agent(agent)).id


async def backdate(db: Database, org: str, memory_id: UUID, hours: float) -> None:
    """Age a memory: record time is the database's, so a test cannot write it in the past."""
    async with db.transaction() as conn:
        await conn.execute(
            "UPDATE memories SET recorded_at = recorded_at - make_interval(secs => %s) "
            "WHERE org_id = %s AND id = %s",
            (hours * 3600, org, memory_id),
        )


def person(org: str, name: str = "alice") -> Principal:
    return Principal(id=f"user:{name}", org_id=org, kind=PrincipalKind.USER, name=name)


# the package surface -------------------------------------------------------------------


def test_all_is_sorted_and_complete() -> None:
    public = {
        name
        for name, value in vars(cortex_ray.memory).items()
        if not name.startswith("_") and not isinstance(value, type(cortex_ray))
    }
    assert set(cortex_ray.memory.__all__) == public
    assert list(cortex_ray.memory.__all__) == sorted(cortex_ray.memory.__all__)


def test_embedder_must_match_the_schema(db: Database, settings: Settings) -> None:
    with pytest.raises(ConfigurationError, match="vector\\(384\\)"):
        MemoryService(db, HashEmbedder(128), settings.memory, HeuristicImportanceScorer())


def test_subjects_are_normalised() -> None:
    assert normalise_subject("  User's   Favourite\tColour ") == "user's favourite colour"
    assert normalise_subject("   ") is None
    assert normalise_subject(None) is None


# recall scoring ------------------------------------------------------------------------


async def test_each_term_ranks_alone_when_it_alone_has_weight(db, store, settings, org) -> None:
    agent = await new_agent(store, org)
    base = service(db, settings)
    deploy = await base.write(
        org_id=org,
        agent_id=agent,
        kind=EPISODIC,
        content="the deploy key rotates on monday",
        importance=2,
    )
    lunch = await base.write(
        org_id=org,
        agent_id=agent,
        kind=EPISODIC,
        content="lunch was pasta with friends",
        importance=9,
    )
    cat = await base.write(
        org_id=org,
        agent_id=agent,
        kind=EPISODIC,
        content="a cat slept on the printer",
        importance=5,
    )
    await backdate(db, org, deploy.id, 48)
    await backdate(db, org, lunch.id, 24)  # the cat is the newest memory
    query = "when does the deploy key rotate"

    async def order(**weights: float) -> list[UUID]:
        hits = await service(db, settings, **weights).recall(
            org_id=org, agent_id=agent, query=query, k=3
        )
        return [h.memory.id for h in hits]

    assert (await order(recall_alpha=1, recall_beta=0, recall_gamma=0))[0] == deploy.id
    assert await order(recall_alpha=0, recall_beta=1, recall_gamma=0) == [
        cat.id,
        lunch.id,
        deploy.id,
    ]
    assert await order(recall_alpha=0, recall_beta=0, recall_gamma=1) == [
        lunch.id,
        cat.id,
        deploy.id,
    ]
    # Together, the old but relevant memory still beats the important but irrelevant one
    # once similarity weighs enough.
    assert (await order(recall_alpha=3, recall_beta=1, recall_gamma=1))[0] == deploy.id


async def test_each_term_is_min_max_normalised(db, store, settings, org) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings, recall_alpha=1, recall_beta=2, recall_gamma=3)
    only = await memory.write(org_id=org, agent_id=agent, kind=SEMANTIC, content="sky is blue")
    # A lone candidate: every term equal across the set → 1.0, score = sum of weights.
    (hit,) = await memory.recall(org_id=org, agent_id=agent, query="sky")
    assert (hit.similarity, hit.recency, hit.importance, hit.score) == (1.0, 1.0, 1.0, 6.0)

    for i, text in enumerate(["grass is green", "snow is white", "coal is black"]):
        await memory.write(
            org_id=org, agent_id=agent, kind=EPISODIC, content=text, importance=2 + 3 * i
        )
    await backdate(db, org, only.id, 30)
    hits = await memory.recall(org_id=org, agent_id=agent, query="what colour is grass", k=10)
    assert len(hits) == 4
    for term in ("similarity", "recency", "importance"):
        values = [getattr(h, term) for h in hits]
        assert min(values) == pytest.approx(0.0, abs=1e-9), term
        assert max(values) == pytest.approx(1.0), term
    for h in hits:
        assert h.score == pytest.approx(h.similarity + 2 * h.recency + 3 * h.importance)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    # An empty query has no direction (a zero vector): similarity carries nothing, no NaN.
    empty = await memory.recall(org_id=org, agent_id=agent, query="", k=10)
    assert all(h.similarity == 1.0 for h in empty)


async def test_recency_is_not_stretched_over_seconds(db, store, settings, org) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings)
    for text in ["first note", "second note"]:
        await memory.write(org_id=org, agent_id=agent, kind=EPISODIC, content=text, importance=3)
    hits = await memory.recall(org_id=org, agent_id=agent, query="note", k=2)
    # Written moments apart: both nearly as recent as can be, not 1.0 and 0.0.
    assert [h.memory.content for h in hits] == ["second note", "first note"]  # ties → newest
    assert min(h.recency for h in hits) > 0.99


async def test_recent_memories_are_candidates_even_when_dissimilar(
    db, store, settings, org
) -> None:
    agent = await new_agent(store, org)
    memory = service(
        db, settings, recall_alpha=0, recall_beta=1, recall_gamma=0, recall_candidates=1
    )
    old = await memory.write(org_id=org, agent_id=agent, kind=EPISODIC, content="invoice 42 paid")
    await backdate(db, org, old.id, 10)
    new = await memory.write(org_id=org, agent_id=agent, kind=EPISODIC, content="weather is fine")
    # One candidate per branch: the nearest (old) and the most recent (new), ranked here
    # by recency alone. Without the recency branch, only the old memory could come back.
    hits = await memory.recall(org_id=org, agent_id=agent, query="invoice 42 paid", k=1)
    assert [h.memory.id for h in hits] == [new.id]
    by_meaning = service(
        db, settings, recall_alpha=1, recall_beta=0, recall_gamma=0, recall_candidates=1
    )
    hits = await by_meaning.recall(org_id=org, agent_id=agent, query="invoice 42 paid", k=1)
    assert [h.memory.id for h in hits] == [old.id]


async def test_recall_filters_by_kind(db, store, settings, org) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings)
    await memory.write(org_id=org, agent_id=agent, kind=EPISODIC, content="I opened the door")
    fact = await memory.write(org_id=org, agent_id=agent, kind=SEMANTIC, content="doors open")
    hits = await memory.recall(org_id=org, agent_id=agent, query="door", kinds=[SEMANTIC])
    assert [h.memory.id for h in hits] == [fact.id]
    assert await memory.recall(org_id=org, agent_id=agent, query="door", k=0) == []


async def test_no_memory_crosses_organisations(db, store, settings, org) -> None:
    other = f"org-{uuid.uuid4().hex[:12]}"
    agent = await new_agent(store, org)
    await new_agent(store, other, agent_id=agent)  # the same agent id in another organisation
    memory = service(db, settings)
    await memory.write(
        org_id=other,
        agent_id=agent,
        kind=SEMANTIC,
        content="the launch code is 1234",
        subject="launch code",
    )
    await memory.propose_edit(
        org_id=other,
        agent_id=agent,
        field="persona",
        value="x",
        rationale="",
        proposed_by=person(other),
    )
    assert await memory.recall(org_id=org, agent_id=agent, query="launch code") == []
    assert (await memory.snapshot(org_id=org, agent_id=agent, query="launch code")).recalled == ()
    assert await memory.facts(org_id=org, agent_id=agent) == []
    assert await memory.history(org_id=org, agent_id=agent, subject="launch code") == []
    assert await memory.proposals(org_id=org, agent_id=agent) == []


class CountingDatabase:
    """The real database, reachable only through ``execute``; counts what goes through.

    A service that used any other route (a cursor, a second connection) would fail here
    with AttributeError rather than slip past the count.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self.transactions = 0
        self.connections = 0
        self.statements: list[str] = []

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        self.connections += 1
        async with self._db.connection() as conn:
            yield _ExecuteOnly(conn, self.statements)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        self.transactions += 1
        async with self._db.transaction() as conn:
            yield _ExecuteOnly(conn, self.statements)


class _ExecuteOnly:
    def __init__(self, conn: Any, statements: list[str]) -> None:
        self._conn = conn
        self._statements = statements

    async def execute(self, query: Any, params: Any = None) -> Any:
        text = query.as_string(self._conn) if isinstance(query, sql.Composable) else str(query)
        self._statements.append(text)
        return await self._conn.execute(query, params)


async def test_snapshot_is_one_statement(db, store, settings, org) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings)
    for text in ["alpha note", "beta note", "gamma note"]:
        await memory.write(org_id=org, agent_id=agent, kind=EPISODIC, content=text)
    counting = CountingDatabase(db)
    spied = MemoryService(
        cast(Database, counting), HashEmbedder(384), settings.memory, HeuristicImportanceScorer()
    )
    snap = await spied.snapshot(org_id=org, agent_id=agent, query="beta", k=2)
    # One statement outside a transaction (the pool is in autocommit): one round trip.
    assert (counting.connections, counting.transactions) == (1, 0)
    assert len(counting.statements) == 1
    assert "UNION" in counting.statements[0] and "<=>" in counting.statements[0]
    assert snap.query == "beta" and len(snap.recalled) == 2
    assert snap.recalled[0].memory.content == "beta note"


# supersession and bitemporal reads -----------------------------------------------------


async def test_newer_fact_supersedes_and_history_keeps_both(db, store, settings, org) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings)
    blue = await memory.write(
        org_id=org,
        agent_id=agent,
        kind=SEMANTIC,
        content="Alice likes blue",
        subject="Alice  favourite colour",
    )
    green = await memory.write(
        org_id=org,
        agent_id=agent,
        kind=SEMANTIC,
        content="Alice likes green",
        subject="alice favourite colour ",
    )
    assert green.subject == blue.subject == "alice favourite colour"
    assert green.valid_to is None and green.superseded_at is None

    history = await memory.history(org_id=org, agent_id=agent, subject="ALICE favourite colour")
    assert [h.content for h in history] == ["Alice likes blue", "Alice likes green"]
    old = history[0]
    assert old.valid_to == green.valid_from
    assert old.superseded_at == green.recorded_at
    assert old.superseded_by == green.id

    assert [f.content for f in await memory.facts(org_id=org, agent_id=agent)] == [
        "Alice likes green"
    ]
    hits = await memory.recall(org_id=org, agent_id=agent, query="Alice likes blue", k=5)
    assert [h.memory.id for h in hits] == [green.id]  # latest only by default


async def test_as_of_valid_time(db, store, settings, org) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings)
    for when, city in [(JAN, "Lyon"), (JUL, "Oslo")]:
        await memory.write(
            org_id=org,
            agent_id=agent,
            kind=SEMANTIC,
            content=f"Bob lives in {city}",
            subject="bob city",
            valid_from=when,
        )

    async def city_at(t: datetime) -> list[str]:
        return [f.content for f in await memory.facts(org_id=org, agent_id=agent, valid_at=t)]

    assert await city_at(JAN - timedelta(days=1)) == []
    assert await city_at(MAR) == ["Bob lives in Lyon"]
    assert await city_at(JUL) == ["Bob lives in Oslo"]
    hits = await memory.recall(
        org_id=org, agent_id=agent, query="where does Bob live", valid_at=MAR
    )
    assert [h.memory.content for h in hits] == ["Bob lives in Lyon"]


async def test_as_of_record_time(db, store, settings, org) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings)
    first = await memory.write(
        org_id=org,
        agent_id=agent,
        kind=SEMANTIC,
        content="the API limit is 100",
        subject="api limit",
        valid_from=JAN,
    )
    await asyncio.sleep(0.01)
    second = await memory.write(
        org_id=org,
        agent_id=agent,
        kind=SEMANTIC,
        content="the API limit is 500",
        subject="api limit",
        valid_from=MAR,
    )
    r1, r2 = first.recorded_at, second.recorded_at
    assert r1 < r2
    between = r1 + (r2 - r1) / 2

    async def believed(**at: datetime) -> list[str]:
        return [f.content for f in await memory.facts(org_id=org, agent_id=agent, **at)]

    # What we believed between the two writes about today: the old limit.
    assert await believed(known_at=between) == ["the API limit is 100"]
    assert await believed(known_at=r1 - timedelta(seconds=1)) == []
    assert await believed(known_at=r2) == ["the API limit is 500"]
    # What we now believe held in February: still the old limit (valid time, not record time).
    assert await believed(valid_at=datetime(2024, 2, 1, tzinfo=UTC)) == ["the API limit is 100"]
    hits = await memory.recall(org_id=org, agent_id=agent, query="API limit", known_at=between)
    assert [h.memory.id for h in hits] == [first.id]


async def test_out_of_order_fact_arrives_bounded(db, store, settings, org) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings)

    async def fact(text: str, when: datetime) -> Any:
        return await memory.write(
            org_id=org,
            agent_id=agent,
            kind=SEMANTIC,
            content=text,
            subject="plan",
            valid_from=when,
        )

    a = await fact("plan A", JAN)
    c = await fact("plan C", JUL)
    b = await fact("plan B", MAR)  # older valid time, recorded last
    assert b.valid_to == JUL and b.superseded_by == c.id and b.superseded_at == b.recorded_at
    z = await fact("plan Z", JAN - timedelta(days=30))  # before everything
    assert z.valid_to == JAN and z.superseded_by == a.id

    history = await memory.history(org_id=org, agent_id=agent, subject="plan")
    assert [h.content for h in history] == ["plan Z", "plan A", "plan B", "plan C"]
    assert [(h.valid_from, h.valid_to) for h in history] == [
        (JAN - timedelta(days=30), JAN),
        (JAN, MAR),
        (MAR, JUL),
        (JUL, None),
    ]
    assert history[1].superseded_by == b.id

    async def plan_at(t: datetime) -> list[str]:
        return [f.content for f in await memory.facts(org_id=org, agent_id=agent, valid_at=t)]

    assert await plan_at(datetime(2024, 2, 1, tzinfo=UTC)) == ["plan A"]
    assert await plan_at(datetime(2024, 4, 1, tzinfo=UTC)) == ["plan B"]
    assert await plan_at(datetime(2024, 8, 1, tzinfo=UTC)) == ["plan C"]
    assert [f.content for f in await memory.facts(org_id=org, agent_id=agent)] == ["plan C"]


async def test_episodic_memories_are_never_superseded(db, store, settings, org) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings)
    for text in ["ran the tests", "ran the tests again"]:
        await memory.write(org_id=org, agent_id=agent, kind=EPISODIC, content=text, subject="tests")
    hits = await memory.recall(org_id=org, agent_id=agent, query="ran the tests", k=5)
    assert len(hits) == 2 and all(h.memory.valid_to is None for h in hits)


# writing inside the caller's transaction -----------------------------------------------


async def test_a_step_memory_is_written_once(db, store, settings, org) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings)
    run_id = uuid.uuid4()
    step = {"org_id": org, "agent_id": agent, "kind": EPISODIC, "run_id": run_id, "step_index": 0}
    await memory.write(content="step 0: looked around", **step)
    prepared = await memory.prepare(content="step 0 again", **step)
    with pytest.raises(psycopg.errors.UniqueViolation):
        async with db.transaction() as conn:
            await memory.write_prepared(conn, [prepared])


async def test_write_prepared_is_atomic_with_the_caller(db, store, settings, org) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings)
    prepared = await memory.prepare_many(
        [
            {"org_id": org, "agent_id": agent, "kind": EPISODIC, "content": "did a thing"},
            {
                "org_id": org,
                "agent_id": agent,
                "kind": SEMANTIC,
                "content": "x is 1",
                "subject": "x",
            },
        ]
    )
    assert [p.embedding.shape for p in prepared] == [(384,), (384,)]
    with pytest.raises(RuntimeError):
        async with db.transaction() as conn:
            await memory.write_prepared(conn, prepared)
            raise RuntimeError("the ledger write failed")
    assert await memory.recall(org_id=org, agent_id=agent, query="thing") == []
    with pytest.raises(InvalidRequestError):
        await memory.prepare(org_id=org, agent_id=agent, kind=EPISODIC, content="x", importance=11)
    with pytest.raises(InvalidRequestError):
        await memory.prepare(org_id=org, agent_id=agent, kind=EPISODIC, content="  ")


# importance ----------------------------------------------------------------------------


async def test_heuristic_importance_is_fixed_by_kind_and_markers() -> None:
    h = HeuristicImportanceScorer()
    assert await h.score(PROCEDURAL, "persona changed") == 8
    assert await h.score(SEMANTIC, "Alice likes blue") == 5
    assert await h.score(EPISODIC, "step 2: the tool call was refused") == 7
    assert await h.score(EPISODIC, "Run 'x' completed: 42") == 6
    assert await h.score(EPISODIC, "step 1: read the clock") == 3


async def test_model_importance_and_its_fallback(db, store, settings, org, caplog) -> None:
    model = ScriptedModelClient(['{"importance": 9}'])
    scorer = ModelImportanceScorer(model, retries=1, fallback=HeuristicImportanceScorer())
    agent = await new_agent(store, org)
    memory = service(db, settings, importance=scorer)
    record = await memory.write(org_id=org, agent_id=agent, kind=EPISODIC, content="I got married")
    assert record.importance == 9.0
    assert model.requests[0].response_schema is not None
    assert "poignancy" in (model.requests[0].messages[0].content or "")

    model.push("not json", '{"importance": 42}')  # garbage, then out of range: fall back
    with caplog.at_level(logging.WARNING, logger="cortex_ray.memory"):
        assert await scorer.score(SEMANTIC, "the sky is blue") == 5.0
    assert any("heuristic" in r.getMessage() for r in caplog.records)
    assert await scorer.score(PROCEDURAL, "no script left: a model error") == 8.0

    assert isinstance(importance_scorer_for(settings.memory, None), HeuristicImportanceScorer)
    assert isinstance(importance_scorer_for(settings.memory, model), ModelImportanceScorer)


# the extraction pass -------------------------------------------------------------------


def facts_reply(*pairs: tuple[str, str]) -> str:
    return json.dumps({"facts": [{"subject": s, "fact": f} for s, f in pairs]})


async def test_extraction_writes_facts_that_supersede(db, store, settings, org) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings)
    chat = [Turn(role="user", content="I'm Alice, I love blue. The deadline is Friday.")]
    model = ScriptedModelClient(
        [
            facts_reply(
                ("Alice's favourite colour", "Alice loves blue."),
                ("project deadline", "The deadline is Friday."),
                ("  ", "a blank subject is dropped"),
            )
        ]
    )
    s1 = uuid.uuid4()
    first = await memory.extract_facts(
        org_id=org, agent_id=agent, session_id=s1, conversation=chat, model=model
    )
    assert [(f.subject, f.content) for f in first] == [
        ("alice's favourite colour", "Alice loves blue."),
        ("project deadline", "The deadline is Friday."),
    ]
    assert all(f.kind is SEMANTIC and f.session_id == s1 for f in first)
    assert "Alice, I love blue" in (model.requests[0].messages[-1].content or "")

    model.push(facts_reply(("ALICE'S  favourite colour", "Alice now loves green.")))
    await memory.extract_facts(
        org_id=org, agent_id=agent, session_id=uuid.uuid4(), conversation=chat, model=model
    )
    current = await memory.facts(org_id=org, agent_id=agent)
    assert [f.content for f in current] == ["Alice now loves green.", "The deadline is Friday."]


async def extraction_rows(db: Database, org: str, session_id: UUID) -> list[tuple[Any, ...]]:
    """What a session's extraction stored: (subject, content, key, superseded?) by key."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT subject, content, idempotency_key, superseded_at IS NOT NULL AS gone "
            "FROM memories WHERE org_id = %s AND session_id = %s ORDER BY idempotency_key",
            (org, session_id),
        )
        return [
            (r["subject"], r["content"], r["idempotency_key"], r["gone"])
            for r in await cur.fetchall()
        ]


async def test_a_retried_extraction_leaves_one_copy(db, store, settings, org) -> None:
    """Issue 30, point 7: a second pass for a session (a retried end after a crash, or a
    second end) finds the first pass's facts: the model is not asked, nothing is written."""
    agent = await new_agent(store, org)
    memory = service(db, settings)
    chat = [Turn(role="user", content="I'm Alice, I love blue. The deadline is Friday.")]
    session = uuid.uuid4()
    args = {"org_id": org, "agent_id": agent, "session_id": session, "conversation": chat}
    first_model = ScriptedModelClient(
        [facts_reply(("favourite colour", "Alice loves blue."), ("deadline", "Friday."))]
    )
    first = await memory.extract_facts(model=first_model, **args)
    # The retry's model would answer differently (another subject, another wording).
    retry_model = ScriptedModelClient(
        [facts_reply(("colour", "Alice likes blue."), ("deadline", "It is Friday."))]
    )
    again = await memory.extract_facts(model=retry_model, **args)
    assert again == first and len(retry_model.requests) == 0
    expected = [
        ("favourite colour", "Alice loves blue.", f"session-end:{session}:0", False),
        ("deadline", "Friday.", f"session-end:{session}:1", False),
    ]
    assert await extraction_rows(db, org, session) == expected
    current = await memory.facts(org_id=org, agent_id=agent)
    assert [(f.subject, f.content) for f in current] == [
        ("deadline", "Friday."), ("favourite colour", "Alice loves blue.")
    ]  # fmt: skip
    # Another session's extraction is its own: same subjects supersede, as before.
    other = uuid.uuid4()
    newer = ScriptedModelClient([facts_reply(("deadline", "Monday now."))])
    await memory.extract_facts(model=newer, **{**args, "session_id": other})
    assert await extraction_rows(db, org, other) == [
        ("deadline", "Monday now.", f"session-end:{other}:0", False)
    ]
    assert [r[3] for r in await extraction_rows(db, org, session)] == [False, True]


async def test_two_extractions_at_once_write_one_set(db, store, settings, org) -> None:
    """Two ends of one session at once (two replicas): both ask the model, one writes, and
    the other returns what it wrote (under the extraction's lock)."""
    agent = await new_agent(store, org)
    memory = service(db, settings)
    chat = [Turn(role="user", content="Call me Al. I live in Oslo.")]
    session = uuid.uuid4()
    args = {"org_id": org, "agent_id": agent, "session_id": session, "conversation": chat}
    asked = asyncio.Event()
    waiting = 0

    async def together(request: Any, pairs: list[tuple[str, str]]) -> str:
        # Both passes reach the model before either writes.
        nonlocal waiting
        waiting += 1
        if waiting == 2:
            asked.set()
        await asyncio.wait_for(asked.wait(), 10)
        return facts_reply(*pairs)

    a = ScriptedModelClient(responder=lambda r: together(r, [("name", "Al."), ("home", "Oslo.")]))
    b = ScriptedModelClient(responder=lambda r: together(r, [("user name", "Called Al.")]))
    one, two = await asyncio.gather(
        memory.extract_facts(model=a, **args), memory.extract_facts(model=b, **args)
    )
    assert len(a.requests) == len(b.requests) == 1
    assert one == two
    rows = await extraction_rows(db, org, session)
    assert [(r[0], r[1]) for r in rows] == [(f.subject, f.content) for f in one]
    assert len(rows) in (1, 2) and not any(r[3] for r in rows)


async def test_extraction_without_a_model_or_with_garbage_is_empty(
    db, store, settings, org, caplog
) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings, structured_retries=1)
    chat = [Turn(role="user", content="hello")]
    args = {"org_id": org, "agent_id": agent, "session_id": uuid.uuid4(), "conversation": chat}
    assert await memory.extract_facts(model=None, **args) == []
    garbage = ScriptedModelClient(["{{{", '{"facts": "nope"}'])
    with caplog.at_level(logging.WARNING, logger="cortex_ray.memory"):
        assert await memory.extract_facts(model=garbage, **args) == []
    assert len(garbage.requests) == 2  # one try and one retry
    assert any("extraction" in r.getMessage() for r in caplog.records)
    assert await memory.facts(org_id=org, agent_id=agent) == []


# procedural memory ---------------------------------------------------------------------


async def test_procedural_edit_waits_for_a_person(db, store, settings, org) -> None:
    agent = await store.create_agent(Agent(org_id=org, name="a", persona="chatty"))
    memory = service(db, settings)
    proposal = await memory.propose_edit(
        org_id=org,
        agent_id=agent.id,
        field="persona",
        value="terse",
        rationale="people want short answers",
        proposed_by=agent.principal(),
    )
    assert proposal.status is ProposalStatus.PENDING and proposal.proposed_by == f"agent:{agent.id}"
    assert (await store.get_agent(org, agent.id)).persona == "chatty"

    # The agent cannot approve its own edit, as an AGENT or dressed up as a USER.
    with pytest.raises(AccessDeniedError):
        await memory.decide_proposal(
            org_id=org, proposal_id=proposal.id, approver=agent.principal(), approve=True
        )
    disguised = Principal(id=f"agent:{agent.id}", org_id=org, kind=PrincipalKind.USER)
    with pytest.raises(AccessDeniedError):
        await memory.decide_proposal(
            org_id=org, proposal_id=proposal.id, approver=disguised, approve=True
        )
    with pytest.raises(AccessDeniedError):  # a person of another organisation
        await memory.decide_proposal(
            org_id=org, proposal_id=proposal.id, approver=person("elsewhere"), approve=True
        )
    with pytest.raises(NotFoundError):
        await memory.decide_proposal(
            org_id=org, proposal_id=uuid.uuid4(), approver=person(org), approve=True
        )

    decided = await memory.decide_proposal(
        org_id=org, proposal_id=proposal.id, approver=person(org), approve=True
    )
    assert decided.status is ProposalStatus.APPROVED
    assert decided.decided_by == "user:alice" and decided.decided_at is not None
    changed = await store.get_agent(org, agent.id)
    assert changed.persona == "terse" and changed.updated_at > agent.updated_at
    hits = await memory.recall(org_id=org, agent_id=agent.id, query="persona", kinds=[PROCEDURAL])
    assert [h.memory.content for h in hits] == ["persona changed to: terse"]
    assert hits[0].memory.importance == 8.0

    with pytest.raises(InvalidRequestError):  # decided once only
        await memory.decide_proposal(
            org_id=org, proposal_id=proposal.id, approver=person(org), approve=False
        )


async def test_rejected_skills_edit_changes_nothing(db, store, settings, org) -> None:
    agent = await store.create_agent(Agent(org_id=org, name="a", skills=("sql",)))
    memory = service(db, settings)
    proposal = await memory.propose_edit(
        org_id=org,
        agent_id=agent.id,
        field="skills",
        value=["sql", "python"],
        rationale="",
        proposed_by=agent.principal(),
    )
    assert proposal.value == ("sql", "python")
    assert [p.id for p in await memory.proposals(org_id=org, agent_id=agent.id)] == [proposal.id]
    rejected = await memory.decide_proposal(
        org_id=org, proposal_id=proposal.id, approver=person(org), approve=False
    )
    assert rejected.status is ProposalStatus.REJECTED
    assert (await store.get_agent(org, agent.id)).skills == ("sql",)
    assert await memory.recall(org_id=org, agent_id=agent.id, query="skills") == []
    assert (
        await memory.proposals(org_id=org, agent_id=agent.id, status=ProposalStatus.PENDING) == []
    )

    approved = await memory.propose_edit(
        org_id=org,
        agent_id=agent.id,
        field="skills",
        value=["sql", "rust"],
        rationale="",
        proposed_by=agent.principal(),
    )
    await memory.decide_proposal(
        org_id=org, proposal_id=approved.id, approver=person(org), approve=True
    )
    assert (await store.get_agent(org, agent.id)).skills == ("sql", "rust")

    with pytest.raises(InvalidRequestError):
        await memory.propose_edit(
            org_id=org,
            agent_id=agent.id,
            field="skills",
            value="sql",
            rationale="",
            proposed_by=agent.principal(),
        )
    with pytest.raises(NotFoundError):
        await memory.propose_edit(
            org_id=org,
            agent_id=uuid.uuid4(),
            field="persona",
            value="x",
            rationale="",
            proposed_by=agent.principal(),
        )


# the real path: packaged models --------------------------------------------------------


@pytest.mark.integration
async def test_minilm_recalls_by_meaning(db, store, settings, org, minilm) -> None:
    agent = await new_agent(store, org)
    memory = service(db, settings, embedder=minilm)
    texts = [
        "The user owns a golden retriever named Biscuit.",
        "The quarterly report is due at the end of March.",
        "The office printer on floor two is out of toner.",
        "Deployments run every Tuesday after standup.",
        "The user's sister lives in Lisbon.",
    ]
    for text in texts:
        await memory.write(org_id=org, agent_id=agent, kind=SEMANTIC, content=text, importance=5)
    # No word in common with the answer: only meaning can find it. The dog was written
    # first, so recency works against it.
    hits = await memory.recall(org_id=org, agent_id=agent, query="Which animal lives with them?")
    assert hits[0].memory.content == texts[0]


@pytest.mark.integration
async def test_smollm2_scores_importance(smollm2) -> None:
    class Spy:
        used = 0

        async def score(self, kind: MemoryKind, content: str) -> float:
            Spy.used += 1
            return 1.0

    scorer = ModelImportanceScorer(smollm2, retries=1, fallback=Spy())
    value = await scorer.score(EPISODIC, "My best friend told me she is moving abroad forever.")
    assert 1.0 <= value <= 10.0 and value == int(value)
    assert Spy.used == 0  # the model answered, the fallback did not
