"""What the turn store reads and returns: a turn's row, its status, its lease and claim,
the events it stored, and the conversation's messages as a person reads them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from cortex_ray._exceptions import LeaseLost, NotFoundError
from cortex_ray._types import Turn, TurnEvent, TurnEventKind, TurnResult
from cortex_ray.storage._database import Conn

__all__ = [
    "SessionMessage",
    "StoredTurnEvent",
    "TurnClaim",
    "TurnLease",
    "TurnLeaseLostError",
    "TurnRecord",
    "TurnRef",
    "TurnStatus",
    "lock_session",
    "turn_of",
]


class TurnStatus(StrEnum):
    """Where an accepted turn is: waiting, being driven, or ended (with a reply or refusal,
    or failed with the reason)."""

    ACCEPTED = "ACCEPTED"
    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"

    @property
    def ended(self) -> bool:
        return self in (TurnStatus.DONE, TurnStatus.FAILED)


class TurnLeaseLostError(LeaseLost):
    """A turn's lease was taken over (it expired) or the turn ended: this driver's outcome
    is not recorded; the new holder's is."""


class StoredTurnEvent(BaseModel):
    """One event a turn emitted, with its sequence number in the turn (1, 2, ...; 0 is the
    ``started`` event the API sends before any of them)."""

    model_config = ConfigDict(frozen=True)

    seq: int
    event: TurnEvent


class TurnRecord(BaseModel):
    """One ``session_turns`` row."""

    model_config = ConfigDict(frozen=True)

    id: UUID
    org_id: str
    session_id: UUID
    ordinal: int
    caller_id: str
    message: str
    status: TurnStatus
    reply: str | None = None
    refused: str | None = None
    reason: str | None = None
    events: tuple[StoredTurnEvent, ...] = ()
    attempts: int = 0
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    accepted_at: datetime
    finished_at: datetime | None = None
    trace_parent: str | None = None
    """The W3C ``traceparent`` the turn was accepted under: its driver's spans join it."""

    def result(self) -> TurnResult:
        """The ``TurnResult`` of an ended turn, rebuilt from what it stored."""
        observations = tuple(
            e.event.observation
            for e in self.events
            if e.event.kind is TurnEventKind.OBSERVATION and e.event.observation is not None
        )
        refused = self.refused
        if self.reply is None and refused is None:
            refused = self.reason or "no reply"
        return TurnResult(
            session_id=self.session_id,
            reply=self.reply,
            observations=observations,
            refused=refused,
        )

    @property
    def last_seq(self) -> int:
        """The sequence number of the turn's last stored event (0: none)."""
        return self.events[-1].seq if self.events else 0


@dataclass(frozen=True, slots=True)
class TurnRef:
    """Where a turn is: organisation, session, turn."""

    org_id: str
    session_id: UUID
    turn_id: UUID


@dataclass(frozen=True, slots=True)
class TurnLease:
    """A driver's hold on a RUNNING turn: its owner and fencing token."""

    turn: TurnRecord
    owner: str
    token: int

    def idempotency_key(self, round_index: int) -> str:
        """The key of a tool call in round ``round_index`` of this turn (same on every
        attempt, so an idempotent tool does not repeat its effect)."""
        return f"turn:{self.turn.id}:{round_index}"


@dataclass(frozen=True, slots=True)
class TurnClaim:
    """What ``claim`` found: the lease (``claimed``), the ended turn (``ended``), or that it
    must wait for an earlier turn or a live holder (``wait``)."""

    outcome: Literal["claimed", "ended", "wait"]
    turn: TurnRecord
    lease: TurnLease | None = None


class SessionMessage(Turn):
    """A message of the conversation as a person reads it: with its turn, the turn's status
    and, for a turn that ended without a reply, why."""

    turn_id: UUID | None = None
    turn_status: TurnStatus | None = None
    refused: str | None = None


def turn_of(row: dict[str, Any]) -> TurnRecord:
    return TurnRecord(
        id=row["id"],
        org_id=row["org_id"],
        session_id=row["session_id"],
        ordinal=row["ordinal"],
        caller_id=row["caller_id"],
        message=row["message"],
        status=TurnStatus(row["status"]),
        reply=row["reply"],
        refused=row["refused"],
        reason=row["reason"],
        events=tuple(StoredTurnEvent.model_validate(e) for e in row["events"] or ()),
        attempts=row["attempts"],
        lease_owner=row["lease_owner"],
        lease_expires_at=row["lease_expires_at"],
        accepted_at=row["accepted_at"],
        finished_at=row["finished_at"],
        trace_parent=row.get("trace_parent"),
    )


async def lock_session(conn: Conn, org_id: str, session_id: UUID) -> dict[str, Any]:
    cur = await conn.execute(
        "SELECT status, caller_id FROM sessions WHERE org_id = %s AND id = %s FOR UPDATE",
        (org_id, session_id),
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFoundError(f"session {session_id} not found in organisation {org_id!r}")
    return row
