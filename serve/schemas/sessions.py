"""Sessions: open, converse (server-sent events), read turns, end."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import AfterValidator, Field

from cortex_ray import Session, SessionStatus, Turn
from cortex_ray.storage import SessionMessage, TurnRecord, TurnStatus
from serve.schemas._common import MAX_TEXT, JsonObject, Name, _Body, _clean, _Out
from serve.schemas._steps import ObservationBody
from serve.schemas.memory import MemoryBody

# sessions --------------------------------------------------------------------------------


class SessionCreate(_Body):
    agent_id: Name = Field(description="an INTERACTIVE agent's id (or its name)")


class SessionBody(_Out):
    id: UUID
    agent_id: UUID
    caller_id: str
    status: SessionStatus
    created_at: datetime
    ended_at: datetime | None


def from_session(session: Session) -> SessionBody:
    return SessionBody(
        id=session.id,
        agent_id=session.agent_id,
        caller_id=session.caller_id,
        status=session.status,
        created_at=session.created_at,
        ended_at=session.ended_at,
    )


class MessageCreate(_Body):
    message: Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(_clean)]


class TurnBody(_Out):
    role: Literal["user", "assistant", "tool"]
    content: str
    tool: str | None
    turn_id: UUID | None = Field(
        default=None, description="the turn the message belongs to (none: before turns)"
    )
    turn_status: TurnStatus | None = Field(
        default=None,
        description="the turn's status: ACCEPTED or RUNNING (only its user message is shown "
        "yet), DONE, FAILED",
    )
    refused: str | None = Field(
        default=None,
        description="on the user message of a turn that ended without a reply: why (the "
        "refusal, or the reason it FAILED)",
    )

    @classmethod
    def of(cls, turn: Turn) -> TurnBody:
        if isinstance(turn, SessionMessage):
            return cls(
                role=turn.role,
                content=turn.content,
                tool=turn.tool,
                turn_id=turn.turn_id,
                turn_status=turn.turn_status,
                refused=turn.refused,
            )
        return cls(role=turn.role, content=turn.content, tool=turn.tool)


class MessageList(_Out):
    session_id: UUID
    messages: list[TurnBody]


class TurnStarted(_Out):
    """SSE ``started``: the turn is accepted (recorded) and queued or running."""

    session_id: UUID
    turn_id: UUID = Field(
        description="reconnect with GET .../turns/{turnId}/events (Last-Event-ID) to read "
        "what was missed"
    )


class TurnStatusBody(_Out):
    """An accepted turn: where it is, and its outcome once it has ended."""

    id: UUID
    session_id: UUID
    ordinal: int = Field(description="its place among the session's turns (0-based)")
    status: TurnStatus
    message: str
    reply: str | None
    refused: str | None
    reason: str | None = Field(description="why it FAILED")
    attempts: int = Field(description="times a driver took it (a recovery adds one)")
    events: int = Field(description="events it emitted (stored once it has ended)")
    last_event_id: str | None = Field(
        description="the id of its last event once it has ended (its done or error event)"
    )
    accepted_at: datetime
    finished_at: datetime | None

    @classmethod
    def of(cls, turn: TurnRecord) -> TurnStatusBody:
        return cls(
            id=turn.id,
            session_id=turn.session_id,
            ordinal=turn.ordinal,
            status=turn.status,
            message=turn.message,
            reply=turn.reply,
            refused=turn.refused,
            reason=turn.reason,
            attempts=turn.attempts,
            events=len(turn.events),
            last_event_id=f"{turn.id}:{turn.last_seq + 1}" if turn.status.ended else None,
            accepted_at=turn.accepted_at,
            finished_at=turn.finished_at,
        )


class TurnToolCall(_Out):
    """SSE ``tool_call``: the agent chose a tool in this round; its ``observation`` follows."""

    round: int
    tool: str
    args: JsonObject


class TurnProgress(_Out):
    """SSE ``progress``: the round's call reported how far it got (an MCP server's progress
    notification); its ``observation`` follows."""

    round: int
    tool: str
    progress: float
    total: float | None = None
    message: str | None = None


class TurnApprovalRequired(_Out):
    """SSE ``approval_required``: the round's call needs a person's approval; the turn waits
    for the decision (``POST .../approvals/{approvalId}/decision``), then its ``observation``
    follows (refused when rejected or expired)."""

    round: int
    approval_id: UUID
    tool: str
    args: JsonObject
    reason: str
    approvers: list[str] = Field(description="who may decide; empty: any admin person")
    expires_at: datetime = Field(description="then the request expires: a rejection")


class TurnObservation(ObservationBody):
    """SSE ``observation``: what a tool call returned, as soon as it returned."""

    round: int


class TurnReply(_Out):
    """SSE ``reply``: the agent's answer, sent whole once the invocation gate passed it."""

    message: str


class TurnRefused(_Out):
    """SSE ``refused``: the turn ended without a reply, and why."""

    reason: str


class TurnError(_Out):
    """SSE ``error``: the turn failed; ``status`` is the HTTP status it maps to."""

    status: int
    code: str
    message: str
    correlation_id: str = Field(description="where the server log has the detail")


class TurnDone(_Out):
    """SSE ``done``: the turn's outcome, after every other event of the turn."""

    session_id: UUID
    reply: str | None
    refused: str | None
    observations: int


class SessionEnded(_Out):
    session: SessionBody
    facts: list[MemoryBody] = Field(description="semantic facts the extraction pass wrote")
