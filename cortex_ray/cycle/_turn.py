"""The interactive turn: tool rounds through the gate for one message, then a reply (a
dialogue action), learned once per turn.

``on_event`` hears each tool call, its observation, and the reply or refusal as they happen
(the HTTP API streams them as server-sent events). With the ``lease`` of an accepted turn,
each round's tool call carries the idempotency key ``f"turn:{turn_id}:{round}"`` (the same
on a retried attempt), and the turn's row ends DONE, with its events, in the transaction
that records the turn.

A turn has a deadline, ``deadline_s`` after it was accepted: its model calls wait for a
model over capacity until then (``cortex_ray.models.waiting_until``), and past it the turn
raises ``DeadlineExceededError`` saying so (its executor ends it FAILED with that reason).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from datetime import timedelta

from cortex_ray._exceptions import AccessDeniedError, ConflictError, InvalidRequestError
from cortex_ray._types import (
    Agent,
    AgentAction,
    AgentMode,
    Decision,
    Observation,
    ObservationStatus,
    Principal,
    Session,
    SessionStatus,
    Turn,
    TurnEvent,
    TurnEventKind,
    TurnResult,
    WorkingMemory,
    utcnow,
)
from cortex_ray.act import InvocationContext, ToolDispatcher, progress_to
from cortex_ray.cycle._approvals import TurnApprovals
from cortex_ray.cycle._events import TurnEventRelay, TurnEventSink
from cortex_ray.cycle._runs import Timelines
from cortex_ray.cycle._step import Decide, SharedStep, decided
from cortex_ray.decide import InteractiveDriver
from cortex_ray.learn import Learner
from cortex_ray.models import waiting_until
from cortex_ray.observability import (
    GEN_AI_AGENT_ID,
    GEN_AI_AGENT_NAME,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    context_of,
    diagnostics,
    metrics,
    tracer,
)
from cortex_ray.storage import AuditEntry, Store, TurnLease

__all__ = ["InteractiveTurn"]


@dataclass
class _Turn:
    """What one turn gathers as its rounds go."""

    session: Session
    agent: Agent
    caller: Principal
    message: str
    lease: TurnLease | None
    relay: TurnEventRelay
    history: list[Turn]
    ctx: InvocationContext
    emitted: list[TurnEvent] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)
    new_turns: list[Turn] = field(default_factory=list)
    audits: list[AuditEntry] = field(default_factory=list)
    reply: str | None = None
    refused: str | None = None

    async def emit(self, event: TurnEvent) -> None:
        self.emitted.append(event)
        await self.relay(event)


_MAX_PROGRESS_EVENTS = 50
"""Progress events a round streams at most (the rest are on the call's span only)."""


class InteractiveTurn:
    """Runs the turns of sessions."""

    def __init__(
        self,
        *,
        max_tool_rounds: int,
        conversation_window: int,
        store: Store,
        dispatcher: ToolDispatcher,
        driver: InteractiveDriver,
        learner: Learner,
        approvals: TurnApprovals,
        step: SharedStep,
        timelines: Timelines,
        deadline_s: float = 900.0,
    ) -> None:
        self._deadline_s = deadline_s
        self._max_tool_rounds = max_tool_rounds
        self._conversation_window = conversation_window
        self._store = store
        self._dispatcher = dispatcher
        self._driver = driver
        self._learner = learner
        self._approvals = approvals
        self._step = step
        self._timelines = timelines

    async def turn(
        self,
        session: Session,
        caller: Principal,
        message: str,
        *,
        lease: TurnLease | None = None,
        on_event: TurnEventSink | None = None,
    ) -> TurnResult:
        """One interactive turn (see the module's docstring), with its diagnostic timeline."""
        timeline = self._timelines.open(
            session.org_id,
            session_id=session.id,
            turn_id=lease.turn.id if lease is not None else None,
        )
        with diagnostics.timeline(timeline):
            diagnostics.note("request", message=message, caller=caller.id)
            accepted = lease.turn.accepted_at if lease is not None else utcnow()
            deadline = accepted + timedelta(seconds=self._deadline_s)
            what = f"the turn's deadline ({self._deadline_s:g} s after it was accepted)"
            try:
                with waiting_until(deadline, what):
                    result = await self._turn(
                        session, caller, message, lease=lease, on_event=on_event
                    )
            except BaseException as exc:
                diagnostics.note("failure", error=f"{type(exc).__name__}: {exc}")
                if timeline is not None:
                    await asyncio.shield(timeline.close())
                raise
            diagnostics.note(
                "terminal",
                reply=result.reply,
                refused=result.refused,
                cost=None if timeline is None else timeline.meter.as_dict(),
            )
            if timeline is not None:
                await asyncio.shield(timeline.close())
        return result

    async def _turn(
        self,
        session: Session,
        caller: Principal,
        message: str,
        *,
        lease: TurnLease | None,
        on_event: TurnEventSink | None,
    ) -> TurnResult:
        """The turn's rounds under its span, then LEARN (one EPISODIC record per turn)."""
        t = await self._begin(session, caller, message, lease, on_event)
        with tracer.start_as_current_span(
            f"invoke_agent {t.agent.name}",
            attributes={
                GEN_AI_OPERATION_NAME: "invoke_agent",
                GEN_AI_AGENT_NAME: t.agent.name,
                GEN_AI_AGENT_ID: str(t.agent.id),
                GEN_AI_CONVERSATION_ID: str(t.session.id),
                "cortex.org_id": t.session.org_id,
                "cortex.session_id": str(t.session.id),
                "cortex.mode": "interactive",
            },
            # the request's trace, wherever the turn is driven (a session actor, a recovery)
            context=context_of(lease.turn.trace_parent if lease is not None else None),
        ):
            round_index = 0
            for round_index in range(self._max_tool_rounds + 1):
                if not await self._round(t, round_index):
                    break
            if t.reply is not None:
                await t.emit(TurnEvent(kind=TurnEventKind.REPLY, round=round_index, text=t.reply))
            else:
                await t.emit(
                    TurnEvent(
                        kind=TurnEventKind.REFUSED,
                        round=round_index,
                        text=t.refused or "no reply",
                    )
                )
        await self._learner.record_turn(  # LEARN: one EPISODIC record per turn
            t.session,
            t.agent,
            t.caller,
            t.message,
            t.reply or t.refused or "",
            t.new_turns,
            t.audits,
            t.observations,
            lease=lease,
            reply=t.reply,
            refused=None if t.reply is not None else t.refused or "no reply",
            events=t.emitted,
        )
        outcome = "replied" if t.reply is not None else "refused"
        metrics.record(
            metrics.TURNS_FINISHED, org=t.session.org_id, agent=t.agent.name, outcome=outcome
        )
        return TurnResult(
            session_id=t.session.id,
            reply=t.reply,
            observations=tuple(t.observations),
            refused=t.refused,
        )

    async def _begin(
        self,
        session: Session,
        caller: Principal,
        message: str,
        lease: TurnLease | None,
        on_event: TurnEventSink | None,
    ) -> _Turn:
        """The turn checked (a message, the session's own caller, an open session) and set
        up: its agent, the conversation so far, its context at the gate."""
        if not message.strip():
            raise InvalidRequestError("the message is empty")
        session = await self._store.get_session(session.org_id, session.id)
        if caller.id != session.caller_id or caller.org_id != session.org_id:
            raise AccessDeniedError("only the session's own caller may talk in it")
        if session.status is not SessionStatus.OPEN:
            raise ConflictError(f"session {session.id} has ended")
        relay = TurnEventRelay(on_event, f"session {session.id}")
        agent = await self._store.get_agent(session.org_id, session.agent_id)
        history = await self._store.conversation(
            session.org_id, session.id, limit=self._conversation_window
        )
        ctx = InvocationContext(
            agent=agent, caller=caller, mode=AgentMode.INTERACTIVE, session_id=session.id
        )
        return _Turn(
            session=session,
            agent=agent,
            caller=caller,
            message=message,
            lease=lease,
            relay=relay,
            history=list(history),
            ctx=ctx,
            new_turns=[Turn(role="user", content=message)],
        )

    async def _round(self, t: _Turn, round_index: int) -> bool:
        """One tool round: the shared step, then its call observed (``True``: another round)
        or the turn's reply or refusal (``False``)."""

        chosen: list[str] = []

        async def tool_call(action: AgentAction) -> None:
            chosen.append(action.tool)
            await t.emit(
                TurnEvent(
                    kind=TurnEventKind.TOOL_CALL,
                    round=round_index,
                    tool=action.tool,
                    args=action.args,
                )
            )

        if t.lease is not None:
            t.ctx = replace(t.ctx, idempotency_key=t.lease.idempotency_key(round_index))
        reported = 0

        async def progress(done: float, total: float | None, message: str | None) -> None:
            nonlocal reported
            if reported >= _MAX_PROGRESS_EVENTS:  # a chatty server cannot flood the turn
                return
            reported += 1
            tool = chosen[-1] if chosen else None
            await t.emit(
                TurnEvent(
                    kind=TurnEventKind.PROGRESS, round=round_index, tool=tool,
                    progress=done, total=total, text=message,
                )
            )  # fmt: skip

        with progress_to(progress):
            cycle = await self._step(
                t.ctx,
                await self._decider(t, round_index),
                objective=t.message,
                observations=t.observations,
                conversation=[*t.history, t.new_turns[0]],
                before_act=tool_call,
            )
        decision = cycle.decision
        if cycle.dispatch is not None and decision.action is not None:
            dispatch = cycle.dispatch
            if dispatch.audit.decision == "approval_required" and t.lease is not None:
                # A person is in the loop: the turn waits for the decision.
                t.audits.append(dispatch.audit)
                dispatch = await self._approvals.call(
                    t.ctx, t.lease, round_index, decision, dispatch, t.observations, t.emit
                )
            await t.emit(
                TurnEvent(
                    kind=TurnEventKind.OBSERVATION,
                    round=round_index,
                    tool=decision.action.tool,
                    observation=dispatch.observation,
                )
            )
            t.observations.append(dispatch.observation)
            t.audits.append(dispatch.audit)
            t.new_turns.append(
                Turn(role="tool", content=dispatch.observation.summary, tool=decision.action.tool)
            )
            return True
        await self._answer(t, decision)
        return False

    async def _decider(self, t: _Turn, round_index: int) -> Decide:
        """DECIDE for a round: the driver's (the last round may only reply: the bound on
        tool rounds), or, in a recovered turn whose round already asked for approval, the
        call the person saw (or sees), not a new decision."""
        if t.lease is not None and t.lease.turn.attempts > 1:
            asked = await self._approvals.asked_in(t.session.org_id, t.lease.turn.id, round_index)
            if asked is not None:
                return decided(asked)
        driver = self._driver
        allow_tools = round_index != self._max_tool_rounds

        async def decide(wm: WorkingMemory) -> Decision:
            return await driver.decide(wm, allow_tools=allow_tools)

        return decide

    async def _answer(self, t: _Turn, decision: Decision) -> None:
        """The turn's end: a refusal, or the reply, a dialogue action that passes the gate
        like any other."""
        if decision.failed or not decision.message:
            t.refused = decision.reason
            return
        dispatch = await self._dispatcher.execute(t.ctx, "reply", {"message": decision.message})
        t.audits.append(dispatch.audit)
        if dispatch.observation.status is ObservationStatus.OK:
            t.reply = decision.message
            t.new_turns.append(Turn(role="assistant", content=t.reply))
        else:
            t.refused = dispatch.observation.summary
