"""The executor seam: work a use case already admitted, driven by an ``Executor``.

``drive_run`` continues a RUNNING run under its lease; ``run_turn`` / ``recover_turn``
drive an accepted turn under its lease, one at a time per session; ``orphaned_runs`` /
``orphaned_turns`` are what a supervisor hands back to an executor; ``give_up_run`` /
``fail_run`` end a run nobody can drive; ``end_session`` runs the extraction pass. None of
these decides access: the use case that admitted the work did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from uuid import UUID

from cortex_ray._exceptions import CortexError, InvalidRequestError
from cortex_ray._types import MemoryRecord, Principal, Session, TaskRun, TurnEvent, TurnResult
from cortex_ray.cycle import DecisionCycle, StepCallback, TurnEventRelay, TurnEventSink
from cortex_ray.learn import Learner
from cortex_ray.models import ModelClient
from cortex_ray.observability import metrics
from cortex_ray.settings import Settings
from cortex_ray.storage import (
    OrphanedRun,
    Store,
    StoredTurnEvent,
    TurnLease,
    TurnLeaseLostError,
    TurnLog,
    TurnRecord,
    TurnRef,
    TurnStore,
)

__all__ = ["Execution", "follow_turn", "wait_for_turn"]

log = logging.getLogger("cortex_ray.runtime")


class Execution:
    """The executor seam of one runtime (see the module docstring); ``driver_id`` is who
    holds a lease when the caller names no owner."""

    def __init__(
        self,
        *,
        cycle: DecisionCycle,
        store: Store,
        turns: TurnStore,
        learner: Learner,
        model: ModelClient | None,
        settings: Settings,
        driver_id: str,
    ) -> None:
        self.cycle = cycle
        self.store = store
        self.turns = turns
        self.learner = learner
        self.model = model
        self.settings = settings
        self.driver_id = driver_id
        # Set when a turn of the session ends here: the next one claims at once, not at its
        # next poll.
        self._turn_ended: dict[UUID, asyncio.Event] = {}

    async def drive_run(
        self,
        org_id: str,
        run_id: UUID,
        *,
        on_step: StepCallback | None = None,
        owner: str | None = None,
    ) -> TaskRun:
        """Drive a RUNNING run to a terminal state, continuing after its last recorded step,
        holding its lease as ``owner`` (default :attr:`driver_id`).

        A run whose live lease another owner holds is returned as it is (RUNNING), and so
        is one whose lease this driver loses on the way: one driver per run. For executors
        (the run was authorised when it was started); people resume runs with
        :meth:`resume_run`."""
        return await self.cycle.resume(
            org_id, run_id, on_step=on_step, owner=owner or self.driver_id
        )

    async def orphaned_runs(self, limit: int = 1000) -> list[OrphanedRun]:
        """RUNNING runs of every organisation that nobody drives (no live lease), older
        than ``settings.runs.orphan_grace_s``: what the supervisor resumes."""
        return await self.cycle.leases.orphaned(self.settings.runs.orphan_grace_s, limit)

    async def give_up_run(self, org_id: str, run_id: UUID, reason: str) -> bool:
        """End a RUNNING run that nobody drives FAILED with ``reason`` (a run taken again
        meanwhile keeps going); ``True`` when it was ended here."""
        if not reason.strip():
            raise InvalidRequestError("a failed run needs a reason")
        return await self.cycle.leases.give_up(org_id, run_id, reason)

    async def fail_run(self, org_id: str, run_id: UUID, reason: str) -> TaskRun:
        """Give up on a RUNNING run: it becomes FAILED with ``reason`` (a supervisor that
        cannot drive it any more). A run already terminal is returned unchanged."""
        if not reason.strip():
            raise InvalidRequestError("a failed run needs a reason")
        await self.store.fail_run(org_id, run_id, reason)
        return await self.store.get_run(org_id, run_id)

    async def run_turn(
        self,
        session: Session,
        caller: Principal,
        message: str,
        *,
        turn_id: UUID | None = None,
        owner: str | None = None,
        on_event: TurnEventSink | None = None,
    ) -> TurnResult:
        """One interactive turn of ``caller`` (who must be the session's own caller):
        tool rounds through the gate, then a reply. See ``DecisionCycle.turn``.

        ``turn_id`` is a turn :meth:`accept_turn` recorded (``message`` is then its
        message); without one the turn is accepted here first (no pending bound: in-process
        callers). The turn waits for the session's earlier turns, runs under a lease held
        by ``owner`` (default :attr:`driver_id`) and ends DONE, or FAILED with the reason
        when the cycle raises (the error is raised again). An ended turn returns its stored
        result."""
        if turn_id is None:
            accepted = await self.turns.accept(session.org_id, session.id, caller.id, message)
            turn_id = accepted.id
        return await self._drive_turn(session, caller, turn_id, owner, on_event)

    async def recover_turn(
        self,
        org_id: str,
        session_id: UUID,
        turn_id: UUID,
        *,
        owner: str | None = None,
        on_event: TurnEventSink | None = None,
    ) -> TurnResult:
        """Drive an accepted turn again after its driver went away (see
        :meth:`orphaned_turns`): the caller is the turn's own, tool calls carry the same
        idempotency keys as the first attempt. An ended turn returns its stored result; one
        driven ``sessions.turn_max_attempts`` times already ends FAILED."""
        turn = await self.turns.get(org_id, session_id, turn_id)
        if turn.status.ended:
            return turn.result()
        session = await self.store.get_session(org_id, session_id)
        caller = await self.store.get_principal(org_id, turn.caller_id)
        return await self._drive_turn(session, caller, turn_id, owner, on_event)

    async def orphaned_turns(self, limit: int = 1000) -> list[TurnRef]:
        """Accepted turns that nobody drives: not ended, lease missing or expired, accepted
        over ``sessions.turn_orphan_grace_s`` ago, in a session where no turn holds a live
        lease; oldest first, across organisations. A supervisor hands each to
        ``Executor.recover_turn``."""
        return await self.turns.orphans(self.settings.sessions.turn_orphan_grace_s, limit)

    async def _drive_turn(
        self,
        session: Session,
        caller: Principal,
        turn_id: UUID,
        owner: str | None,
        on_event: TurnEventSink | None,
    ) -> TurnResult:
        policy = self.settings.sessions
        holder = owner or self.driver_id
        delay = 0.01
        while True:  # one at a time, in ordinal order: wait for the earlier turns
            claim = await self.turns.claim(
                session.org_id,
                session.id,
                turn_id,
                owner=holder,
                ttl_s=policy.turn_lease_ttl_s,
                max_attempts=policy.turn_max_attempts,
            )
            if claim.outcome == "ended":
                return claim.turn.result()
            if claim.lease is not None:
                lease = claim.lease
                break
            handoff = self._turn_ended.setdefault(session.id, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(handoff.wait(), delay)
            delay = min(delay * 2, 0.25)
        renewing = asyncio.create_task(self._renew_turn(lease), name=f"lease turn {turn_id}")
        relay = TurnEventRelay(on_event, f"turn {turn_id}")

        async def publish(event: TurnEvent) -> None:
            # Stored first, as it happens: a client reconnecting mid-turn follows it live.
            try:
                await self.turns.append_event(lease, event)
            except Exception:  # the end of the turn stores them all again
                log.warning("turn %s: an event could not be stored", turn_id, exc_info=True)
            await relay(event)

        try:
            return await self.cycle.turn(
                session, caller, lease.turn.message, lease=lease, on_event=publish
            )
        except TurnLeaseLostError:
            # Taken over after this driver's lease expired: the new holder's outcome counts.
            log.warning("turn %s: the lease of %s was taken over", turn_id, holder)
            ended = await self.wait_turn(session.org_id, session.id, turn_id, None)
            return ended.result()
        except asyncio.CancelledError:
            # Shutting down: let another driver take the turn at once instead of at expiry.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.turns.release(lease))
            raise
        except Exception as exc:
            reason = _turn_failure(exc)
            with contextlib.suppress(TurnLeaseLostError):
                await self.turns.fail(lease, reason)
            metrics.record(metrics.TURNS_FINISHED, org=session.org_id, outcome="failed")
            raise
        finally:
            renewing.cancel()
            if (waiting := self._turn_ended.pop(session.id, None)) is not None:
                waiting.set()

    async def _renew_turn(self, lease: TurnLease) -> None:
        ttl = self.settings.sessions.turn_lease_ttl_s
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                if not await self.turns.renew(lease, ttl):
                    return  # lost: the turn's end will say so
            except Exception:
                log.warning("turn %s: renewing the lease failed", lease.turn.id, exc_info=True)

    async def wait_turn(
        self, org_id: str, session_id: UUID, turn_id: UUID, wait_s: float | None
    ) -> TurnRecord:
        """The turn once it has ended, or as it is after ``wait_s`` seconds (``None``: no
        bound): a long poll of its status with back-off, one full read at the end."""
        return await wait_for_turn(self.turns, org_id, session_id, turn_id, wait_s)

    async def end_session(self, session: Session) -> list[MemoryRecord]:
        """End a session; the extraction pass writes the semantic facts it finds. For
        executors and in-process callers; people end sessions through
        :meth:`authorize_end_session` first."""
        return await self.learner.end_session(session, self.model)


async def wait_for_turn(
    turns: TurnLog, org_id: str, session_id: UUID, turn_id: UUID, wait_s: float | None
) -> TurnRecord:
    """The turn once it has ended, or as it is after ``wait_s`` seconds (``None``: no
    bound): a long poll of its status with back-off, one full read at the end."""
    loop = asyncio.get_running_loop()
    deadline = None if wait_s is None else loop.time() + wait_s
    delay = 0.01
    while not (await turns.status(org_id, session_id, turn_id)).ended:
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            break
        await asyncio.sleep(delay if left is None else min(delay, left))
        delay = min(delay * 2, 0.25)
    return await turns.get(org_id, session_id, turn_id)


async def follow_turn(
    turns: TurnLog, turn: TurnRecord, *, after: int, idle_s: float
) -> AsyncIterator[StoredTurnEvent | TurnRecord]:
    """A running turn's stored events after sequence number ``after``, as its driver stores
    them (each once, in order), then the turn itself once it has ended (the last item).

    When no event comes and the turn does not end for ``idle_s`` seconds, the last item is
    the turn as it then stands, not ended: the caller follows again later. A turn driven
    again after its driver died starts its events over from 1 (each attempt's events are
    its own): they follow those of the attempt that was interrupted."""
    loop = asyncio.get_running_loop()
    seen, attempt = after, turn.attempts
    quiet_until = loop.time() + idle_s
    delay = 0.02
    while True:
        if turn.attempts != attempt:  # a new attempt: its events count from 1 again
            seen = 0 if attempt > 0 else seen
            attempt = turn.attempts
        fresh = [stored for stored in turn.events if stored.seq > seen]
        for stored in fresh:
            yield stored
            seen = stored.seq
        if turn.status.ended or (not fresh and loop.time() >= quiet_until):
            yield turn
            return
        if fresh:
            quiet_until, delay = loop.time() + idle_s, 0.02
        await asyncio.sleep(min(delay, max(quiet_until - loop.time(), 0.0)))
        delay = min(delay * 2, 0.25)
        turn = await turns.get(turn.org_id, turn.session_id, turn.id)


def _turn_failure(exc: BaseException) -> str:
    """Why a turn failed, as its row keeps it: a cortex-ray error's own message (written for
    a client), only the kind of anything else (its detail goes to the log)."""
    if isinstance(exc, CortexError):
        return f"the turn failed: {str(exc)[:500]}"
    return f"the turn failed: internal error ({type(exc).__name__})"
