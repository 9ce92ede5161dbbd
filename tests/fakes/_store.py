"""``FakeStore``: every fake domain in one object, as ``Store`` is one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fakes._runs import Runs
from fakes._uow import FakeDatabase, FakeTransaction

__all__ = ["FakeStore"]


class FakeStore(Runs):
    """Organisations, principals, agents, runs, sessions, API keys and audit, in memory."""


if TYPE_CHECKING:
    from cortex_ray.storage import (
        AgentStore,
        ApiKeyStore,
        AuditLog,
        ConversationLog,
        PrincipalStore,
        RunStore,
        SessionStore,
        TraceReader,
        TurnLog,
        UnitOfWork,
    )

    def _fakes_satisfy_the_protocols(store: FakeStore, db: FakeDatabase) -> None:
        """Never called: mypy checks that the fakes are the protocols the real store is."""
        uow: UnitOfWork[FakeTransaction] = db
        audit: AuditLog[FakeTransaction] = store
        principals: PrincipalStore = store
        agents: AgentStore = store
        runs: RunStore = store
        sessions: SessionStore = store
        keys: ApiKeyStore = store
        traces: TraceReader = store
        conversations: ConversationLog = store
        turns: TurnLog = store
        del uow, audit, principals, agents, runs, sessions, keys, traces, conversations, turns
