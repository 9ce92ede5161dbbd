"""What the invocation gate knows of one call and keeps of it: who asks and where the call
belongs (``InvocationContext``), its outcome (``Dispatch``), the facts gathered while it ran
(``CallFacts``) and its audit row (``audit_row``), with the hashes, source ids and decision
labels the row and the call's span carry. The gate itself is ``cortex_ray.act._dispatcher``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from cortex_ray._types import (
    ActionType,
    Agent,
    AgentMode,
    CapabilityTier,
    Observation,
    ObservationStatus,
    Principal,
    RunMode,
)
from cortex_ray.act._tools import ToolContext
from cortex_ray.governance import WorkflowVersion
from cortex_ray.observability import scrub
from cortex_ray.storage import AuditEntry

__all__ = [
    "CallFacts",
    "Dispatch",
    "InvocationContext",
    "access_of",
    "args_sha256",
    "audit_row",
    "gate_decision",
    "sha256_text",
    "source_ids",
    "source_versions",
]


@dataclass(frozen=True, slots=True)
class InvocationContext:
    """Who asks for a call and where it belongs (run and step, or session)."""

    agent: Agent
    caller: Principal | None
    mode: AgentMode
    run_id: UUID | None = None
    session_id: UUID | None = None
    step_index: int | None = None
    idempotency_key: str | None = None
    """The call's idempotency key when it is not the run step's (``f"{run_id}:{step_index}"``,
    derived): a turn's round (``f"turn:{turn_id}:{round}"``) or a direct call's
    ``Idempotency-Key``. ``None`` in a run: the step's key is used."""
    run_mode: RunMode = RunMode.EXECUTE
    """A dry run simulates, a shadow run proposes, every WRITE or ADMIN call it allows."""
    approval_id: UUID | None = None
    """The approved request this call carries out: the policy is evaluated again (a denial
    still denies), but does not ask for approval a second time."""
    workflow: WorkflowVersion | None = None
    """The workflow version the run follows: a call outside its allow-list is refused
    before any grant is read, and its approval gates apply."""


@dataclass(frozen=True, slots=True)
class Dispatch:
    """The outcome of one call: what the cycle observes, and what the audit log keeps."""

    observation: Observation
    audit: AuditEntry

    @property
    def refused_as_invalid(self) -> bool:
        """Unknown tool or invalid arguments: the call was never executed."""
        return self.observation.status is ObservationStatus.REFUSED and bool(
            self.audit.reason
            and self.audit.reason.startswith(("unknown tool", "invalid arguments"))
        )


@dataclass(slots=True)
class CallFacts:
    """What the audit row keeps of a call besides its status: the grants that allowed it,
    the hash and source ids of its (redacted) result, how many fields were redacted."""

    grant_ids: tuple[UUID, ...] = ()
    result_sha256: str | None = None
    source_ids: tuple[str, ...] = ()
    source_versions: tuple[str, ...] = ()
    redacted: int = 0
    result_payload: str | None = None
    """The whole (redacted, scrubbed) result as JSON, when over the inline limit."""


def sha256_text(text: str) -> str:
    """The SHA-256 of a text as the audit log keeps it (lone surrogates kept as they are)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def args_sha256(args: Any) -> str:
    """The hash of a call's arguments as the audit row keeps it (canonical JSON)."""
    return sha256_text(json.dumps(args, sort_keys=True, default=str, separators=(",", ":")))


def source_ids(output: Any, limit: int = 100) -> tuple[str, ...]:
    """The source ids a result carries (``source_id`` keys, ``source_ids`` lists, at any
    depth up to 4): the evidence the call returned, kept on its audit row."""
    found: dict[str, None] = {}

    def walk(v: Any, depth: int) -> None:
        if depth > 4 or len(found) >= limit:
            return
        if isinstance(v, dict):
            for k, item in v.items():
                if k == "source_id" and isinstance(item, str | int | UUID):
                    found[str(item)] = None
                elif k == "source_ids" and isinstance(item, list):
                    found.update((str(i), None) for i in item[:limit])
                else:
                    walk(item, depth + 1)
        elif isinstance(v, list):
            for item in v:
                walk(item, depth + 1)

    walk(output, 0)
    return tuple(list(found)[:limit])


def source_versions(output: Any, limit: int = 100) -> tuple[str, ...]:
    """``source_id@version`` of the results that carry both (knowledge hits do): which
    version of a source the call cited."""
    found: dict[str, None] = {}

    def walk(v: Any, depth: int) -> None:
        if depth > 4 or len(found) >= limit:
            return
        if isinstance(v, dict):
            sid, version = v.get("source_id"), v.get("version", v.get("source_version"))
            if isinstance(sid, str | int | UUID) and isinstance(version, int | str):
                found[f"{sid}@{version}"] = None
            for item in v.values():
                if isinstance(item, dict | list):
                    walk(item, depth + 1)
        elif isinstance(v, list):
            for item in v:
                walk(item, depth + 1)

    walk(output, 0)
    return tuple(list(found)[:limit])


def gate_decision(status: str, reason: str | None) -> str:
    """The gate's decision as the audit row records it."""
    if status == ObservationStatus.OK:
        return "allowed"
    if status == ObservationStatus.REFUSED:
        why = reason or ""
        if why.startswith("access denied"):
            return "denied"
        if why.startswith("approval required"):
            return "approval_required"
        if why.startswith("approval rejected") or why.startswith("approval expired"):
            return "rejected"
        return "refused"
    if status == ObservationStatus.CANCELLED:
        return "cancelled"
    if status == ObservationStatus.SIMULATED:
        return "simulated"
    if status == ObservationStatus.PROPOSED:
        return "proposed"
    return "error"


def audit_row(
    ctx: InvocationContext,
    tctx: ToolContext,
    tool_name: str,
    action_type: ActionType,
    tier: CapabilityTier,
    args: dict[str, Any],
    status: str,
    reason: str | None,
    duration_ms: float,
    connector: str | None = None,
    facts: CallFacts | None = None,
    *,
    inline_bytes: int,
) -> AuditEntry:
    """The audit row of one call: the gate's decision, its tier, hashes of the arguments
    and the result, the result's source ids and the grants used; arguments or a result over
    ``inline_bytes`` are stored once by hash (``AuditEntry.payloads``) and referenced."""
    facts = facts or CallFacts()
    limit = inline_bytes
    payloads: list[tuple[str, str]] = []
    stored_args: dict[str, Any] = args if isinstance(args, dict) else {"_invalid": repr(args)}
    args_ref = None
    # Scrubbed and encoded once here; the audit insert reuses the text.
    text = json.dumps(scrub(stored_args), default=str)
    if len(text) > limit:
        # Stored once by hash (every later row with the same arguments references it):
        # a history of large calls does not grow by a copy per row.
        args_ref = sha256_text(text)
        payloads.append((args_ref, text))
        stored_args = {"$payload": args_ref, "bytes": len(text.encode())}
        text = json.dumps(stored_args)
    result_ref = None
    if facts.result_payload is not None:
        result_ref = sha256_text(facts.result_payload)
        payloads.append((result_ref, facts.result_payload))
    return AuditEntry(
        org_id=ctx.agent.org_id,
        principal_id=tctx.principal.id,
        agent_id=ctx.agent.id,
        mode=ctx.mode,
        tool=tool_name,
        action_type=action_type,
        status=status,
        reason=reason,
        args=stored_args,
        duration_ms=duration_ms,
        run_id=ctx.run_id,
        step_index=ctx.step_index,
        session_id=ctx.session_id,
        idempotency_key=tctx.idempotency_key,
        tier=tier,
        decision=gate_decision(status, reason),
        input_sha256=args_sha256(args),
        result_sha256=facts.result_sha256,
        source_ids=facts.source_ids,
        connector=connector,
        grant_ids=facts.grant_ids,
        run_mode=None if ctx.run_id is None else ctx.run_mode.value,
        workflow_id=None if ctx.workflow is None else ctx.workflow.workflow_id,
        args_ref=args_ref,
        result_ref=result_ref,
        source_versions=facts.source_versions,
        payloads=tuple(payloads),
        args_json=text,
    )


def access_of(status: ObservationStatus, reason: str | None) -> str:
    """The gate's decision as a span reads it: ``denied`` (the grant or policy said no),
    ``refused`` (an unknown tool, invalid arguments, a hook), ``allowed`` (the tool ran)."""
    if status is ObservationStatus.REFUSED:
        if (reason or "").startswith("approval required"):
            return "approval"
        return "denied" if (reason or "").startswith("access denied") else "refused"
    if status in (ObservationStatus.SIMULATED, ObservationStatus.PROPOSED):
        return status.value.lower()
    return "allowed"
