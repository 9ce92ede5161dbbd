"""The fake's tables: the rows every domain of ``FakeStore`` reads and writes, and the
audit log (which every domain writes to)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from itertools import count
from typing import Any
from uuid import UUID

import psycopg

from cortex_ray._types import Agent, Principal, Session, TaskRun, Turn, utcnow
from cortex_ray.observability import scrub, scrub_text
from cortex_ray.storage import AuditEntry, TurnRecord
from fakes._uow import FakeDatabase, FakeTransaction

__all__ = ["AUDIT_COLUMNS", "ApiKeyRow", "Tables"]

AUDIT_COLUMNS = frozenset(
    {
        "org_id", "id", "at", "principal_id", "agent_id", "mode", "tool", "action_type",
        "status", "reason", "args", "duration_ms", "run_id", "step_index", "session_id",
        "idempotency_key", "tier", "decision", "input_sha256", "result_sha256", "source_ids",
        "connector", "grant_ids", "workflow_id", "run_mode", "args_ref", "result_ref",
        "source_versions",
    }
)  # fmt: skip
"""The columns of an ``audit_log`` row as ``audit_rows`` returns it."""


@dataclass
class ApiKeyRow:
    org_id: str
    principal_id: str
    key_hash: bytes
    revoked_at: datetime | None = None


def foreign_key(what: str) -> psycopg.errors.ForeignKeyViolation:
    """What PostgreSQL raises for a row naming a missing one."""
    return psycopg.errors.ForeignKeyViolation(f"insert violates a foreign key: no {what}")


class Tables:
    """The rows, by (organisation, id), and the audit log."""

    def __init__(self, db: FakeDatabase | None = None) -> None:
        self.db = db or FakeDatabase()
        self.orgs: set[str] = set()
        self.principals: dict[tuple[str, str], Principal] = {}
        self.agents: dict[tuple[str, UUID], Agent] = {}
        self.runs: dict[tuple[str, UUID], TaskRun] = {}
        self.sessions: dict[tuple[str, UUID], Session] = {}
        self.messages: dict[tuple[str, UUID], list[Turn]] = {}
        self.turns: dict[tuple[str, UUID], list[TurnRecord]] = {}
        self.api_keys: dict[tuple[str, UUID], ApiKeyRow] = {}
        self.audit: list[dict[str, Any]] = []
        self.payloads: dict[tuple[str, str], str] = {}
        self._audit_ids = count(1)
        self._order = count()
        self._inserted: dict[tuple[str, UUID], int] = {}

    # organisations and principals ---------------------------------------------------------

    # audit --------------------------------------------------------------------------------

    async def insert_audit(self, conn: FakeTransaction, entry: AuditEntry) -> None:
        conn.on_commit(lambda: self._append_audit(entry))

    def _append_audit(self, entry: AuditEntry) -> None:
        for sha, body in entry.payloads:
            self.payloads.setdefault((entry.org_id, sha), body)
        args = (
            json.loads(entry.args_json)
            if entry.args_json is not None
            else json.loads(json.dumps(scrub(entry.args), default=str))
        )
        self.audit.append(
            {
                "org_id": entry.org_id,
                "id": next(self._audit_ids),
                "at": utcnow(),
                "principal_id": entry.principal_id,
                "agent_id": entry.agent_id,
                "mode": None if entry.mode is None else entry.mode.value,
                "tool": entry.tool,
                "action_type": entry.action_type.value,
                "status": entry.status,
                "reason": scrub_text(entry.reason) if entry.reason else entry.reason,
                "args": args,
                "duration_ms": entry.duration_ms,
                "run_id": entry.run_id,
                "step_index": entry.step_index,
                "session_id": entry.session_id,
                "idempotency_key": entry.idempotency_key,
                "tier": None if entry.tier is None else entry.tier.value,
                "decision": entry.decision,
                "input_sha256": entry.input_sha256,
                "result_sha256": entry.result_sha256,
                "source_ids": list(entry.source_ids) if entry.source_ids else None,
                "connector": entry.connector,
                "grant_ids": list(entry.grant_ids) if entry.grant_ids else None,
                "workflow_id": entry.workflow_id,
                "run_mode": entry.run_mode,
                "args_ref": entry.args_ref,
                "result_ref": entry.result_ref,
                "source_versions": list(entry.source_versions) if entry.source_versions else None,
            }
        )

    async def audit_rows(
        self, org_id: str, *, run_id: UUID | None = None, gate_only: bool = False
    ) -> list[dict[str, Any]]:
        return [
            dict(row)
            for row in self.audit
            if row["org_id"] == org_id
            and (run_id is None or row["run_id"] == run_id)
            and (not gate_only or row["mode"] is not None)
        ]
