"""The audit log: one row per dispatch through the invocation gate or use case, and the
large payloads those rows reference by hash."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from cortex_ray._types import ActionType, AgentMode, CapabilityTier
from cortex_ray.observability import scrub, scrub_text
from cortex_ray.storage._database import Conn
from cortex_ray.storage._rows import StoreRows

__all__ = ["INSERT_AUDIT", "AuditEntry", "AuditRows", "audit_params"]


# ``args`` goes as JSON text (see ``audit_params``).
INSERT_AUDIT = """
INSERT INTO audit_log (org_id, principal_id, agent_id, mode, tool, action_type, status,
                       reason, args, duration_ms, run_id, step_index, session_id,
                       idempotency_key, tier, decision, input_sha256, result_sha256,
                       source_ids, connector, grant_ids, workflow_id, run_mode, args_ref,
                       result_ref, source_versions)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s,
        %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""


def audit_params(entry: AuditEntry) -> tuple[Any, ...]:
    return (
        entry.org_id,
        entry.principal_id,
        entry.agent_id,
        None if entry.mode is None else entry.mode.value,
        entry.tool,
        entry.action_type.value,
        entry.status,
        scrub_text(entry.reason) if entry.reason else entry.reason,
        # Scrubbed (the one scrubber spans and diagnostics use: a credential in a tool's
        # arguments never reaches the audit log), then encoded once, as text
        # (``default=str``: any value an argument may hold); decoding it again only for
        # Jsonb to encode it a second time cost a second pass.
        entry.args_json
        if entry.args_json is not None
        else json.dumps(scrub(entry.args), default=str),
        entry.duration_ms,
        entry.run_id,
        entry.step_index,
        entry.session_id,
        entry.idempotency_key,
        None if entry.tier is None else entry.tier.value,
        entry.decision,
        entry.input_sha256,
        entry.result_sha256,
        list(entry.source_ids) if entry.source_ids else None,
        entry.connector,
        list(entry.grant_ids) if entry.grant_ids else None,
        entry.workflow_id,
        entry.run_mode,
        entry.args_ref,
        entry.result_ref,
        list(entry.source_versions) if entry.source_versions else None,
    )


_INSERT_PAYLOAD = """
INSERT INTO payloads (org_id, sha256, body, bytes) VALUES (%s, %s, %s, %s)
ON CONFLICT (org_id, sha256) DO NOTHING
"""


class AuditEntry:
    """One dispatch through the invocation gate, as the audit log records it."""

    __slots__ = (
        "action_type",
        "agent_id",
        "args",
        "args_json",
        "args_ref",
        "connector",
        "decision",
        "duration_ms",
        "grant_ids",
        "idempotency_key",
        "input_sha256",
        "mode",
        "org_id",
        "payloads",
        "principal_id",
        "reason",
        "result_ref",
        "result_sha256",
        "run_id",
        "run_mode",
        "session_id",
        "source_ids",
        "source_versions",
        "status",
        "step_index",
        "tier",
        "tool",
        "workflow_id",
    )

    def __init__(
        self,
        *,
        org_id: str,
        principal_id: str,
        tool: str,
        action_type: ActionType,
        status: str,
        reason: str | None,
        args: dict[str, Any],
        duration_ms: float,
        agent_id: UUID | None = None,
        mode: AgentMode | None = None,
        run_id: UUID | None = None,
        step_index: int | None = None,
        session_id: UUID | None = None,
        idempotency_key: str | None = None,
        tier: CapabilityTier | None = None,
        decision: str | None = None,
        input_sha256: str | None = None,
        result_sha256: str | None = None,
        source_ids: tuple[str, ...] = (),
        connector: str | None = None,
        grant_ids: tuple[UUID, ...] = (),
        workflow_id: UUID | None = None,
        run_mode: str | None = None,
        args_ref: str | None = None,
        result_ref: str | None = None,
        source_versions: tuple[str, ...] = (),
        payloads: tuple[tuple[str, str], ...] = (),
        args_json: str | None = None,
    ) -> None:
        self.org_id = org_id
        self.principal_id = principal_id
        self.tool = tool
        self.action_type = action_type
        self.status = status
        self.reason = reason
        self.args = args
        self.duration_ms = duration_ms
        self.agent_id = agent_id
        self.mode = mode
        self.run_id = run_id
        self.step_index = step_index
        self.session_id = session_id
        self.idempotency_key = idempotency_key
        self.tier = tier
        self.decision = decision
        self.input_sha256 = input_sha256
        self.result_sha256 = result_sha256
        self.source_ids = source_ids
        self.connector = connector
        self.grant_ids = grant_ids
        self.workflow_id = workflow_id
        self.run_mode = run_mode
        self.args_ref = args_ref
        self.result_ref = result_ref
        self.source_versions = source_versions
        self.payloads = payloads
        self.args_json = args_json
        """``args`` already scrubbed and encoded as JSON text, when the gate did it."""
        """(sha256, text) of the large arguments or result this row references by hash
        (``args_ref``, ``result_ref``): stored once per organisation with the row."""


class AuditRows(StoreRows):
    """Audit rows in (inside the caller's transaction) and out, and their payloads."""

    @staticmethod
    async def insert_audit(conn: Conn, entry: AuditEntry) -> None:
        """One audit row, and the payloads it references (each kept once per organisation:
        a payload already stored is not written again)."""
        for sha, body in entry.payloads:
            await conn.execute(_INSERT_PAYLOAD, (entry.org_id, sha, body, len(body.encode())))
        await conn.execute(INSERT_AUDIT, audit_params(entry))

    async def payload_of_a_run(self, org_id: str, sha256: str) -> bool:
        """Whether a call of some run, or an approval request (members read requests
        whole), references this payload (a member may read it, as the run's report); a
        direct call's or a session's alone is the admins'."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT EXISTS (SELECT 1 FROM audit_log WHERE org_id = %s AND args_ref = %s
                                 AND run_id IS NOT NULL)
                    OR EXISTS (SELECT 1 FROM audit_log WHERE org_id = %s AND result_ref = %s
                                 AND run_id IS NOT NULL)
                    OR EXISTS (SELECT 1 FROM approvals WHERE org_id = %s
                                 AND %s IN (args_ref, decision_ref, evidence_ref)) AS found
                """,
                (org_id, sha256, org_id, sha256, org_id, sha256),
            )
            row = await cur.fetchone()
        return bool(row and row["found"])

    async def payloads(self, org_id: str, shas: Sequence[str]) -> dict[str, str]:
        """Stored payloads by sha256 (JSON text), those of this organisation only."""
        if not shas:
            return {}
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT sha256, body FROM payloads WHERE org_id = %s AND sha256 = ANY(%s)",
                (org_id, list(shas)),
            )
            return {r["sha256"]: r["body"] for r in await cur.fetchall()}

    async def audit_rows(
        self, org_id: str, *, run_id: UUID | None = None, gate_only: bool = False
    ) -> list[dict[str, Any]]:
        """The organisation's audit rows, oldest first: only a run's with ``run_id``; only
        the invocation gate's (tool calls, which always carry the mode) with ``gate_only``,
        leaving out the use-case rows (``agents.create``, ``tasks.submit``, ...)."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM audit_log
                WHERE org_id = %s AND (%s::uuid IS NULL OR run_id = %s)
                  AND (NOT %s OR mode IS NOT NULL)
                ORDER BY id
                """,
                (org_id, run_id, run_id, gate_only),
            )
            return list(await cur.fetchall())
