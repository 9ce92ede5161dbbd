"""Procedural memory: the agent's persona and skills, changed only by a person's approval.

The agent cannot rewrite its own procedures: it proposes an edit (``propose_edit``, a
PENDING row in ``procedural_proposals``), and a USER principal of the organisation decides
it (``decide_proposal``). An approval changes the ``agents`` row, writes a PROCEDURAL memory
recording the change and marks the proposal APPROVED, in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal
from uuid import UUID, uuid4

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from cortex_ray._exceptions import AccessDeniedError, InvalidRequestError, NotFoundError
from cortex_ray._types import (
    MemoryKind,
    Principal,
    PrincipalKind,
    ProceduralProposal,
    ProposalStatus,
)
from cortex_ray.memory._prepare import MemoryPreparer, PreparedMemory
from cortex_ray.memory._writes import MemoryWriter
from cortex_ray.storage import Conn, Database

__all__ = ["ProceduralEdits"]


def _proposal(row: dict[str, Any]) -> ProceduralProposal:
    value = row["value"]
    return ProceduralProposal(
        id=row["id"],
        org_id=row["org_id"],
        agent_id=row["agent_id"],
        field=row["field"],
        value=tuple(value) if isinstance(value, list) else value,
        rationale=row["rationale"],
        status=ProposalStatus(row["status"]),
        proposed_by=row["proposed_by"],
        decided_by=row["decided_by"],
        proposed_at=row["proposed_at"],
        decided_at=row["decided_at"],
    )


def _agent_principal_id(agent_id: UUID) -> str:
    # The id Agent.principal() gives an agent's own principal.
    return f"agent:{agent_id}"


class ProceduralEdits:
    """Stores proposed edits of an agent's persona or skills, and applies approved ones.

    Args:
        db: The database.
        preparer: Prepares the PROCEDURAL memory of an approved change (before the
            transaction).
        writer: Writes it, in the approval's transaction.
    """

    def __init__(self, db: Database, preparer: MemoryPreparer, writer: MemoryWriter) -> None:
        self.db = db
        self.preparer = preparer
        self.writer = writer

    async def propose_edit(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        field: Literal["persona", "skills"],
        value: str | Sequence[str],
        rationale: str,
        proposed_by: Principal,
        idempotency_key: str | None = None,
        run_id: UUID | None = None,
        step_index: int | None = None,
        session_id: UUID | None = None,
    ) -> ProceduralProposal:
        """Store a PENDING edit of an agent's persona or skills, for a person to decide.

        This is the only way procedural memory changes from inside the agent: nothing
        takes effect until :meth:`decide_proposal` approves it. With an
        ``idempotency_key`` already stored, the proposal stored then is returned (as it
        is now) and nothing is written, also when two such calls run at once.

        Args:
            org_id: The organisation.
            agent_id: The agent to change.
            field: ``"persona"`` (a string) or ``"skills"`` (a list of strings).
            value: The new persona, or the new full list of skills.
            rationale: Why, in the proposer's words.
            proposed_by: Who proposes (the agent's own principal, typically).
            idempotency_key: The proposing tool's key (``ToolContext.idempotency_key``).
            run_id: The run that proposes it.
            step_index: The run step that proposes it.
            session_id: The session that proposes it.

        Raises:
            AccessDeniedError: The proposer belongs to another organisation.
            InvalidRequestError: The value does not fit the field.
            NotFoundError: No such agent in the organisation.
        """
        if proposed_by.org_id != org_id:
            raise AccessDeniedError("a principal may only propose edits in its own organisation")
        stored: str | list[str]
        if field == "persona":
            if not isinstance(value, str):
                raise InvalidRequestError("a persona edit takes a string")
            stored = value
        elif field == "skills":
            if isinstance(value, str) or not all(isinstance(s, str) for s in value):
                raise InvalidRequestError("a skills edit takes a list of strings")
            stored = [s.strip() for s in value if s.strip()]
        else:
            raise InvalidRequestError(f"procedural edits change persona or skills, not {field!r}")
        try:
            async with self.db.transaction() as conn:
                # A concurrent twin waits here for the first to commit, then does nothing;
                # either way the key's row is read back.
                cur = await conn.execute(
                    """
                    INSERT INTO procedural_proposals (org_id, id, agent_id, field, value,
                                                      rationale, status, proposed_by,
                                                      idempotency_key, run_id, step_index,
                                                      session_id)
                    VALUES (%s, %s, %s, %s, %s, %s, 'PENDING', %s, %s, %s, %s, %s)
                    ON CONFLICT (org_id, idempotency_key) WHERE idempotency_key IS NOT NULL
                    DO NOTHING
                    RETURNING *
                    """,
                    (
                        org_id,
                        uuid4(),
                        agent_id,
                        field,
                        Jsonb(stored),
                        rationale,
                        proposed_by.id,
                        idempotency_key,
                        run_id,
                        step_index,
                        session_id,
                    ),
                )
                row = await cur.fetchone()
                if row is None:
                    cur = await conn.execute(
                        "SELECT * FROM procedural_proposals "
                        "WHERE org_id = %s AND idempotency_key = %s",
                        (org_id, idempotency_key),
                    )
                    row = await cur.fetchone()
        except psycopg.errors.ForeignKeyViolation as exc:
            raise NotFoundError(f"agent {agent_id} not found in organisation {org_id!r}") from exc
        assert row is not None
        return _proposal(row)

    async def _get_proposal(
        self, conn: Conn, org_id: str, proposal_id: UUID, *, lock: bool
    ) -> ProceduralProposal:
        query = "SELECT * FROM procedural_proposals WHERE org_id = %s AND id = %s"
        cur = await conn.execute(query + (" FOR UPDATE" if lock else ""), (org_id, proposal_id))
        row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"proposal {proposal_id} not found in organisation {org_id!r}")
        return _proposal(row)

    async def decide_proposal(
        self, *, org_id: str, proposal_id: UUID, approver: Principal, approve: bool
    ) -> ProceduralProposal:
        """Approve or reject a pending procedural edit.

        Approval, in one transaction, changes the agent's persona or skills, writes a
        PROCEDURAL memory recording the change, and marks the proposal APPROVED.

        Args:
            org_id: The organisation.
            proposal_id: The proposal.
            approver: A person (a USER principal of the organisation, not the agent).
            approve: True to approve, False to reject.

        Raises:
            AccessDeniedError: The approver is not a person of this organisation, or is the
                agent itself.
            NotFoundError: No such proposal in the organisation.
            InvalidRequestError: The proposal was already decided.
        """
        if approver.kind is not PrincipalKind.USER or approver.org_id != org_id:
            raise AccessDeniedError(
                "only a person of the organisation may decide a procedural edit"
            )
        async with self.db.transaction() as conn:
            proposal = await self._get_proposal(conn, org_id, proposal_id, lock=False)
        self._check_decidable(proposal, approver)
        prepared: PreparedMemory | None = None
        if approve:
            # Embedding and importance before the transaction, like every write.
            prepared = await self.preparer.prepare(
                org_id=org_id,
                agent_id=proposal.agent_id,
                kind=MemoryKind.PROCEDURAL,
                content=_change_text(proposal),
                subject=proposal.field,
                metadata={"proposal_id": str(proposal.id), "approved_by": approver.id},
            )
        status = ProposalStatus.APPROVED if approve else ProposalStatus.REJECTED
        async with self.db.transaction() as conn:
            # Re-read under a row lock: a concurrent decision may have won meanwhile.
            proposal = await self._get_proposal(conn, org_id, proposal_id, lock=True)
            self._check_decidable(proposal, approver)
            if prepared is not None:
                column = sql.Identifier(proposal.field)
                value = (
                    list(proposal.value) if isinstance(proposal.value, tuple) else proposal.value
                )
                await conn.execute(
                    sql.SQL(
                        "UPDATE agents SET {column} = %s, updated_at = now() "
                        "WHERE org_id = %s AND id = %s"
                    ).format(column=column),
                    (value, org_id, proposal.agent_id),
                )
                await self.writer.write_prepared(conn, [prepared])
            cur = await conn.execute(
                """
                UPDATE procedural_proposals
                SET status = %s, decided_by = %s, decided_at = now()
                WHERE org_id = %s AND id = %s
                RETURNING *
                """,
                (status.value, approver.id, org_id, proposal_id),
            )
            row = await cur.fetchone()
        assert row is not None
        return _proposal(row)

    @staticmethod
    def _check_decidable(proposal: ProceduralProposal, approver: Principal) -> None:
        if approver.id == _agent_principal_id(proposal.agent_id):
            raise AccessDeniedError("an agent may not decide edits of its own procedural memory")
        if proposal.status is not ProposalStatus.PENDING:
            raise InvalidRequestError(
                f"proposal {proposal.id} is already {proposal.status.value.lower()}"
            )

    async def proposals(
        self, *, org_id: str, agent_id: UUID, status: ProposalStatus | None = None
    ) -> list[ProceduralProposal]:
        """An agent's procedural edit proposals, oldest first (only ``status`` when given)."""
        wanted = None if status is None else status.value
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM procedural_proposals
                WHERE org_id = %s AND agent_id = %s AND (%s::text IS NULL OR status = %s)
                ORDER BY proposed_at, id
                """,
                (org_id, agent_id, wanted, wanted),
            )
            return [_proposal(row) for row in await cur.fetchall()]


def _change_text(proposal: ProceduralProposal) -> str:
    if isinstance(proposal.value, tuple):
        return f"skills changed to: {', '.join(proposal.value) or '(none)'}"
    return f"{proposal.field} changed to: {proposal.value}"
