"""What the cycle tells its callers as it goes: a run's steps (``StepCallback``) and a turn's
events (``TurnEventSink``), and how a turn's events cross to a stream (``events_until``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from cortex_ray._types import Step, TurnEvent

__all__ = ["StepCallback", "TurnEventRelay", "TurnEventSink", "events_until", "notify"]

log = logging.getLogger("cortex_ray.cycle")

E = TypeVar("E")

StepCallback = Callable[[Step], Awaitable[None] | None]
TurnEventSink = Callable[[TurnEvent], Awaitable[None] | None]
"""Receives a turn's events as they happen. A sink that raises is dropped for the rest of
the turn (logged); the turn itself always runs to its end and is recorded."""


async def notify(callback: StepCallback | None, step: Step) -> None:
    """Tell ``callback`` (if any) about a recorded step."""
    if callback is None:
        return
    result = callback(step)
    if result is not None:
        await result


async def events_until(running: asyncio.Future[Any], events: asyncio.Queue[E]) -> AsyncIterator[E]:
    """Yield what is put on ``events`` as it arrives, until ``running`` ends, then what is
    left: how a turn's events cross from the task running it to a stream (the actor's
    generator, the API's server-sent events). ``running`` is never cancelled here."""
    while not running.done():
        waiting = asyncio.ensure_future(events.get())
        try:
            await asyncio.wait({waiting, running}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waiting.done():
                waiting.cancel()
        if waiting.done() and not waiting.cancelled():
            yield waiting.result()
    while not events.empty():
        yield events.get_nowait()


class TurnEventRelay:
    """Delivers turn events to a sink until the sink fails once (then drops them, logged):
    a caller that stopped listening never stops the turn."""

    def __init__(self, sink: TurnEventSink | None, label: str) -> None:
        self._sink = sink
        self._label = label

    async def __call__(self, event: TurnEvent) -> None:
        if self._sink is None:
            return
        try:
            result = self._sink(event)
            if result is not None:
                await result
        except Exception:
            log.warning(
                "%s: the turn-event sink failed; the turn goes on without it",
                self._label,
                exc_info=True,
            )
            self._sink = None
