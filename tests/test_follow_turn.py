"""Following a turn (``cortex_ray.runtime._execution.follow_turn``) on a scripted store: each
stored event once and in order as the driver stores it, then the ended turn; the turn as it
stands after a quiet spell; a new attempt's events after those already sent."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from cortex_ray import TurnEvent, TurnEventKind
from cortex_ray.runtime._execution import follow_turn
from cortex_ray.storage import StoredTurnEvent, TurnRecord, TurnStatus

pytestmark = pytest.mark.unit

KINDS = [TurnEventKind.TOOL_CALL, TurnEventKind.OBSERVATION, TurnEventKind.REPLY]


def record(status: TurnStatus, kinds: list[TurnEventKind], attempts: int = 1) -> TurnRecord:
    return TurnRecord(
        id=uuid.UUID(int=1),
        org_id="acme",
        session_id=uuid.UUID(int=2),
        ordinal=0,
        caller_id="ada",
        message="hi",
        status=status,
        reply="hello" if status is TurnStatus.DONE else None,
        events=tuple(
            StoredTurnEvent(seq=i, event=TurnEvent(kind=k, round=0, text=f"{k.value} {attempts}"))
            for i, k in enumerate(kinds, start=1)
        ),
        attempts=attempts,
        accepted_at=datetime(2026, 12, 3, tzinfo=UTC),
    )


class Scripted:
    """A turn log whose ``get`` answers the next scripted row (the last one from then on)."""

    def __init__(self, rows: list[TurnRecord]) -> None:
        self.rows = rows
        self.reads = 0

    async def get(self, org_id: str, session_id: uuid.UUID, turn_id: uuid.UUID) -> TurnRecord:
        self.reads += 1
        return self.rows[min(self.reads, len(self.rows) - 1)]

    async def accept(self, *args: Any, **kwargs: Any) -> TurnRecord:
        raise NotImplementedError

    async def status(self, *args: Any) -> TurnStatus:
        raise NotImplementedError

    async def history(self, *args: Any) -> list[Any]:
        raise NotImplementedError


async def followed(rows: list[TurnRecord], after: int, idle_s: float = 5.0) -> list[Any]:
    return [item async for item in follow_turn(Scripted(rows), rows[0], after=after, idle_s=idle_s)]


def shown(items: list[Any]) -> list[Any]:
    return [
        (i.seq, i.event.text) if isinstance(i, StoredTurnEvent) else i.status.value for i in items
    ]


async def test_events_come_once_each_in_order_as_they_are_stored_then_the_end() -> None:
    rows = [
        record(TurnStatus.RUNNING, []),
        record(TurnStatus.RUNNING, KINDS[:1]),
        record(TurnStatus.RUNNING, KINDS[:1]),
        record(TurnStatus.RUNNING, KINDS[:2]),
        record(TurnStatus.DONE, KINDS),
    ]
    assert shown(await followed(rows, after=0)) == [
        (1, "tool_call 1"),
        (2, "observation 1"),
        (3, "reply 1"),
        "DONE",
    ]
    # From the client's last event on: nothing it has is sent again.
    assert shown(await followed(rows, after=2)) == [(3, "reply 1"), "DONE"]
    assert shown(await followed(rows[-1:], after=3)) == ["DONE"]


async def test_a_quiet_turn_ends_the_follow_with_the_turn_as_it_stands() -> None:
    rows = [record(TurnStatus.RUNNING, KINDS[:1])]
    items = await followed(rows, after=0, idle_s=0.1)
    assert shown(items) == [(1, "tool_call 1"), "RUNNING"]


async def test_a_new_attempt_s_events_follow_those_already_sent() -> None:
    rows = [
        record(TurnStatus.RUNNING, KINDS[:2], attempts=1),
        record(TurnStatus.RUNNING, [], attempts=2),  # driven again: its events start over
        record(TurnStatus.RUNNING, KINDS[:1], attempts=2),
        record(TurnStatus.DONE, KINDS, attempts=2),
    ]
    assert shown(await followed(rows, after=0)) == [
        (1, "tool_call 1"),
        (2, "observation 1"),
        (1, "tool_call 2"),
        (2, "observation 2"),
        (3, "reply 2"),
        "DONE",
    ]
