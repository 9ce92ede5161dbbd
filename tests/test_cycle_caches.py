"""The caches on the cycle's hot path never serve a stale answer: whatever a cached value was
derived from, changing it gives the new value; and the lighter connection checkout behaves as
the pool's own (issue 12's overhead cuts)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np
import psycopg
import pytest

from cortex_ray import (
    ActionType,
    Agent,
    AgentMode,
    Grant,
    MemorySnapshot,
    Principal,
    Settings,
    ToolSpec,
    WorkingMemory,
)
from cortex_ray.access import AccessControlService, AccessDecision
from cortex_ray.act import ActionClassifier, Tool, ToolContext, ToolDispatcher, ToolRegistry
from cortex_ray.models import HashEmbedder
from cortex_ray.perceive import PromptComposer
from cortex_ray.storage import Database


async def noop(ctx: ToolContext, args: dict[str, Any]) -> str:
    return "ok"


def dispatcher(
    registry: ToolRegistry, access: AccessControlService | None = None
) -> ToolDispatcher:
    # action_space never touches the store.
    return ToolDispatcher(registry, access or AccessControlService(), None, Settings())  # type: ignore[arg-type]


def agent(tools: tuple[str, ...], **kw: Any) -> Agent:
    return Agent(
        org_id="acme",
        name="a",
        mode=AgentMode.AUTONOMOUS,
        tools=tools,
        grant=kw.pop("grant", Grant(tools=frozenset({"*"}))),
        **kw,
    )


def names(specs: list[ToolSpec]) -> list[str]:
    return [s.name for s in specs]


def test_action_space_follows_the_registry_the_agent_and_the_classifier() -> None:
    registry = ToolRegistry([Tool(name="alpha", description="a", handler=noop)])
    gate = dispatcher(registry)
    ada = agent(("alpha", "beta"))
    first = gate.action_space(ada, None, AgentMode.AUTONOMOUS)
    assert names(first) == ["alpha"]
    first.clear()  # the caller's list is its own
    assert names(gate.action_space(ada, None, AgentMode.AUTONOMOUS)) == ["alpha"]

    registry.register(Tool(name="beta", description="b", handler=noop))  # a new tool
    assert names(gate.action_space(ada, None, AgentMode.AUTONOMOUS)) == ["alpha", "beta"]

    # A changed agent is a new object (frozen): its own tool set and grant apply.
    narrower = ada.model_copy(update={"grant": Grant(tools=frozenset({"beta"}))})
    assert names(gate.action_space(narrower, None, AgentMode.AUTONOMOUS)) == ["beta"]
    assert names(gate.action_space(ada, None, AgentMode.AUTONOMOUS)) == ["alpha", "beta"]

    registry.classifier = ActionClassifier({"beta": ActionType.RETRIEVAL})  # a new classifier
    space = gate.action_space(ada, None, AgentMode.AUTONOMOUS)
    assert names(space) == ["beta", "alpha"]  # RETRIEVAL is listed before GROUNDING
    assert space[0].action_type is ActionType.RETRIEVAL


def test_action_space_of_an_interactive_caller_is_its_own() -> None:
    registry = ToolRegistry([Tool(name=n, description=n, handler=noop) for n in ("alpha", "beta")])
    gate = dispatcher(registry)
    ada = agent(("alpha", "beta"))
    alice = Principal(id="alice", org_id="acme", grant=Grant(tools=frozenset({"alpha"})))
    bob = Principal(id="bob", org_id="acme", grant=Grant(tools=frozenset({"beta"})))
    assert names(gate.action_space(ada, alice, AgentMode.INTERACTIVE)) == ["alpha"]
    assert names(gate.action_space(ada, bob, AgentMode.INTERACTIVE)) == ["beta"]
    assert names(gate.action_space(ada, None, AgentMode.AUTONOMOUS)) == ["alpha", "beta"]


class Switchable(AccessControlService):
    """An access service that decides by state of its own."""

    def __init__(self) -> None:
        self.denied: set[str] = set()

    def decide(self, agent: Agent, caller: Principal | None, tool: str, action_type: ActionType,
               *, mode: AgentMode | None = None) -> AccessDecision:  # fmt: skip
        if tool in self.denied:
            return AccessDecision(False, "switched off")
        return super().decide(agent, caller, tool, action_type, mode=mode)


def test_action_space_asks_a_custom_access_service_every_time() -> None:
    registry = ToolRegistry([Tool(name=n, description=n, handler=noop) for n in ("alpha", "beta")])
    access = Switchable()
    gate = dispatcher(registry, access)
    ada = agent(("alpha", "beta"))
    assert names(gate.action_space(ada, None, AgentMode.AUTONOMOUS)) == ["alpha", "beta"]
    access.denied.add("alpha")
    assert names(gate.action_space(ada, None, AgentMode.AUTONOMOUS)) == ["beta"]


def working_memory(specs: tuple[ToolSpec, ...], persona: str = "Careful.") -> WorkingMemory:
    return WorkingMemory(
        mode=AgentMode.AUTONOMOUS,
        agent_name="Ada",
        persona=persona,
        objective="o",
        snapshot=MemorySnapshot(query="o"),
        action_space=specs,
    )


def spec(name: str, description: str, action_type: ActionType = ActionType.GROUNDING) -> ToolSpec:
    return ToolSpec(name=name, description=description, action_type=action_type)


def test_prompt_follows_the_action_space_and_the_persona() -> None:
    composer = PromptComposer()
    alpha, beta = spec("alpha", "first"), spec("beta", "second")
    text = composer.system_prompt(working_memory((alpha,)))
    assert "- alpha: first" in text and "beta" not in text
    assert composer.system_prompt(working_memory((alpha,))) == text

    both = composer.system_prompt(working_memory((alpha, beta)))
    assert "- alpha: first" in both and "- beta: second" in both

    reworded = composer.system_prompt(working_memory((spec("alpha", "changed"),)))
    assert "- alpha: changed" in reworded and "first" not in reworded

    regrouped = composer.system_prompt(
        working_memory((spec("alpha", "first", ActionType.RETRIEVAL),))
    )
    assert "RETRIEVAL (read memory or knowledge):\n- alpha: first" in regrouped

    other = composer.system_prompt(working_memory((alpha,), persona="Terse."))
    assert "You are Ada. Terse." in other and "Careful." not in other

    # Equal specs built separately render the same text as the first ones.
    assert composer.system_prompt(working_memory((spec("alpha", "first"),))) == text

    composer.show_action_space = False
    assert "Action space" not in composer.system_prompt(working_memory((alpha,)))
    composer.show_action_space = True
    assert composer.system_prompt(working_memory((alpha,))) == text


def test_cached_action_space_text_is_the_uncached_text() -> None:
    specs = (spec("alpha", "first"), spec("beta", "b", ActionType.LEARNING))
    wm = working_memory(specs)
    warm = PromptComposer()
    warm.system_prompt(wm)
    assert warm.system_prompt(wm) == PromptComposer().system_prompt(wm)


# The database's checkouts (``Database.connection``/``transaction``, one plain context
# manager instead of two generator-based ones) keep ``pool.connection()``'s behaviour.


async def _count(db: Database, org: str) -> int:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM organisations WHERE id = %s", (org,))
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def test_transaction_commits_rolls_back_and_always_returns_the_connection(
    db: Database, org: str
) -> None:
    pool = db._pool
    for _ in range(pool.max_size + 2):  # a leaked connection would exhaust the pool
        with pytest.raises(RuntimeError, match="boom"):
            async with db.transaction() as conn:
                await conn.execute("INSERT INTO organisations (id, name) VALUES (%s, '')", (org,))
                raise RuntimeError("boom")
    assert await _count(db, org) == 0

    async with db.transaction() as conn:  # a Rollback is swallowed, as by psycopg
        await conn.execute("INSERT INTO organisations (id, name) VALUES (%s, '')", (org,))
        raise psycopg.Rollback()
    assert await _count(db, org) == 0

    # A statement that fails inside the transaction raises, and the connection comes back
    # idle: the next checkout works.
    for _ in range(pool.max_size + 2):
        with pytest.raises(psycopg.errors.UndefinedTable):
            async with db.transaction() as conn:
                await conn.execute("SELECT * FROM no_such_table")
    async with db.transaction() as conn:
        await conn.execute("INSERT INTO organisations (id, name) VALUES (%s, '')", (org,))
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
    assert await _count(db, org) == 1
    async with db.connection() as conn:
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
        await conn.execute("DELETE FROM organisations WHERE id = %s", (org,))
    assert pool.get_stats()["pool_size"] <= pool.max_size


async def test_connection_returns_after_an_error(db: Database) -> None:
    for _ in range(db._pool.max_size + 2):
        with pytest.raises(psycopg.errors.UndefinedTable):
            async with db.connection() as conn:
                await conn.execute("SELECT * FROM no_such_table")
    async with db.connection() as conn:
        cur = await conn.execute("SELECT 1 AS one")
        assert await cur.fetchone() == {"one": 1}


def _reference_hash_embedding(text: str, dim: int) -> np.ndarray:
    """HashEmbedder's definition, word by word in float32 (its implementation before the
    per-bucket counts and the cached word hashes)."""
    out = np.zeros(dim, dtype=np.float32)
    for word in re.findall(r"\w+", text.lower()):
        value = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        out[value % dim] += 1.0 if (value >> 63) & 1 else -1.0
    norm = float(np.linalg.norm(out))
    if norm > 0:
        out /= norm
    return out


def test_hash_embedder_is_bit_for_bit_its_definition() -> None:
    texts = [
        "Step 4: current_time() [GROUNDING] → OK: {'utc': '2026-12-01T11:20:00+00:00'}",
        "the the the THE cat sat on the mat, the end",
        "",
        "  !!  ",
        "Ünïcode wörds und ÄÖÜ ß 1234 snake_case",
    ]
    for dim in (7, 384):
        embedder = HashEmbedder(dim)
        for _ in range(2):  # cold, then from the cached word hashes
            got = embedder.embed_sync(texts)
            for row, text in zip(got, texts, strict=True):
                assert row.tobytes() == _reference_hash_embedding(text, dim).tobytes()


def test_agent_principal_follows_the_agent() -> None:
    access = AccessControlService()
    ada = agent(("alpha",))
    first = access.principal_for(ada, None, AgentMode.AUTONOMOUS)
    assert first == ada.principal()
    assert access.principal_for(ada, None, AgentMode.AUTONOMOUS) == first
    regranted = ada.model_copy(update={"grant": Grant(tools=frozenset({"beta"}))})
    assert access.principal_for(regranted, None, AgentMode.AUTONOMOUS).grant == Grant(
        tools=frozenset({"beta"})
    )
    renamed = ada.model_copy(update={"name": "b"})
    assert access.principal_for(renamed, None, AgentMode.AUTONOMOUS).name == "b"
    alice = Principal(id="alice", org_id="acme")
    assert access.principal_for(ada, alice, AgentMode.INTERACTIVE) is alice


async def test_vectors_go_to_the_server_as_pgvector_sends_them(db: Database) -> None:
    from pgvector import Vector
    from psycopg.adapt import PyFormat

    async with db.connection() as conn:
        dumper = conn.adapters.get_dumper(np.ndarray, PyFormat.AUTO)(np.ndarray)
        rng = np.random.default_rng(7)
        for array in (
            rng.random(384).astype(np.float32),
            rng.random(384),  # float64: rounded to float32 as pgvector rounds it
            rng.random(768).astype(np.float32)[::2],  # not contiguous
            np.array([np.nan, np.inf, -0.0, 1e-45], dtype=np.float32),
        ):
            assert dumper.dump(array) == Vector(array).to_binary()
        with pytest.raises(ValueError, match="ndim"):
            dumper.dump(np.zeros((2, 2), dtype=np.float32))
        array = rng.random(384).astype(np.float32)
        cur = await conn.execute("SELECT %s::vector = %s::vector AS same", (array, Vector(array)))
        assert await cur.fetchone() == {"same": True}
