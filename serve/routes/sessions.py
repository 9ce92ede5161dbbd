"""Sessions: open, read, converse (each turn's events as server-sent events), read a turn,
its diagnostics and trace, replay its events, end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Header, Query
from fastapi.sse import EventSourceResponse, ServerSentEvent

from cortex_ray import ConflictError, SessionStatus, TurnEvent, TurnResult, events_until
from cortex_ray.storage import StoredTurnEvent, TurnRecord, TurnStatus
from serve._deps import MAX_WAIT_S, MemberDep, OrgPath, StateDep, org_router
from serve._errors import ApiProblem
from serve.routes._events import sse, sse_id, turn_done, turn_error, turn_event
from serve.schemas import ApiError, DiagnosticsBody, TurnTrace
from serve.schemas.memory import MemoryBody
from serve.schemas.sessions import (
    MessageCreate,
    MessageList,
    SessionBody,
    SessionCreate,
    SessionEnded,
    TurnBody,
    TurnStarted,
    TurnStatusBody,
    from_session,
)

__all__ = ["sessions_router"]


@dataclass(frozen=True, slots=True)
class _StartedTurn:
    turn: TurnRecord
    running: asyncio.Future[TurnResult]
    events: asyncio.Queue[TurnEvent]


async def _started_turn(
    state: StateDep, org: OrgPath, session_id: UUID, principal: MemberDep, body: MessageCreate
) -> _StartedTurn:
    """The message recorded as the session's next turn (the caller's own session, still
    open, not busy) and handed to the executor, before the event stream starts: a refusal is
    an ordinary JSON error response, and a client that goes away at once loses nothing."""
    turn = await state.runtime.accept_turn(org, session_id, body.message, principal=principal)
    events: asyncio.Queue[TurnEvent] = asyncio.Queue()
    running = asyncio.ensure_future(
        state.executor.turn(
            org,
            turn.session_id,
            principal,
            turn.message,
            turn_id=turn.id,
            on_event=events.put_nowait,
        )
    )
    state.keep(running)
    return _StartedTurn(turn, running, events)


def _last_seen(
    turn_id: UUID,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            max_length=100,
            description="the id of the last event the client has (`<turnId>:<seq>`)",
        ),
    ] = None,
    after: Annotated[
        int | None,
        Query(ge=0, le=1_000_000, description="replay the events after this sequence number"),
    ] = None,
) -> int:
    """The sequence number of the last event the client has; -1: none (replay from
    ``started``)."""
    if last_event_id is not None and last_event_id.strip():
        turn_part, _, seq = last_event_id.strip().rpartition(":")
        if turn_part != str(turn_id) or not seq.isdigit():
            raise ApiProblem(422, f"Last-Event-ID must be '{turn_id}:<seq>'")
        return int(seq)
    return -1 if after is None else after


@dataclass(frozen=True, slots=True)
class _Following:
    session_id: UUID
    turn_id: UUID
    seen: int
    events: AsyncIterator[StoredTurnEvent | TurnRecord]


async def _following(
    state: StateDep,
    org: OrgPath,
    principal: MemberDep,
    session_id: UUID,
    turn_id: UUID,
    seen: Annotated[int, Depends(_last_seen)],
) -> _Following:
    """The turn followed from the client's last event (a refusal, an unknown turn: an
    ordinary JSON error before the stream starts)."""
    events = await state.runtime.follow_turn(
        org, session_id, turn_id, after=max(seen, 0), principal=principal
    )
    return _Following(session_id, turn_id, seen, events)


def sessions_router() -> APIRouter:
    """Sessions and their turns."""
    router = org_router()

    @router.post("/sessions", response_model=SessionBody, status_code=201, tags=["sessions"])
    async def create_session(
        state: StateDep, org: OrgPath, principal: MemberDep, body: SessionCreate
    ) -> SessionBody:
        """Open a conversation between the caller and an INTERACTIVE agent."""
        session = await state.runtime.open_session(org, body.agent_id, principal)
        return from_session(session)

    @router.get(
        "/sessions/{session_id}",
        response_model=SessionBody,
        tags=["sessions"],
        responses={403: {"model": ApiError, "description": "another caller's session"}},
    )
    async def get_session(
        state: StateDep, org: OrgPath, principal: MemberDep, session_id: UUID
    ) -> SessionBody:
        """A session (its caller, or an admin)."""
        return from_session(await state.runtime.get_session(org, session_id, principal=principal))

    @router.get(
        "/sessions/{session_id}/messages",
        response_model=MessageList,
        tags=["sessions"],
        responses={403: {"model": ApiError, "description": "another caller's session"}},
    )
    async def list_messages(
        state: StateDep, org: OrgPath, principal: MemberDep, session_id: UUID
    ) -> MessageList:
        """The conversation so far (its caller, or an admin)."""
        turns = await state.runtime.conversation(org, session_id, principal=principal)
        return MessageList(session_id=session_id, messages=[TurnBody.of(t) for t in turns])

    @router.post(
        "/sessions/{session_id}/messages",
        response_class=EventSourceResponse,
        tags=["sessions"],
        responses={
            200: {
                "description": "Server-sent events, each as it happens: `started`; per tool "
                "round a `tool_call` and its `observation`; then `reply` (sent whole, after "
                "the invocation gate passed it) or `refused`; then `done` (or `error`)."
            },
            403: {"model": ApiError, "description": "another caller's session"},
            409: {
                "model": ApiError,
                "description": "the session has ended, or is busy (its queue of turns is full)",
            },
        },
    )
    async def post_message(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        started_turn: Annotated[_StartedTurn, Depends(_started_turn)],
    ) -> AsyncIterator[ServerSentEvent]:
        """Send a message; the turn's events come back as server-sent events, each with an
        id ``<turnId>:<seq>`` (``started`` is 0).

        The message is recorded (the turn accepted) before the stream starts; turns of one
        session run one at a time, in arrival order. The turn runs to its end even if the
        client disconnects: its messages are then in the history, and
        ``GET .../turns/{turnId}/events`` with ``Last-Event-ID`` replays what was missed."""
        turn, running, events = started_turn.turn, started_turn.running, started_turn.events
        started = TurnStarted(session_id=turn.session_id, turn_id=turn.id)
        yield sse("started", started, event_id=sse_id(turn.id, 0))
        seq = 0
        async for event in events_until(running, events):
            seq += 1
            yield turn_event(event, event_id=sse_id(turn.id, seq))
        end_id = sse_id(turn.id, seq + 1)
        try:
            result = running.result()
        except Exception as exc:
            yield turn_error(exc, f"turn {turn.id} of session {turn.session_id}", event_id=end_id)
            return
        yield turn_done(turn.session_id, result, event_id=end_id)

    @router.get(
        "/sessions/{session_id}/turns/{turn_id}",
        response_model=TurnStatusBody,
        tags=["sessions"],
        responses={403: {"model": ApiError, "description": "another caller's session"}},
    )
    async def get_turn(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        session_id: UUID,
        turn_id: UUID,
        wait: Annotated[
            float,
            Query(
                ge=0,
                le=MAX_WAIT_S,
                description="seconds to wait for a turn not ended yet to end before answering",
            ),
        ] = 0,
    ) -> TurnStatusBody:
        """An accepted turn (its session's caller, or an admin): ACCEPTED, RUNNING, DONE or
        FAILED, with its reply or refusal (or why it failed) once it has ended."""
        turn = await state.runtime.get_turn(
            org, session_id, turn_id, principal=principal, wait_s=wait
        )
        return TurnStatusBody.of(turn)

    @router.get(
        "/sessions/{session_id}/turns/{turn_id}/diagnostics",
        response_model=DiagnosticsBody,
        tags=["sessions"],
        responses={403: {"model": ApiError, "description": "another caller's session"}},
    )
    async def get_turn_diagnostics(
        state: StateDep, org: OrgPath, principal: MemberDep, session_id: UUID, turn_id: UUID
    ) -> DiagnosticsBody:
        """A turn's diagnostic timeline (its session's caller, or an admin)."""
        found = await state.runtime.turn_diagnostics(org, session_id, turn_id, principal=principal)
        return DiagnosticsBody.of(found)

    @router.get(
        "/sessions/{session_id}/turns/{turn_id}/trace",
        response_model=TurnTrace,
        tags=["sessions"],
        responses={403: {"model": ApiError, "description": "another caller's session"}},
    )
    async def get_turn_trace(
        state: StateDep, org: OrgPath, principal: MemberDep, session_id: UUID, turn_id: UUID
    ) -> TurnTrace:
        """The trace a turn belongs to (its session's caller, or an admin): the request it
        was accepted in, then ``invoke_agent`` → tool rounds → ``chat`` and tool spans,
        wherever the turn was driven (a session actor, a recovery)."""
        return TurnTrace.of(
            await state.runtime.turn_trace(org, session_id, turn_id, principal=principal)
        )

    @router.get(
        "/sessions/{session_id}/turns/{turn_id}/events",
        response_class=EventSourceResponse,
        tags=["sessions"],
        responses={
            200: {
                "description": "The turn's events after `Last-Event-ID` (or `after`; neither: "
                "from `started`), with the same ids as on the first stream, each as soon as "
                "the turn's driver has stored it (a running turn is followed live), then "
                "`done` (or `error` for a turn that FAILED). If no event comes for the "
                "server's `sessions.turn_replay_wait_s`, the stream ends with one `pending` "
                "event (the turn's status): reconnect with the last id."
            },
            403: {"model": ApiError, "description": "another caller's session"},
            422: {"model": ApiError, "description": "a Last-Event-ID of another turn"},
        },
    )
    async def turn_events(
        following: Annotated[_Following, Depends(_following)],
    ) -> AsyncIterator[ServerSentEvent]:
        """Reconnect to a turn: replay the events a client missed, then follow it live."""
        session_id, turn_id, seen = following.session_id, following.turn_id, following.seen
        if seen < 0:
            started = TurnStarted(session_id=session_id, turn_id=turn_id)
            yield sse("started", started, event_id=sse_id(turn_id, 0))
        turn: TurnRecord | None = None
        async for item in following.events:
            if isinstance(item, TurnRecord):
                turn = item
            else:
                yield turn_event(item.event, event_id=sse_id(turn_id, item.seq))
        assert turn is not None  # follow_turn always ends with the turn
        if not turn.status.ended:
            yield sse("pending", TurnStatusBody.of(turn))
            return
        end_seq = turn.last_seq + 1
        if seen >= end_seq:
            return
        end_id = sse_id(turn_id, end_seq)
        if turn.status is TurnStatus.FAILED:
            failed = ConflictError(turn.reason or "the turn failed")
            yield turn_error(failed, f"replay of turn {turn_id}", event_id=end_id)
            return
        yield turn_done(session_id, turn.result(), event_id=end_id)

    @router.post(
        "/sessions/{session_id}/end",
        response_model=SessionEnded,
        tags=["sessions"],
        responses={403: {"model": ApiError, "description": "another caller's session"}},
    )
    async def end_session(
        state: StateDep, org: OrgPath, principal: MemberDep, session_id: UUID
    ) -> SessionEnded:
        """End a session (its caller, or an admin); the extraction pass writes facts.
        Ending an ended session changes nothing: it answers at once with the session as it
        is (and no facts), without waking its actor."""
        session = await state.runtime.authorize_end_session(org, session_id, principal=principal)
        if session.status is SessionStatus.ENDED:
            return SessionEnded(session=from_session(session), facts=[])
        facts = await state.executor.end_session(org, session_id)
        session = await state.runtime.get_session(org, session_id, principal=principal)
        return SessionEnded(session=from_session(session), facts=[MemoryBody.of(f) for f in facts])

    return router
