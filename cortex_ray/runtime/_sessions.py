"""Sessions as use cases: open a conversation, admit its turns, read it, its turns'
traces and diagnostics, and admit its end. Driving a turn is the executor seam's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol
from uuid import UUID

from cortex_ray._exceptions import ConflictError, InvalidRequestError
from cortex_ray._types import AgentMode, Principal, Session, SessionStatus
from cortex_ray.access import UseCase
from cortex_ray.observability import RunTrace, metrics
from cortex_ray.observability.diagnostics import Diagnosis
from cortex_ray.runtime._admission import Admission
from cortex_ray.runtime._execution import follow_turn, wait_for_turn
from cortex_ray.runtime._gate import UseCaseGate
from cortex_ray.runtime._traces import Traces
from cortex_ray.settings import Settings
from cortex_ray.storage import (
    PrincipalStore,
    SessionMessage,
    SessionStore,
    StoredTurnEvent,
    TraceReader,
    TurnLog,
    TurnRecord,
)

__all__ = ["SessionUseCases", "SessionsStore"]


class SessionsStore(PrincipalStore, SessionStore, TraceReader, Protocol):
    """What the session use cases read and write: the caller, sessions, their traces and
    diagnostics (the turns are the ``TurnLog``'s)."""


class SessionUseCases:
    """Conversations with INTERACTIVE agents (``Runtime.open_session``, ``accept_turn``,
    ...)."""

    def __init__(
        self,
        gate: UseCaseGate,
        store: SessionsStore,
        turns: TurnLog,
        settings: Settings,
        traces: Traces,
        admission: Admission | None = None,
    ) -> None:
        self.gate = gate
        self.store = store
        self.turns = turns
        self.settings = settings
        self.traces = traces
        self.admission = admission

    async def open_session(self, org_id: str, agent_ref: UUID | str, caller: Principal) -> Session:
        """Open a conversation between ``caller`` and an INTERACTIVE agent."""
        caller, agent = await self.gate.agent_for(caller, UseCase.SESSIONS_OPEN, org_id, agent_ref)
        if agent.mode is not AgentMode.INTERACTIVE:
            raise InvalidRequestError(
                f"agent {agent.name!r} is {agent.mode.value}; set its mode to INTERACTIVE "
                "to talk with it"
            )
        await self.store.put_principal(caller)
        session = await self.store.create_session(
            Session(org_id=org_id, agent_id=agent.id, caller_id=caller.id)
        )
        await self.gate.audited(
            caller, UseCase.SESSIONS_OPEN, org_id, agent=agent, session_id=session.id
        )
        return session

    async def get_session(
        self, org_id: str, session_id: UUID, *, principal: Principal | None = None
    ) -> Session:
        """A session (its caller, or an admin)."""
        _, session = await self.gate.session_for(
            principal, UseCase.SESSIONS_READ, org_id, session_id
        )
        return session

    async def conversation(
        self, org_id: str, session_id: UUID, *, principal: Principal | None = None
    ) -> list[SessionMessage]:
        """The conversation so far (its caller, or an admin): the messages of ended turns in
        order, then the user message of each accepted turn not ended yet, by arrival; each
        with its turn's id and status (and, for a turn that ended without a reply, why)."""
        await self.gate.session_for(principal, UseCase.SESSIONS_READ, org_id, session_id)
        return await self.turns.history(org_id, session_id)

    async def accept_turn(
        self, org_id: str, session_id: UUID, message: str, *, principal: Principal
    ) -> TurnRecord:
        """Admit a message and record it as the session's next turn (ACCEPTED), before any
        reply: from here the turn is durable, and it ends by ``sessions.turn_deadline_s``.
        Only the session's own caller, only while it is open, only while the models can
        hold more work (``Admission``); an executor then drives it (``Executor.turn`` with
        its id).

        Raises:
            ConflictError: The session has ended, or it already holds
                ``sessions.max_pending_turns`` turns not ended (busy: try again later).
            OverloadedError: At capacity (``runs.max_in_progress``, or the served model's
                lines): nothing recorded, try again after its ``retry_after_s``.
            InvalidRequestError: The message is empty.
        """
        try:
            session = await self.authorize_turn(org_id, session_id, principal)
            if self.admission is not None:
                await self.admission.admit(org_id, "turn")
            return await self.turns.accept(
                org_id,
                session.id,
                principal.id,
                message,
                max_pending=self.settings.sessions.max_pending_turns,
            )
        except ConflictError as exc:
            reason = "ended" if "has ended" in str(exc) else "busy"
            metrics.record(metrics.TURNS_REJECTED, org=org_id, reason=reason)
            raise

    async def get_turn(
        self,
        org_id: str,
        session_id: UUID,
        turn_id: UUID,
        *,
        principal: Principal | None = None,
        wait_s: float = 0.0,
    ) -> TurnRecord:
        """An accepted turn: its status, reply or refusal, and the events it emitted (the
        session's caller, or an admin, as reading the session). ``wait_s`` > 0 waits up to
        that long for a turn not ended yet to end."""
        await self.gate.session_for(principal, UseCase.SESSIONS_READ, org_id, session_id)
        turn = await self.turns.get(org_id, session_id, turn_id)
        if turn.status.ended or wait_s <= 0:
            return turn
        return await wait_for_turn(self.turns, org_id, session_id, turn_id, wait_s)

    async def follow_turn(
        self,
        org_id: str,
        session_id: UUID,
        turn_id: UUID,
        *,
        after: int = 0,
        principal: Principal | None = None,
    ) -> AsyncIterator[StoredTurnEvent | TurnRecord]:
        """Follow an accepted turn live (the session's caller, or an admin, as reading the
        session): its events after sequence number ``after`` as they are stored, then the
        turn once it has ended; or, after ``sessions.turn_replay_wait_s`` without an event,
        the turn as it stands, not ended (follow again). Refusals are raised here, before
        anything is followed.

        Raises:
            NotFoundError: No such session or turn in the organisation.
        """
        await self.gate.session_for(principal, UseCase.SESSIONS_READ, org_id, session_id)
        turn = await self.turns.get(org_id, session_id, turn_id)
        return follow_turn(
            self.turns, turn, after=after, idle_s=self.settings.sessions.turn_replay_wait_s
        )

    async def turn_trace(
        self,
        org_id: str,
        session_id: UUID,
        turn_id: UUID,
        *,
        principal: Principal | None = None,
    ) -> RunTrace:
        """The locally kept trace a turn belongs to (the request's it was accepted in, with
        the turn's ``invoke_agent`` tree wherever it was driven), as reading the session.
        Empty for a turn accepted without tracing, or when spans go only to a collector.

        Raises:
            NotFoundError: No such session or turn in the organisation.
        """
        await self.gate.session_for(principal, UseCase.SESSIONS_READ, org_id, session_id)
        turn = await self.turns.get(org_id, session_id, turn_id)
        parts = (turn.trace_parent or "").split("-")
        if len(parts) < 2:
            return RunTrace.of(turn_id, [])
        await self.traces.flush()
        return RunTrace.of(turn_id, await self.store.spans_of_trace(org_id, parts[1]))

    async def turn_diagnostics(
        self,
        org_id: str,
        session_id: UUID,
        turn_id: UUID,
        *,
        principal: Principal | None = None,
    ) -> Diagnosis:
        """A turn's diagnostic timeline, as reading the session (its caller, or an admin).

        Raises:
            NotFoundError: No such session or turn in the organisation.
        """
        await self.gate.session_for(principal, UseCase.SESSIONS_READ, org_id, session_id)
        turn = await self.turns.get(org_id, session_id, turn_id)
        events = await self.store.diagnostics(org_id, session_id=session_id, turn_id=turn_id)
        return Diagnosis.of(turn.id, turn.status.value, events)

    async def authorize_turn(self, org_id: str, session_id: UUID, principal: Principal) -> Session:
        """Admit a message: only the session's own caller, only while it is open
        (``ConflictError`` once it ended). The turn itself runs in an executor."""
        _, session = await self.gate.session_for(
            principal, UseCase.SESSIONS_MESSAGE, org_id, session_id
        )
        if session.status is not SessionStatus.OPEN:
            raise ConflictError(f"session {session_id} has ended")
        return session

    async def authorize_end_session(
        self, org_id: str, session_id: UUID, *, principal: Principal | None = None
    ) -> Session:
        """Admit ending a session (its caller, or an admin); the executor then ends it.

        A session that already ended is returned as it is (status ENDED) and nothing is
        written: the caller answers with it and wakes no executor (ending is idempotent)."""
        caller, session = await self.gate.session_for(
            principal, UseCase.SESSIONS_END, org_id, session_id
        )
        if session.status is SessionStatus.OPEN:
            await self.gate.audited(caller, UseCase.SESSIONS_END, org_id, session_id=session_id)
        return session
