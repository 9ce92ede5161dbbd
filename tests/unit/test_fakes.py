"""What the fakes promise beyond the store contract: a unit of work a test can watch."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
from fakes import FakeDatabase, FakeStore

from cortex_ray._types import ActionType, Principal
from cortex_ray.storage import (
    AgentStore,
    ApiKeyStore,
    AuditEntry,
    AuditLog,
    ConversationLog,
    Database,
    PrincipalStore,
    RunStore,
    SessionStore,
    Store,
    TraceReader,
    TurnLog,
    TurnStore,
    UnitOfWork,
)


def _entry(org: str, tool: str) -> AuditEntry:
    return AuditEntry(
        org_id=org,
        principal_id="alice",
        tool=tool,
        action_type=ActionType.LEARNING,
        status="OK",
        reason=None,
        args={},
        duration_ms=0.0,
    )


_REAL: dict[type, type] = {
    AgentStore: Store,
    ApiKeyStore: Store,
    AuditLog: Store,
    ConversationLog: TurnStore,
    PrincipalStore: Store,
    RunStore: Store,
    SessionStore: Store,
    TraceReader: Store,
    TurnLog: TurnStore,
    UnitOfWork: Database,
}
"""Each protocol and the class that implements it in production."""


def _shape(function: Callable[..., object]) -> list[tuple[str, object, object]]:
    """A signature's parameters as a caller sees them (the handle's type aside)."""
    parameters = inspect.signature(function).parameters.values()
    return [(p.name, p.kind, p.default) for p in parameters if p.name != "self"]


@pytest.mark.parametrize("protocol", list(_REAL), ids=lambda p: p.__name__)
def test_each_method_is_called_alike_on_the_protocol_the_store_and_the_fake(
    protocol: type,
) -> None:
    real = _REAL[protocol]
    fake = FakeDatabase if protocol is UnitOfWork else FakeStore
    methods = [n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")]
    assert methods
    for name in methods:
        wanted = _shape(getattr(protocol, name))
        assert _shape(getattr(real, name)) == wanted, (real.__name__, name)
        assert _shape(getattr(fake, name)) == wanted, (fake.__name__, name)


async def test_writes_are_seen_only_once_their_transaction_commits(
    fake_db: FakeDatabase, fake_store: FakeStore
) -> None:
    async with fake_db.transaction() as conn:
        await fake_store.insert_audit(conn, _entry("acme", "agents.create"))
        assert fake_store.audit == []
    assert [r["tool"] for r in fake_store.audit] == ["agents.create"]
    assert (fake_db.commits, fake_db.rollbacks) == (1, 0)


async def test_an_error_rolls_the_transaction_back(
    fake_db: FakeDatabase, fake_store: FakeStore
) -> None:
    with pytest.raises(ValueError, match="refused"):
        async with fake_db.transaction() as conn:
            await fake_store.insert_audit(conn, _entry("acme", "agents.update"))
            raise ValueError("refused")
    assert fake_store.audit == []
    assert (fake_db.commits, fake_db.rollbacks) == (0, 1)


async def test_a_handle_is_dead_once_its_transaction_ended(
    fake_db: FakeDatabase, fake_store: FakeStore
) -> None:
    async with fake_db.transaction() as conn:
        pass
    with pytest.raises(RuntimeError, match="ended"):
        await fake_store.insert_audit(conn, _entry("acme", "late"))


async def test_keys_are_kept_as_hashes_only(fake_store: FakeStore) -> None:
    key, key_id = await fake_store.create_api_key(Principal(id="ci", org_id="acme"))
    stored = fake_store.api_keys["acme", key_id]
    assert key.encode() != stored.key_hash and key not in repr(vars(fake_store))
