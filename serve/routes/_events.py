"""A turn's events as server-sent events: ``started``, ``tool_call``, ``approval_required``,
``progress``, ``observation``, ``reply`` or ``refused``, then ``done`` or ``error``; each
with the id ``<turnId>:<seq>`` a client reconnects with (``Last-Event-ID``)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from fastapi.sse import ServerSentEvent

from cortex_ray import TurnEvent, TurnEventKind, TurnResult
from serve._errors import report
from serve.schemas import TurnDone, TurnError, from_observation
from serve.schemas.sessions import (
    TurnApprovalRequired,
    TurnObservation,
    TurnProgress,
    TurnRefused,
    TurnReply,
    TurnToolCall,
)

__all__ = ["sse", "sse_id", "turn_done", "turn_error", "turn_event"]


def sse_id(turn_id: UUID, seq: int) -> str:
    """The id of a turn's event ``seq``: ``<turnId>:<seq>`` (``started`` is 0)."""
    return f"{turn_id}:{seq}"


def sse(event: str, body: Any, *, event_id: str | None = None) -> ServerSentEvent:
    """One event, its body as camelCase JSON."""
    data = body.model_dump(mode="json", by_alias=True) if hasattr(body, "model_dump") else body
    return ServerSentEvent(event=event, data=data, id=event_id)


def turn_event(event: TurnEvent, *, event_id: str | None = None) -> ServerSentEvent:
    """A turn's event as it happened (or as stored, on a replay)."""
    if event.kind is TurnEventKind.TOOL_CALL:
        return sse(
            "tool_call",
            TurnToolCall(round=event.round, tool=event.tool or "", args=event.args or {}),
            event_id=event_id,
        )
    if (
        event.kind is TurnEventKind.APPROVAL_REQUIRED
        and event.approval_id is not None
        and event.expires_at is not None
    ):
        asked = TurnApprovalRequired(
            round=event.round,
            approval_id=event.approval_id,
            tool=event.tool or "",
            args=event.args or {},
            reason=event.text or "",
            approvers=list(event.approvers or ()),
            expires_at=event.expires_at,
        )
        return sse("approval_required", asked, event_id=event_id)
    if event.kind is TurnEventKind.PROGRESS:
        done = TurnProgress(
            round=event.round,
            tool=event.tool or "",
            progress=event.progress or 0.0,
            total=event.total,
            message=event.text,
        )
        return sse("progress", done, event_id=event_id)
    if event.kind is TurnEventKind.OBSERVATION and event.observation is not None:
        body = from_observation(event.observation).model_dump()
        return sse("observation", TurnObservation(round=event.round, **body), event_id=event_id)
    if event.kind is TurnEventKind.REPLY:
        return sse("reply", TurnReply(message=event.text or ""), event_id=event_id)
    return sse("refused", TurnRefused(reason=event.text or "no reply"), event_id=event_id)


def turn_done(session_id: UUID, result: TurnResult, *, event_id: str) -> ServerSentEvent:
    """The last event of a turn that ended: ``done``."""
    body = TurnDone(
        session_id=session_id,
        reply=result.reply,
        refused=result.refused,
        observations=len(result.observations),
    )
    return sse("done", body, event_id=event_id)


def turn_error(exc: BaseException, what: str, *, event_id: str) -> ServerSentEvent:
    """The last event of a turn that failed: ``error``."""
    # The stream has started (200): the refusal travels as an event with the status the
    # request would otherwise have got.
    problem = report(exc, what=what)
    error = TurnError(
        status=problem.status,
        code=problem.code,
        message=problem.message,
        correlation_id=problem.correlation_id,
    )
    return sse("error", error, event_id=event_id)
