"""LEARN: every write of long-term memory that the decision cycle makes, at its cadences.

- per autonomous step: the ledger row, the gate's audit row and one EPISODIC memory, in one
  transaction (``record_step``), which also consumes the step's intent;
- per run: the terminal status and the run's EPISODIC result (``record_result``);
- per interactive turn: the turn's messages, its audit rows and one EPISODIC memory
  (``record_turn``);
- after a session: the extraction pass, which writes SEMANTIC facts (``end_session``).

Embedding and importance scoring happen before each transaction (``MemoryService.prepare``),
so no transaction waits on a model.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import datetime

from cortex_ray._types import (
    Agent,
    Decision,
    MemoryKind,
    MemoryRecord,
    Observation,
    Principal,
    RunStatus,
    Session,
    SessionStatus,
    Step,
    TaskRun,
    Turn,
    TurnEvent,
    utcnow,
)
from cortex_ray.memory import MemoryService
from cortex_ray.models import ModelClient
from cortex_ray.observability import tracer
from cortex_ray.storage import (
    AuditEntry,
    Conn,
    Database,
    RunLease,
    Store,
    TurnLease,
    TurnStore,
    fenced,
)

__all__ = ["Learner", "step_memory_text"]

log = logging.getLogger("cortex_ray.cycle")


def step_memory_text(step_index: int, decision: Decision, observation: Observation) -> str:
    """The EPISODIC memory of one acting step, as the agent will recall it."""
    action = decision.action
    assert action is not None
    args = ", ".join(f"{k}={v!r}" for k, v in action.args.items())
    return (
        f"Step {step_index + 1}: {action.tool}({args}) [{observation.action_type.value}] → "
        f"{observation.status.value}: {observation.summary[:1000]}"
    )


class Learner:
    """Writes what the cycle learned, each cadence in one transaction."""

    def __init__(self, db: Database, store: Store, memory: MemoryService) -> None:
        self._db = db
        self._store = store
        self._memory = memory

    async def record_step(
        self,
        agent: Agent,
        run: TaskRun,
        step: Step,
        decision: Decision,
        audit: AuditEntry,
        *,
        clear_intent: bool,
        lease: RunLease | None = None,
    ) -> None:
        """An acting step: ledger row + audit row + EPISODIC memory (+ the intent consumed).

        With ``lease``, the transaction is fenced (``cortex_ray.storage.fenced``): written
        only while the lease is the driver's, else ``LeaseLost`` and nothing written."""
        observation = step.observation
        assert observation is not None
        with tracer.start_as_current_span("learn"):
            prepared = await self._memory.prepare(
                org_id=run.org_id,
                agent_id=agent.id,
                kind=MemoryKind.EPISODIC,
                content=step_memory_text(step.step_index, decision, observation),
                run_id=run.id,
                step_index=step.step_index,
                metadata={"tool": observation.tool, "status": observation.status.value},
            )
            # One transaction, its statements pipelined: BEGIN, then every statement in
            # one round trip (nothing here reads a result back), then COMMIT: three round
            # trips instead of five. The pipeline ends (its errors raised) before COMMIT,
            # so a failed statement rolls all of them back, as before.
            async with self._step_transaction(lease, progress=True) as conn:
                await self._store.insert_step(conn, run.org_id, step)
                await self._store.insert_audit(conn, audit)
                await self._memory.insert_prepared(conn, [prepared])
                if clear_intent:
                    await self._store.clear_intent(conn, run.org_id, run.id, step.step_index)

    @contextlib.asynccontextmanager
    async def _step_transaction(
        self, lease: RunLease | None, *, progress: bool
    ) -> AsyncIterator[Conn]:
        """A run's write: fenced by its lease, or (no lease) a plain pipelined one."""
        if lease is not None:
            async with fenced(self._db, lease, progress=progress) as conn:
                yield conn
            return
        async with self._db.transaction() as conn, conn.pipeline():
            yield conn

    async def record_result(
        self,
        agent: Agent,
        run: TaskRun,
        status: RunStatus,
        *,
        result: str | None = None,
        reason: str | None = None,
        step: Step | None = None,
        lease: RunLease | None = None,
    ) -> datetime:
        """The terminal state and the run's EPISODIC result (and a last ledger row); fenced
        by ``lease`` like :meth:`record_step`."""
        outcome = result if status is RunStatus.COMPLETED else reason
        prepared = await self._memory.prepare(
            org_id=run.org_id,
            agent_id=agent.id,
            kind=MemoryKind.EPISODIC,
            content=f"Run '{run.goal[:200]}' {status.value.lower()}: {outcome or ''}".strip(),
            run_id=run.id,
            step_index=None,
            metadata={"run_status": status.value, "result": True},
        )
        # Pipelined like record_step's transaction.
        async with self._step_transaction(lease, progress=step is not None) as conn:
            if step is not None:
                await self._store.insert_step(conn, run.org_id, step)
            finished_at = await self._store.finish_run(
                conn, run.org_id, run.id, status, result=result, reason=reason
            )
            await self._memory.insert_prepared(conn, [prepared])
        log.info("run %s %s: %s", run.id, status.value, outcome)
        return finished_at

    async def record_turn(
        self,
        session: Session,
        agent: Agent,
        caller: Principal,
        message: str,
        answer: str,
        turns: Sequence[Turn],
        audits: Sequence[AuditEntry],
        observations: Sequence[Observation],
        *,
        lease: TurnLease | None = None,
        reply: str | None = None,
        refused: str | None = None,
        events: Sequence[TurnEvent] = (),
    ) -> None:
        """A turn: its messages, its audit rows and one EPISODIC memory; with the turn's
        ``lease``, in the same transaction its ``session_turns`` row becomes DONE with the
        reply or refusal and the events it emitted (fenced: a driver whose lease was taken
        over writes nothing and gets ``TurnLeaseLostError``)."""
        tools_used = ", ".join(f"{o.tool}:{o.status.value}" for o in observations) or "none"
        prepared = await self._memory.prepare(
            org_id=session.org_id,
            agent_id=agent.id,
            kind=MemoryKind.EPISODIC,
            content=f"{caller.name or caller.id} said: {message[:1000]}\nI replied: "
            f"{answer[:1000]}\nTools: {tools_used}",
            session_id=session.id,
            metadata={"turn": True, "caller": caller.id},
        )
        async with self._db.transaction() as conn:
            if lease is None:
                await self._store.append_messages(conn, session.org_id, session.id, list(turns))
            else:
                await TurnStore(self._db).finish(
                    conn, lease, turns=turns, reply=reply, refused=refused, events=events
                )
            for audit in audits:
                await self._store.insert_audit(conn, audit)
            await self._memory.write_prepared(conn, [prepared])

    async def end_session(self, session: Session, model: ModelClient | None) -> list[MemoryRecord]:
        """End a session; the extraction pass writes the SEMANTIC facts it finds.

        Safe to retry: the pass is idempotent per session (``MemoryService.extract_facts``),
        so an end retried after a crash between the facts' commit and the session's, or two
        ends at once, store each fact once (and answer with the same facts)."""
        session = await self._store.get_session(session.org_id, session.id)
        if session.status is SessionStatus.ENDED:
            return []
        conversation = await self._store.conversation(session.org_id, session.id)
        facts = await self._memory.extract_facts(
            org_id=session.org_id,
            agent_id=session.agent_id,
            session_id=session.id,
            conversation=conversation,
            model=model,
        )
        async with self._db.transaction() as conn:
            await self._store.end_session(conn, session.org_id, session.id, utcnow())
        return facts
