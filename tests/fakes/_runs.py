"""Task runs, sessions and their messages, as ``Store`` and ``TurnStore`` keep them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import psycopg

from cortex_ray._exceptions import (
    AccessDeniedError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
)
from cortex_ray._types import RunStatus, Session, SessionStatus, TaskRun, Turn, utcnow
from cortex_ray.observability import current_traceparent, submission_span
from cortex_ray.observability.diagnostics import DiagnosticEvent
from cortex_ray.storage import AuditEntry, SessionMessage, TurnRecord, TurnStatus
from fakes._directory import Directory
from fakes._tables import foreign_key
from fakes._uow import FakeTransaction

__all__ = ["Runs"]

_NOT_INSERTED = (
    "result", "reason", "finished_at", "trace_attempt", "cost", "deadline_at"
)  # fmt: skip
"""The fields of a ``TaskRun`` that ``Store.create_run`` does not write (read back empty)."""

_PENDING = (TurnStatus.ACCEPTED, TurnStatus.RUNNING)
"""A turn not ended yet."""


class Runs(Directory):
    """``RunStore``, ``SessionStore``, ``TraceReader`` and ``TurnLog``."""

    # task runs ----------------------------------------------------------------------------

    async def create_run(self, run: TaskRun, *, audit: AuditEntry | None = None) -> TaskRun:
        if (run.org_id, run.agent_id) not in self.agents:
            raise foreign_key(f"agent {run.agent_id} in {run.org_id!r}")
        if (run.org_id, run.id) in self.runs:
            raise psycopg.errors.UniqueViolation(f"run {run.id} exists")
        # What ``Store.create_run`` inserts: no steps, cost or outcome yet.
        self.runs[run.org_id, run.id] = run.model_copy(
            update={**dict.fromkeys(_NOT_INSERTED), "steps": ()}
        )
        self._inserted[run.org_id, run.id] = next(self._order)
        if audit is not None:
            self._append_audit(audit)
        return run

    def _run(self, org_id: str, run_id: UUID) -> TaskRun:
        try:
            return self.runs[org_id, run_id]
        except KeyError:
            raise NotFoundError(f"task run {run_id} not found in organisation {org_id!r}") from None

    async def get_run(self, org_id: str, run_id: UUID, *, recordings: bool = False) -> TaskRun:
        return self._run(org_id, run_id)

    async def run_status(self, org_id: str, run_id: UUID) -> RunStatus:
        return self._run(org_id, run_id).status

    async def work_in_progress(self, recent_s: float) -> int:
        # No leases here: what was created or accepted in the last ``recent_s`` counts.
        since = utcnow() - timedelta(seconds=recent_s)
        running = sum(
            r.status is RunStatus.RUNNING and r.created_at > since for r in self.runs.values()
        )
        pending = sum(
            t.status in _PENDING and t.accepted_at > since for ts in self.turns.values() for t in ts
        )
        return running + pending

    async def list_runs(
        self, org_id: str, agent_id: UUID | None = None, limit: int = 50
    ) -> list[TaskRun]:
        runs = [
            r
            for (org, _), r in self.runs.items()
            if org == org_id and (agent_id is None or r.agent_id == agent_id)
        ]
        runs.sort(key=lambda r: (r.created_at, self._inserted[org_id, r.id]), reverse=True)
        return [r.model_copy(update={"steps": ()}) for r in runs[:limit]]

    def _finish(self, run: TaskRun, status: RunStatus, reason: str) -> None:
        self.runs[run.org_id, run.id] = run.model_copy(
            update={"status": status, "reason": reason, "result": None, "finished_at": utcnow()}
        )

    async def cancel_run(
        self, org_id: str, run_id: UUID, reason: str, *, audit: AuditEntry | None = None
    ) -> bool:
        run = self._run(org_id, run_id)
        if run.status not in (RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL):
            return False
        self._finish(run, RunStatus.CANCELLED, reason)
        if audit is not None:
            self._append_audit(audit)
        return True

    async def fail_run(self, org_id: str, run_id: UUID, reason: str) -> None:
        run = self.runs.get((org_id, run_id))
        if run is not None and run.status is RunStatus.RUNNING:
            self._finish(run, RunStatus.FAILED, reason)

    # traces and diagnostics ---------------------------------------------------------------

    async def trace_spans(self, org_id: str, run_id: UUID) -> list[dict[str, Any]]:
        """As ``Store.trace_spans`` where no span was kept: the fake keeps none (spans are
        the tracing exporter's, never a use case's write)."""
        return []

    async def spans_of_trace(self, org_id: str, trace_id: str) -> list[dict[str, Any]]:
        """As ``Store.spans_of_trace`` where no span was kept."""
        return []

    async def diagnostics(
        self,
        org_id: str,
        *,
        run_id: UUID | None = None,
        session_id: UUID | None = None,
        turn_id: UUID | None = None,
    ) -> list[DiagnosticEvent]:
        """As ``Store.diagnostics`` where none was written: the fake keeps none (events are
        the cycle's writes, never a use case's)."""
        return []

    # sessions -----------------------------------------------------------------------------

    async def create_session(self, session: Session) -> Session:
        if (session.org_id, session.agent_id) not in self.agents:
            raise foreign_key(f"agent {session.agent_id} in {session.org_id!r}")
        if (session.org_id, session.id) in self.sessions:
            raise psycopg.errors.UniqueViolation(f"session {session.id} exists")
        self.sessions[session.org_id, session.id] = session.model_copy(update={"ended_at": None})
        return session

    async def get_session(self, org_id: str, session_id: UUID) -> Session:
        try:
            return self.sessions[org_id, session_id]
        except KeyError:
            raise NotFoundError(
                f"session {session_id} not found in organisation {org_id!r}"
            ) from None

    async def conversation(
        self, org_id: str, session_id: UUID, limit: int | None = None
    ) -> list[Turn]:
        turns = self.messages.get((org_id, session_id), [])
        return list(turns if limit is None else turns[max(len(turns) - limit, 0) :])

    async def history(self, org_id: str, session_id: UUID) -> list[SessionMessage]:
        """As ``TurnStore.history``: the stored messages in order (the fake ends no turn,
        so none names one), then each pending turn's user message by ordinal."""
        stored = [
            SessionMessage(role=t.role, content=t.content, tool=t.tool)
            for t in self.messages.get((org_id, session_id), [])
        ]
        pending = [
            SessionMessage(role="user", content=t.message, turn_id=t.id, turn_status=t.status)
            for t in self.turns.get((org_id, session_id), [])
            if t.status in _PENDING
        ]
        return stored + pending

    # turns --------------------------------------------------------------------------------

    async def accept(
        self,
        org_id: str,
        session_id: UUID,
        caller_id: str,
        message: str,
        *,
        max_pending: int | None = None,
    ) -> TurnRecord:
        """As ``TurnStore.accept`` (an executor, absent here, would drive the turn)."""
        if not message.strip():
            raise InvalidRequestError("the message is empty")
        with submission_span(
            "accept_turn", {"cortex.org_id": org_id, "cortex.session_id": str(session_id)}
        ):
            session = await self.get_session(org_id, session_id)
            if session.caller_id != caller_id:
                raise AccessDeniedError("only the session's own caller may talk in it")
            if session.status is not SessionStatus.OPEN:
                raise ConflictError(f"session {session_id} has ended")
            turns = self.turns.setdefault((org_id, session_id), [])
            pending = sum(t.status in _PENDING for t in turns)
            if max_pending is not None and pending >= max_pending:
                raise ConflictError(
                    f"session {session_id} already has {pending} turn(s) running or "
                    f"queued (limit {max_pending}); try again when it answers"
                )
            turn = TurnRecord(
                id=uuid4(),
                org_id=org_id,
                session_id=session_id,
                ordinal=max((t.ordinal for t in turns), default=-1) + 1,
                caller_id=caller_id,
                message=message,
                status=TurnStatus.ACCEPTED,
                accepted_at=utcnow(),
                trace_parent=current_traceparent(),
            )
        turns.append(turn)
        return turn

    async def get(self, org_id: str, session_id: UUID, turn_id: UUID) -> TurnRecord:
        for turn in self.turns.get((org_id, session_id), []):
            if turn.id == turn_id:
                return turn
        raise NotFoundError(f"turn {turn_id} not found in session {session_id}")

    async def status(self, org_id: str, session_id: UUID, turn_id: UUID) -> TurnStatus:
        return (await self.get(org_id, session_id, turn_id)).status

    async def append_messages(
        self, conn: FakeTransaction, org_id: str, session_id: UUID, turns: Sequence[Turn]
    ) -> None:
        """As ``Store.append_messages``: in ``conn``'s transaction, to an existing session."""
        if (org_id, session_id) not in self.sessions:
            raise foreign_key(f"session {session_id} in {org_id!r}")
        added = list(turns)
        conn.on_commit(lambda: self.messages.setdefault((org_id, session_id), []).extend(added))

    # API keys -----------------------------------------------------------------------------
