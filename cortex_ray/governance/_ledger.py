"""A run's ledger (read by the workflow use cases, ``Runtime.workflows``).

The ledger is a view over the record, not a second copy: the run row (version, principal,
mode, inputs), its steps (what DECIDE proposed), the gate's audit rows (what was executed,
simulated, proposed or refused, with the evidence each result cited), its approval requests
and label, read together as one ordered timeline. Large arguments and results are payloads
stored once by hash (``payloads``); events reference them, and ``payloads=True`` returns
each referenced payload once beside the events."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray._types import RunMode, TaskRun
from cortex_ray.governance._types import RunLabelRecord
from cortex_ray.governance._workflows import EvidenceCheck, WorkflowVersion, evidence_of

__all__ = ["LedgerEvent", "LedgerKey", "RunLedger", "is_sha256", "ledger_page", "parse_cursor"]

_SHA = re.compile(r"^[0-9a-f]{64}$")
LedgerKey = tuple[int, int, int, int]
"""An event's place in a ledger's logical order (see ``_timeline``): a page's cursor."""
_CURSOR = re.compile(r"^\d{1,9}\.\d{1,9}\.\d{1,9}\.\d{1,19}$")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LedgerEvent(_Model):
    """One event of a run's timeline.

    ``kind``: ``started``; per step ``decided`` (the action DECIDE proposed), ``call`` (what
    the gate did with it: ``outcome`` allowed, simulated, proposed, denied, refused,
    approval_required, rejected, error, ...), ``approval_requested``, ``approval_decided``;
    ``request`` (a use case on the run: resume, cancel); ``finished``; ``evidence`` (the
    required evidence checked); ``labelled``. ``payloads``: the sha256 of the stored
    payloads the event references."""

    seq: int
    kind: str
    at: datetime | None = None
    step_index: int | None = None
    tool: str | None = None
    outcome: str | None = None
    summary: str = ""
    data: dict[str, Any] = Field(default_factory=dict)
    payloads: tuple[str, ...] = ()


class RunLedger(_Model):
    """A run's ledger: what it followed and who started it how, and its timeline."""

    run_id: UUID
    agent_id: UUID
    workflow: str | None
    workflow_id: UUID | None
    version: int | None
    workflow_version_id: UUID | None
    risk: str | None
    requested_by: str | None
    caller_id: str | None
    run_mode: RunMode
    status: str
    reason: str | None
    inputs: dict[str, Any] | None
    evidence: EvidenceCheck | None
    label: RunLabelRecord | None
    events: tuple[LedgerEvent, ...]
    payloads: dict[str, Any] = Field(default_factory=dict)
    """Each payload the events reference once (sha256 → value), when asked for."""
    next_after: str | None = None
    """The cursor of the next page of events (``after``); ``None``: this page is the last."""


def is_sha256(text: str) -> bool:
    """Whether ``text`` names a payload: a sha256 in lowercase hex."""
    return _SHA.match(text) is not None


def ledger_page(
    run: TaskRun,
    rows: list[dict[str, Any]],
    approvals: Iterable[Any],
    label: RunLabelRecord | None,
    version: WorkflowVersion | None,
    *,
    after: LedgerKey | None = None,
    limit: int | None = None,
) -> RunLedger:
    """A run's ledger from its record (``rows``: its audit rows, oldest first), its events
    those after the cursor ``after`` in the timeline's logical order, at most ``limit``
    (``None``: all); no payloads (the caller reads those the events reference)."""
    gate = [r for r in rows if r["mode"] is not None]
    evidence = None
    if version is not None:
        evidence = evidence_of(gate, version.required_evidence)
    timeline = _timeline(run, rows, approvals, label, version, evidence)
    if after is not None:
        timeline = [(key, e) for key, e in timeline if key > after]
    page = timeline if limit is None else timeline[:limit]
    more = len(page) < len(timeline)
    return RunLedger(
        run_id=run.id,
        agent_id=run.agent_id,
        workflow=None if version is None else version.workflow,
        workflow_id=None if version is None else version.workflow_id,
        version=None if version is None else version.version,
        workflow_version_id=run.workflow_version_id,
        risk=None if version is None else version.risk.value,
        requested_by=run.requested_by,
        caller_id=run.caller_id,
        run_mode=run.run_mode,
        status=run.status.value,
        reason=run.reason,
        inputs=run.workflow_inputs,
        evidence=evidence,
        label=label,
        events=tuple(e for _, e in page),
        next_after=_cursor(page[-1][0]) if more else None,
    )


def _timeline(
    run: TaskRun,
    rows: list[dict[str, Any]],
    approvals: Iterable[Any],
    label: RunLabelRecord | None,
    version: WorkflowVersion | None,
    evidence: EvidenceCheck | None,
) -> list[tuple[LedgerKey, LedgerEvent]]:
    """The events in order, each with its key in that order (a page's cursor): the start;
    then per step what was proposed, the gate's answers, approvals (in that logical order:
    the clocks of the rows differ); then the end, the evidence check and the label. ``seq``
    numbers the whole timeline, whatever page an event is read in."""
    keyed: list[tuple[LedgerKey, dict[str, Any]]] = []

    def add(key: LedgerKey, **event: Any) -> None:
        keyed.append((key, event))

    add(
        (0, 0, 0, 0),
        kind="started",
        at=run.created_at,
        outcome=run.run_mode.value,
        summary=run.goal[:500],
        data={
            "requested_by": run.requested_by,
            "caller_id": run.caller_id,
            "max_steps": run.max_steps,
            "workflow": None if version is None else version.label,
        },
    )
    for step in run.steps:
        action = step.action
        add(
            (1, step.step_index, 0, 0),
            kind="decided",
            at=step.created_at,
            step_index=step.step_index,
            tool=None if action is None else action.tool,
            outcome=step.decision.value,
            summary=(step.note or step.message or "")[:500],
            data={
                "candidates": [
                    {"tool": c.tool or c.kind, "score": c.score, "valid": c.valid}
                    for c in step.candidates
                ],
                "selected": step.selected,
                "args_sha256": None if action is None else _args_sha256(action.args),
            },
        )
    last_step: int | None = None  # the step of the latest gate row so far (ids are ordered)
    for row in rows:
        if row["mode"] is None:  # a use case on the run
            if row["tool"] == "tasks.submit":
                continue  # the start itself
            add(
                (0, 0, 1, row["id"]) if last_step is None else (1, last_step, 5, row["id"]),
                kind="request",
                at=row["at"],
                tool=row["tool"],
                outcome=row["status"],
                summary=row["reason"] or "",
                data={"principal_id": row["principal_id"], "args": row["args"]},
            )
            continue
        last_step = row["step_index"] if row["step_index"] is not None else last_step
        decision = row["decision"] or ("allowed" if row["status"] == "OK" else "error")
        refs = tuple(r for r in (row.get("args_ref"), row.get("result_ref")) if r)
        add(
            (1, row["step_index"] or 0, 1 if decision == "approval_required" else 4, row["id"]),
            kind="call",
            at=row["at"],
            step_index=row["step_index"],
            tool=row["tool"],
            outcome=decision,
            summary=row["reason"] or "",
            data={
                "tier": row["tier"],
                "connector": row["connector"],
                "status": row["status"],
                "args": row["args"],
                "input_sha256": row["input_sha256"],
                "result_sha256": row["result_sha256"],
                "args_ref": row.get("args_ref"),
                "result_ref": row.get("result_ref"),
                "source_ids": list(row["source_ids"] or ()),
                "source_versions": list(row.get("source_versions") or ()),
                "grant_ids": [str(g) for g in row["grant_ids"] or ()],
                "duration_ms": row["duration_ms"],
            },
            payloads=refs,
        )
    for a in approvals:
        add(
            (1, a.step_index, 2, 0),
            kind="approval_requested",
            at=a.created_at,
            step_index=a.step_index,
            tool=a.tool,
            outcome="PENDING",
            summary=a.reason,
            data={"approval_id": str(a.id), "tier": a.tier, "expires_at": a.expires_at.isoformat()},
            payloads=a.payloads,
        )
        if a.decided_at is not None:
            add(
                (1, a.step_index, 3, 0),
                kind="approval_decided",
                at=a.decided_at,
                step_index=a.step_index,
                tool=a.tool,
                outcome=a.status.value,
                summary=a.note,
                data={"approval_id": str(a.id), "decided_by": a.decided_by},
            )
    if run.finished_at is not None:
        add(
            (3, 0, 0, 0),
            kind="finished",
            at=run.finished_at,
            outcome=run.status.value,
            summary=run.reason or "",
            data={"has_result": run.result is not None},
        )
    if evidence is not None and evidence.required.required and run.finished_at is not None:
        add(
            (3, 0, 1, 0),
            kind="evidence",
            at=run.finished_at,
            outcome="satisfied" if evidence.satisfied else "missing",
            summary="" if evidence.satisfied else evidence.finding(),
            data=evidence.model_dump(mode="json"),
        )
    if label is not None:
        add(
            (4, 0, 0, 0),
            kind="labelled",
            at=label.labelled_at,
            outcome=label.label.value,
            summary=label.note,
            data={"labelled_by": label.labelled_by},
        )
    keyed.sort(key=lambda k: k[0])
    return [(key, LedgerEvent(seq=i, **event)) for i, (key, event) in enumerate(keyed)]


def _cursor(key: LedgerKey) -> str:
    # The event's place in the logical order, not its index: an event recorded meanwhile
    # before the cursor (a request on a running run) cannot shift the next page.
    return ".".join(map(str, key))


def parse_cursor(after: str) -> LedgerKey:
    if not _CURSOR.match(after):
        raise InvalidRequestError(
            f"after: {after[:100]!r} is not a ledger cursor (the nextAfter of a page)"
        )
    a, b, c, d = (int(part) for part in after.split("."))
    return a, b, c, d


def _args_sha256(args: Any) -> str:
    # The gate's hash of a call's arguments (audit ``input_sha256``): the proposal and the
    # call it became are matched by it, without copying the arguments.
    text = json.dumps(args, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
