"""SQL of connector instances and grants. Every statement filters by organisation."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from cortex_ray._exceptions import NotFoundError
from cortex_ray._types import utcnow
from cortex_ray.governance._types import (
    Approval,
    ApprovalStatus,
    ConnectorGrant,
    ConnectorInstance,
    RunLabel,
    RunLabelRecord,
    ShadowAcceptance,
)
from cortex_ray.observability import scrub
from cortex_ray.storage import Conn, Database

__all__ = ["GovernanceStore"]


def _instance(row: dict[str, Any]) -> ConnectorInstance:
    return ConnectorInstance(
        org_id=row["org_id"],
        connector=row["connector"],
        config=row["config"] or {},
        enabled=row["enabled"],
        health=row["health"],
        health_checked_at=row["health_checked_at"],
        created_at=row["created_at"],
    )


def _grant(row: dict[str, Any]) -> ConnectorGrant:
    return ConnectorGrant(
        id=row["id"],
        org_id=row["org_id"],
        principal_id=row["principal_id"],
        connector=row["connector"],
        tools=tuple(row["tools"] or ()),
        max_tier=row["max_tier"],
        constraints=row["constraints"] or {},
        approval=row["approval"],
        expires_at=row["expires_at"],
        created_by=row["created_by"],
        created_at=row["created_at"],
        revoked_at=row["revoked_at"],
    )


class GovernanceStore:
    """Typed reads and writes of ``connector_instances`` and ``connector_grants``, run
    labels and approval requests. An approval's arguments, decision or evidence larger than
    ``payload_inline_bytes`` (as JSON) are stored once in ``payloads`` and referenced from
    the row, as audit rows' are; every read resolves them."""

    def __init__(self, db: Database, *, payload_inline_bytes: int = 4096) -> None:
        self.db = db
        self.payload_inline_bytes = payload_inline_bytes

    async def put_instance(self, instance: ConnectorInstance) -> ConnectorInstance:
        """Install a connector in the organisation, or change its configuration and state."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                INSERT INTO connector_instances (org_id, connector, config, enabled, created_at)
                VALUES (%s, %s, %s, %s, %s)
                ON CONFLICT (org_id, connector)
                DO UPDATE SET config = EXCLUDED.config, enabled = EXCLUDED.enabled
                RETURNING *
                """,
                (
                    instance.org_id,
                    instance.connector,
                    Jsonb(instance.config),
                    instance.enabled,
                    instance.created_at,
                ),
            )
            row = await cur.fetchone()
        assert row is not None
        return _instance(row)

    async def instances(self, org_id: str) -> list[ConnectorInstance]:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM connector_instances WHERE org_id = %s ORDER BY connector",
                (org_id,),
            )
            return [_instance(r) for r in await cur.fetchall()]

    async def instance(self, org_id: str, connector: str) -> ConnectorInstance:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM connector_instances WHERE org_id = %s AND connector = %s",
                (org_id, connector),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"connector {connector!r} is not installed in this organisation")
        return _instance(row)

    async def set_health(self, org_id: str, connector: str, health: str) -> ConnectorInstance:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                UPDATE connector_instances SET health = %s, health_checked_at = %s
                WHERE org_id = %s AND connector = %s RETURNING *
                """,
                (health, utcnow(), org_id, connector),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"connector {connector!r} is not installed in this organisation")
        return _instance(row)

    async def create_grant(self, grant: ConnectorGrant) -> ConnectorGrant:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                INSERT INTO connector_grants (org_id, id, principal_id, connector, tools,
                    max_tier, constraints, approval, expires_at, created_by, created_at)
                SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s
                WHERE EXISTS (SELECT 1 FROM connector_instances
                              WHERE org_id = %s AND connector = %s)
                RETURNING *
                """,
                (
                    grant.org_id,
                    grant.id,
                    grant.principal_id,
                    grant.connector,
                    list(grant.tools),
                    grant.max_tier.value,
                    Jsonb(grant.constraints),
                    grant.approval.value,
                    grant.expires_at,
                    grant.created_by,
                    grant.created_at,
                    grant.org_id,
                    grant.connector,
                ),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(
                f"connector {grant.connector!r} is not installed in this organisation"
            )
        return _grant(row)

    async def grants(
        self, org_id: str, *, principal_id: str | None = None, include_revoked: bool = False
    ) -> list[ConnectorGrant]:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM connector_grants
                WHERE org_id = %s AND (%s::text IS NULL OR principal_id = %s)
                  AND (%s OR revoked_at IS NULL)
                ORDER BY created_at, id
                """,
                (org_id, principal_id, principal_id, include_revoked),
            )
            return [_grant(r) for r in await cur.fetchall()]

    async def revoke_grant(self, org_id: str, grant_id: UUID) -> ConnectorGrant:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                UPDATE connector_grants SET revoked_at = coalesce(revoked_at, %s)
                WHERE org_id = %s AND id = %s RETURNING *
                """,
                (utcnow(), org_id, grant_id),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"no grant {grant_id} in this organisation")
        return _grant(row)

    async def for_call(
        self, org_id: str, connector: str, principal_ids: Sequence[str]
    ) -> tuple[ConnectorInstance | None, list[ConnectorGrant]]:
        """The instance and the unrevoked grants a call of ``connector`` by these principals
        (or ``"*"``) could use, in one statement."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT to_jsonb(i) AS instance,
                       coalesce((SELECT jsonb_agg(to_jsonb(g) ORDER BY g.created_at, g.id)
                                 FROM connector_grants g
                                 WHERE g.org_id = i.org_id AND g.connector = i.connector
                                   AND g.revoked_at IS NULL
                                   AND g.principal_id = ANY(%s)), '[]') AS grants
                FROM connector_instances i WHERE i.org_id = %s AND i.connector = %s
                """,
                ([*principal_ids, "*"], org_id, connector),
            )
            row = await cur.fetchone()
        if row is None:
            return None, []
        instance = ConnectorInstance.model_validate(row["instance"])
        return instance, [ConnectorGrant.model_validate(g) for g in row["grants"]]

    async def put_label(
        self, org_id: str, run_id: UUID, label: RunLabel, note: str, by: str
    ) -> RunLabelRecord:
        """Label a run (a later label replaces the earlier, with its author and time)."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                INSERT INTO run_labels (org_id, run_id, label, note, labelled_by, labelled_at)
                VALUES (%s, %s, %s, %s, %s, %s)
                ON CONFLICT (org_id, run_id) DO UPDATE SET label = EXCLUDED.label,
                    note = EXCLUDED.note, labelled_by = EXCLUDED.labelled_by,
                    labelled_at = EXCLUDED.labelled_at
                RETURNING *
                """,
                (org_id, run_id, label.value, note, by, utcnow()),
            )
            row = await cur.fetchone()
        assert row is not None
        return _label(row)

    async def label(self, org_id: str, run_id: UUID) -> RunLabelRecord | None:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM run_labels WHERE org_id = %s AND run_id = %s", (org_id, run_id)
            )
            row = await cur.fetchone()
        return None if row is None else _label(row)

    async def shadow_acceptance(
        self, org_id: str, agent_id: UUID | None = None
    ) -> list[ShadowAcceptance]:
        """Per agent: its shadow runs, their labels, and the proposals they made."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT r.agent_id, a.name AS agent_name, count(*) AS runs,
                       count(l.run_id) AS labelled,
                       count(*) FILTER (WHERE l.label = 'accepted') AS accepted,
                       count(*) FILTER (WHERE l.label = 'rejected') AS rejected,
                       count(*) FILTER (WHERE l.label = 'mixed') AS mixed,
                       coalesce(sum((SELECT count(*) FROM audit_log x
                                     WHERE x.org_id = r.org_id AND x.run_id = r.id
                                       AND x.decision = 'proposed')), 0) AS proposals
                FROM task_runs r
                JOIN agents a ON a.org_id = r.org_id AND a.id = r.agent_id
                LEFT JOIN run_labels l ON l.org_id = r.org_id AND l.run_id = r.id
                WHERE r.org_id = %s AND r.run_mode = 'shadow'
                  AND (%s::uuid IS NULL OR r.agent_id = %s)
                GROUP BY r.agent_id, a.name
                ORDER BY a.name
                """,
                (org_id, agent_id, agent_id),
            )
            rows = await cur.fetchall()
        return [
            ShadowAcceptance(
                **{k: r[k] for k in ("agent_id", "agent_name", "runs", "labelled", "accepted")},
                rejected=r["rejected"],
                mixed=r["mixed"],
                proposals=int(r["proposals"]),
                acceptance_rate=(r["accepted"] / r["labelled"]) if r["labelled"] else None,
            )
            for r in rows
        ]

    # approvals ------------------------------------------------------------------------------

    def _stored(self, value: Any) -> tuple[Any, str | None, str | None]:
        """``value`` as the row keeps it: itself, or over the threshold a reference
        ``{"$payload": sha256, "bytes": n}`` (with the sha256 and the text to store)."""
        text = json.dumps(value, default=str)
        if len(text) <= self.payload_inline_bytes:
            return value, None, None
        sha = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        return {"$payload": sha, "bytes": len(text.encode())}, sha, text

    async def insert_approval(
        self, conn: Conn, approval: Approval, *, on_conflict_nothing: bool = False
    ) -> None:
        """Record an approval request in the caller's (the driver's fenced) transaction,
        with the payloads it references (each kept once per organisation)."""
        a = approval
        # Scrubbed before anything is hashed or kept: the evidence holds earlier calls'
        # arguments, which may carry what the scrubber takes for a credential.
        args, args_ref, args_text = self._stored(scrub(a.args))
        decision, decision_ref, decision_text = self._stored(a.decision)
        evidence, evidence_ref, evidence_text = self._stored(scrub(a.evidence))
        for ref, text in (
            (args_ref, args_text),
            (decision_ref, decision_text),
            (evidence_ref, evidence_text),
        ):
            if ref is not None and text is not None:
                await conn.execute(_INSERT_PAYLOAD, (a.org_id, ref, text, len(text.encode())))
        await conn.execute(
            """
            INSERT INTO approvals (org_id, id, run_id, session_id, turn_id, step_index, tool,
                args, tier, decision, evidence, reason, requested_by, approvers, status,
                expires_at, created_at, args_ref, decision_ref, evidence_ref)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
                    %s)
            """
            + (" ON CONFLICT DO NOTHING" if on_conflict_nothing else ""),
            (
                a.org_id, a.id, a.run_id, a.session_id, a.turn_id, a.step_index, a.tool,
                Jsonb(args), a.tier, Jsonb(decision), Jsonb(evidence), a.reason,
                a.requested_by, list(a.approvers), a.status.value, a.expires_at, a.created_at,
                args_ref, decision_ref, evidence_ref,
            ),
        )  # fmt: skip

    async def _approvals(self, rows: Sequence[dict[str, Any]]) -> list[Approval]:
        """Rows as approvals, their referenced fields resolved (one read for all)."""
        refs = {r[k] for r in rows for k in _REFS if r.get(k)}
        bodies: dict[str, Any] = {}
        if refs:
            org_id = rows[0]["org_id"]  # every read here is of one organisation's rows
            async with self.db.connection() as conn:
                cur = await conn.execute(
                    "SELECT sha256, body FROM payloads WHERE org_id = %s AND sha256 = ANY(%s)",
                    (org_id, sorted(refs)),
                )
                bodies = {p["sha256"]: json.loads(p["body"]) for p in await cur.fetchall()}
        found = []
        for row in rows:
            row = dict(row)
            for ref, field in _REFS.items():
                if row.get(ref) and row[ref] in bodies:
                    row[field] = bodies[row[ref]]
            found.append(_approval(row))
        return found

    async def _approval_or_none(self, row: dict[str, Any] | None) -> Approval | None:
        return None if row is None else (await self._approvals([row]))[0]

    async def approval(self, org_id: str, approval_id: UUID) -> Approval:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM approvals WHERE org_id = %s AND id = %s", (org_id, approval_id)
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"no approval {approval_id} in this organisation")
        return (await self._approvals([row]))[0]

    async def approval_for_step(
        self, org_id: str, run_id: UUID, step_index: int
    ) -> Approval | None:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM approvals WHERE org_id = %s AND run_id = %s AND step_index = %s",
                (org_id, run_id, step_index),
            )
            row = await cur.fetchone()
        return await self._approval_or_none(row)

    async def approval_for_round(
        self, org_id: str, turn_id: UUID, round_index: int
    ) -> Approval | None:
        """The request an interactive turn made in a tool round (a recovered turn finds its
        own again instead of asking twice)."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM approvals WHERE org_id = %s AND turn_id = %s AND step_index = %s",
                (org_id, turn_id, round_index),
            )
            row = await cur.fetchone()
        return await self._approval_or_none(row)

    async def put_turn_approval(self, approval: Approval) -> Approval:
        """Record a turn's request, or find the one its round already has (one per round)."""
        assert approval.turn_id is not None
        async with self.db.transaction() as conn:
            await self.insert_approval(conn, approval, on_conflict_nothing=True)
        found = await self.approval_for_round(
            approval.org_id, approval.turn_id, approval.step_index
        )
        assert found is not None
        return found

    async def approvals(
        self,
        org_id: str,
        *,
        status: ApprovalStatus | None = None,
        run_id: UUID | None = None,
        limit: int = 200,
    ) -> list[Approval]:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM approvals WHERE org_id = %s
                  AND (%s::text IS NULL OR status = %s) AND (%s::uuid IS NULL OR run_id = %s)
                ORDER BY created_at, id LIMIT %s
                """,
                (
                    org_id,
                    None if status is None else status.value,
                    None if status is None else status.value,
                    run_id,
                    run_id,
                    limit,
                ),
            )
            rows = await cur.fetchall()
        return await self._approvals(rows)

    async def decide(
        self,
        org_id: str,
        approval_id: UUID,
        status: ApprovalStatus,
        by: str | None,
        note: str = "",
    ) -> Approval | None:
        """Decide a PENDING request and put its run back to RUNNING, in one transaction;
        ``None`` when it was no longer pending (decided, or expired, meanwhile)."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                UPDATE approvals SET status = %s, decided_by = %s, decided_at = %s, note = %s
                WHERE org_id = %s AND id = %s AND status = 'PENDING' RETURNING *
                """,
                (status.value, by, utcnow(), note, org_id, approval_id),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            await conn.execute(
                """
                UPDATE task_runs SET status = 'RUNNING'
                WHERE org_id = %s AND id = %s AND status = 'AWAITING_APPROVAL'
                """,
                (org_id, row["run_id"]),
            )
        return await self._approval_or_none(row)

    async def expire_due(self, limit: int = 1000) -> list[Approval]:
        """Expire the PENDING requests whose time is up, in every organisation (the
        supervisor's sweep, like orphaned runs), each run back to RUNNING: an expired
        request counts as a rejection."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                WITH due AS (
                    SELECT org_id, id FROM approvals
                    WHERE status = 'PENDING' AND expires_at <= now()
                    ORDER BY expires_at LIMIT %s FOR UPDATE SKIP LOCKED
                )
                UPDATE approvals a SET status = 'EXPIRED', decided_at = now()
                FROM due WHERE a.org_id = due.org_id AND a.id = due.id RETURNING a.*
                """,
                (limit,),
            )
            rows = await cur.fetchall()
            for row in rows:
                await conn.execute(
                    """
                    UPDATE task_runs SET status = 'RUNNING'
                    WHERE org_id = %s AND id = %s AND status = 'AWAITING_APPROVAL'
                    """,
                    (row["org_id"], row["run_id"]),
                )
        # Rows of several organisations: each resolved among its own organisation's payloads.
        return [a for r in rows for a in await self._approvals([r])]


_REFS = {"args_ref": "args", "decision_ref": "decision", "evidence_ref": "evidence"}
"""An approval's payload reference columns, and the field each stands for."""

_INSERT_PAYLOAD = """
INSERT INTO payloads (org_id, sha256, body, bytes) VALUES (%s, %s, %s, %s)
ON CONFLICT (org_id, sha256) DO NOTHING
"""


def _approval(row: dict[str, Any]) -> Approval:
    return Approval(
        **{k: row[k] for k in Approval.model_fields if k not in ("approvers", "payloads")},
        approvers=tuple(row["approvers"] or ()),
        payloads=tuple(row[k] for k in _REFS if row.get(k)),
    )


def _label(row: dict[str, Any]) -> RunLabelRecord:
    return RunLabelRecord(
        run_id=row["run_id"],
        label=row["label"],
        note=row["note"],
        labelled_by=row["labelled_by"],
        labelled_at=row["labelled_at"],
    )
