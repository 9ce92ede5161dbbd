"""The HTTP API's request and response bodies: camelCase JSON, unknown fields refused.

Requests are validated here, before anything reaches the runtime; responses are built from
the core's types by the ``from_*`` functions. Free text may not contain NUL characters or
lone surrogates (PostgreSQL cannot store them), anywhere in a body, free-form objects
included.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from cortex_ray import (
    ActionType,
    Agent,
    AgentAction,
    AgentChanges,
    AgentMode,
    Candidate,
    CapabilityTier,
    DecisionKind,
    Grant,
    MemoryKind,
    MemoryRecord,
    Observation,
    ObservationStatus,
    Principal,
    PrincipalKind,
    ProceduralProposal,
    ProposalStatus,
    RunMode,
    RunStatus,
    ScoredMemory,
    Session,
    SessionStatus,
    Step,
    TaskRun,
    ToolSpec,
    Turn,
)
from cortex_ray.evals import (
    Check,
    EvalCase,
    EvalMode,
    EvalRunSummary,
    EvalSuite,
    EvalSuiteSummary,
)
from cortex_ray.knowledge import Fusion, SearchHit, Tier
from cortex_ray.observability import RunTrace
from cortex_ray.observability.diagnostics import Diagnosis
from cortex_ray.storage import SessionMessage, TurnRecord, TurnStatus

__all__ = [
    "ORG_PATTERN",
    "AgentBody",
    "AgentCreate",
    "AgentList",
    "AgentUpdate",
    "ApiError",
    "DiagnosticsBody",
    "ErrorBody",
    "ErrorDetail",
    "EvalCaseCreate",
    "EvalRunCreate",
    "EvalRunList",
    "EvalSuiteCreate",
    "EvalSuiteList",
    "FactList",
    "GrantBody",
    "Health",
    "KnowledgeHit",
    "KnowledgeSearch",
    "MemoryBody",
    "MemoryHit",
    "MemorySearch",
    "MessageCreate",
    "MessageList",
    "ObservationBody",
    "PrincipalBody",
    "ProposalBody",
    "ProposalDecision",
    "ProposalList",
    "SessionBody",
    "SessionCreate",
    "SessionEnded",
    "StepBody",
    "TaskAccepted",
    "TaskBody",
    "TaskCancel",
    "TaskCreate",
    "TaskList",
    "TaskPayload",
    "TaskSummary",
    "TaskTrace",
    "ToolBody",
    "ToolCall",
    "ToolList",
    "TurnBody",
    "TurnDone",
    "TurnError",
    "TurnStarted",
    "TurnStatusBody",
    "TurnTrace",
    "from_agent",
    "from_eval_suite",
    "from_observation",
    "from_run",
    "from_session",
    "has_bad_text",
]

ORG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
"""Organisation ids, as the ``organisations`` table's CHECK constraint allows them."""

MAX_TEXT = 20_000
MAX_JSON_DEPTH = 32


def _clean(value: str) -> str:
    if "\x00" in value:
        raise ValueError("text must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return value


def has_bad_text(value: Any, depth: int = 0) -> str | None:
    """Why a free-form JSON value cannot be stored (NUL, lone surrogate, too deep), or None."""
    if depth > MAX_JSON_DEPTH:
        return f"nested deeper than {MAX_JSON_DEPTH} levels"
    items: list[Any]
    if isinstance(value, str):
        items = []
        try:
            _clean(value)
        except ValueError as exc:
            return str(exc)
    elif isinstance(value, dict):
        for key in value:
            if (reason := has_bad_text(key, depth + 1)) is not None:
                return reason
        items = list(value.values())
    elif isinstance(value, list):
        items = value
    else:
        return None
    for item in items:
        if (reason := has_bad_text(item, depth + 1)) is not None:
            return reason
    return None


def _clean_json(value: dict[str, Any]) -> dict[str, Any]:
    reason = has_bad_text(value)
    if reason is not None:
        raise ValueError(reason)
    return value


Text = Annotated[str, AfterValidator(_clean)]
Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_clean)]
LongText = Annotated[str, Field(max_length=MAX_TEXT), AfterValidator(_clean)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_clean_json)]


class _Body(BaseModel):
    """Requests: camelCase on the wire, unknown fields are an error."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class _Out(BaseModel):
    """Responses: camelCase on the wire."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


# errors ----------------------------------------------------------------------------------


class ErrorDetail(_Out):
    """One reason a request was refused (validation errors name the field)."""

    loc: list[str | int] = Field(default_factory=list, description="where: body, query, path")
    msg: str
    type: str = ""


class ErrorBody(_Out):
    code: str = Field(description="a stable machine-readable code, e.g. not_found")
    message: str = Field(description="what went wrong, for a person")
    details: list[ErrorDetail] = Field(default_factory=list)
    correlation_id: str = Field(
        description="the request's correlation id (also the X-Correlation-Id header): the "
        "server log has the full detail under it"
    )


class ApiError(_Out):
    """The body of every 4xx and 5xx response."""

    error: ErrorBody


# health ----------------------------------------------------------------------------------


class Health(_Out):
    status: Literal["ok", "ready"]


# principals ------------------------------------------------------------------------------


class GrantBody(_Body):
    """What a principal may invoke: tool names (``"*"`` for all) and whole action types."""

    tools: list[Name] = Field(default_factory=list, max_length=256)
    action_types: list[ActionType] = Field(default_factory=list, max_length=4)

    def to_grant(self) -> Grant:
        return Grant(tools=frozenset(self.tools), action_types=frozenset(self.action_types))


def _grant_body(grant: Grant | None) -> GrantBody | None:
    if grant is None:
        return None
    return GrantBody(tools=sorted(grant.tools), action_types=sorted(grant.action_types))


class PrincipalBody(_Out):
    id: str
    org_id: str
    kind: PrincipalKind
    name: str
    is_admin: bool
    grant: GrantBody | None

    @classmethod
    def of(cls, principal: Principal) -> PrincipalBody:
        return cls(
            id=principal.id,
            org_id=principal.org_id,
            kind=principal.kind,
            name=principal.name,
            is_admin=principal.is_admin,
            grant=_grant_body(principal.grant),
        )


# agents ----------------------------------------------------------------------------------


class AgentCreate(_Body):
    name: Name
    persona: LongText = ""
    mode: AgentMode = AgentMode.INTERACTIVE
    tools: list[Name] | None = Field(
        default=None, max_length=256, description="tool names; default: every built-in tool"
    )
    skills: list[LongText] = Field(default_factory=list, max_length=64)
    grant: GrantBody | None = Field(
        default=None, description="default: a grant for exactly the agent's tools"
    )
    critic: bool = Field(
        default=False,
        description="the inner voice: review each final answer or reply before it is given",
    )


class AgentUpdate(_Body):
    """Only the fields given change; ``grant: null`` removes the agent's policy (deny all)."""

    persona: LongText | None = None
    mode: AgentMode | None = None
    tools: list[Name] | None = Field(default=None, max_length=256)
    skills: list[LongText] | None = Field(default=None, max_length=64)
    grant: GrantBody | None = None
    critic: bool | None = None

    @model_validator(mode="after")
    def _something(self) -> AgentUpdate:
        if not self.model_fields_set:
            raise ValueError(
                "nothing to update: give persona, mode, tools, skills, grant or critic"
            )
        for field in ("persona", "mode", "tools", "skills", "critic"):
            if field in self.model_fields_set and getattr(self, field) is None:
                raise ValueError(f"{field} cannot be null")
        return self

    def to_changes(self) -> AgentChanges:
        """The core's partial update: the same fields set."""
        given = self.model_fields_set
        values: dict[str, Any] = {}
        if "persona" in given:
            values["persona"] = self.persona
        if "mode" in given:
            values["mode"] = self.mode
        if "tools" in given and self.tools is not None:
            values["tools"] = tuple(self.tools)
        if "skills" in given and self.skills is not None:
            values["skills"] = tuple(self.skills)
        if "grant" in given:
            values["grant"] = None if self.grant is None else self.grant.to_grant()
        if "critic" in given:
            values["critic"] = self.critic
        return AgentChanges(**values)


class AgentBody(_Out):
    id: UUID
    name: str
    persona: str
    mode: AgentMode
    tools: list[str]
    skills: list[str]
    grant: GrantBody | None
    critic: bool
    created_at: datetime
    updated_at: datetime


def from_agent(agent: Agent) -> AgentBody:
    return AgentBody(
        id=agent.id,
        name=agent.name,
        persona=agent.persona,
        mode=agent.mode,
        tools=list(agent.tools),
        skills=list(agent.skills),
        grant=_grant_body(agent.grant),
        critic=agent.critic,
        created_at=agent.created_at,
        updated_at=agent.updated_at,
    )


class AgentList(_Out):
    agents: list[AgentBody]


# tasks -----------------------------------------------------------------------------------


class TaskPayload(_Body):
    """The task itself. The objective is the first non-empty of goal, objective,
    instructions, description."""

    goal: LongText | None = None
    objective: LongText | None = None
    instructions: LongText | None = None
    description: LongText | None = None
    max_steps: StrictInt | None = Field(
        default=None,
        ge=1,
        description="step budget: an integer from 1 to the server's max_steps_limit "
        "(64 unless configured); default: the server's default_max_steps (8)",
    )
    caller_user_id: Name | None = Field(
        default=None,
        description="the user the task is run for; recorded as the run's caller "
        "(default: the authenticated principal)",
    )
    contact_context: JsonObject | None = Field(
        default=None,
        description="context about the contact the task concerns; given to the agent "
        "with the objective (at most 8 KiB as JSON)",
    )

    def objective_text(self) -> str | None:
        for text in (self.goal, self.objective, self.instructions, self.description):
            if text is not None and text.strip():
                return text.strip()
        return None


class TaskCreate(_Body):
    name: Annotated[str, Field(max_length=200), AfterValidator(_clean)] = ""
    agent_id: Name = Field(description="the agent's id (or its name)")
    assignee_kind: Literal["AGENT"] = "AGENT"
    payload: TaskPayload
    run_mode: RunMode = Field(
        default=RunMode.EXECUTE,
        description="execute; dry_run (only READ tools run, the rest is simulated); shadow "
        "(WRITE and ADMIN calls are recorded as proposals, never executed)",
    )


class TaskAccepted(_Out):
    id: UUID
    status: RunStatus
    agent_id: UUID
    max_steps: int
    location: str = Field(description="where to read the run: GET this path")


class CandidateBody(_Out):
    index: int
    kind: Literal["tool", "finish"]
    tool: str | None
    args: dict[str, Any]
    message: str | None
    rationale: str
    score: float | None
    valid: bool
    invalid_reason: str | None
    repeats: int | None = Field(
        default=None, description="the step (1-based) that already made this exact call"
    )
    assessment: str | None = Field(
        default=None, description="what the evaluation said it gives toward the objective"
    )
    unsupported: list[str] = Field(
        default_factory=list,
        description="numbers in a finish's answer that no result, memory or the goal gives",
    )


class ActionBody(_Out):
    tool: str
    args: dict[str, Any]
    action_type: ActionType
    rationale: str


class ObservationBody(_Out):
    tool: str
    action_type: ActionType
    status: ObservationStatus
    summary: str
    output: Any = None
    truncated: bool
    duration_ms: float
    step_index: int | None


def from_observation(observation: Observation) -> ObservationBody:
    return ObservationBody(
        tool=observation.tool,
        action_type=observation.action_type,
        status=observation.status,
        summary=observation.summary,
        output=observation.output,
        truncated=observation.truncated,
        duration_ms=observation.duration_ms,
        step_index=observation.step_index,
    )


def _action(action: AgentAction) -> ActionBody:
    return ActionBody(
        tool=action.tool,
        args=action.args,
        action_type=action.action_type,
        rationale=action.rationale,
    )


def _candidate(c: Candidate) -> CandidateBody:
    return CandidateBody(
        index=c.index,
        kind=c.kind,
        tool=c.tool,
        args=c.args,
        message=c.message,
        rationale=c.rationale,
        score=c.score,
        valid=c.valid,
        invalid_reason=c.invalid_reason,
        repeats=c.repeats,
        assessment=c.assessment,
        unsupported=list(c.unsupported),
    )


class StepBody(_Out):
    """One propose → evaluate → select → act → observe cycle."""

    index: int
    decision: DecisionKind
    candidates: list[CandidateBody] = Field(description="proposals with their scores")
    selected: int | None = Field(description="index of the chosen candidate")
    action: ActionBody | None = Field(description="the chosen action (ACT steps)")
    action_category: ActionType | None
    observation: ObservationBody | None
    message: str | None = Field(description="the finish message or reason (FINISH steps)")
    note: str | None = Field(
        default=None,
        description="why the planner chose this candidate when it was not a plain argmax "
        "(what it said remains, repeats, scores without judgement)",
    )
    created_at: datetime


def _step(step: Step) -> StepBody:
    return StepBody(
        index=step.step_index,
        decision=step.decision,
        candidates=[_candidate(c) for c in step.candidates],
        selected=step.selected,
        action=None if step.action is None else _action(step.action),
        action_category=step.action_type,
        observation=None if step.observation is None else from_observation(step.observation),
        message=step.message,
        note=step.note,
        created_at=step.created_at,
    )


class TaskSummary(_Out):
    id: UUID
    name: str
    agent_id: UUID
    goal: str
    status: RunStatus
    max_steps: int
    caller_id: str | None = Field(description="the person the run acts for")
    requested_by: str | None = Field(description="the principal that started the run")
    contact_context: JsonObject | None
    result: str | None
    reason: str | None
    created_at: datetime
    finished_at: datetime | None
    run_mode: RunMode = RunMode.EXECUTE


class TraceSpanBody(_Out):
    """One span of a run's trace (OpenTelemetry, GenAI semantic conventions)."""

    trace_id: str = Field(description="W3C trace id, 32 hex digits")
    span_id: str = Field(description="16 hex digits")
    parent_span_id: str | None
    name: str = Field(
        description="invoke_agent {agent}, step N, perceive, decide, propose, "
        "execute_tool {tool}, learn, chat {model}, embeddings {model}, ..."
    )
    kind: str
    start_time: datetime
    end_time: datetime
    duration_ms: float
    status: str = Field(description="UNSET, OK or ERROR")
    status_message: str | None
    attributes: dict[str, Any] = Field(description="gen_ai.* and cortex.* attributes")
    depth: int = Field(description="depth in the tree (0: a root)")


def _span_bodies(found: RunTrace) -> list[TraceSpanBody]:
    return [TraceSpanBody.model_validate(s.model_dump(exclude={"links"})) for s in found.spans]


class TaskTrace(_Out):
    """A run's locally kept trace, spans depth-first in start order (empty when spans go
    only to a collector)."""

    task_id: UUID
    trace_ids: list[str]
    spans: list[TraceSpanBody]

    @classmethod
    def of(cls, found: RunTrace) -> TaskTrace:
        return cls(task_id=found.run_id, trace_ids=found.trace_ids, spans=_span_bodies(found))


class DiagnosticEventBody(_Out):
    """One event of a diagnostic timeline (its data scrubbed and bounded when written)."""

    seq: int = Field(description="order within the attempt or turn (1, 2, ...)")
    at: datetime
    kind: str = Field(
        description="attempt, request, model_call, decision, tool_call, retrieval, stall, "
        "loop, terminal, failure, truncated"
    )
    step: int | None = Field(description="the step of a run it belongs to")
    data: dict[str, Any]


class DiagnosticsBody(_Out):
    """A run's or a turn's diagnostic timeline (docs/operations.md, "Diagnostics")."""

    id: UUID = Field(description="the run's id, or the turn's")
    status: str
    stalled: bool = Field(description="a model call has not answered past the stall threshold")
    stalls: int
    loops: int
    cost: RunCostBody | None = Field(description="a run's cost (null for a turn)")
    events: list[DiagnosticEventBody]

    @classmethod
    def of(cls, found: Diagnosis) -> DiagnosticsBody:
        return cls.model_validate(found.model_dump())


class TurnTrace(_Out):
    """The locally kept trace a turn belongs to: the request it was accepted in and the
    turn's spans, wherever it was driven (empty for a turn accepted without tracing)."""

    turn_id: UUID
    trace_ids: list[str]
    spans: list[TraceSpanBody]

    @classmethod
    def of(cls, found: RunTrace) -> TurnTrace:
        return cls(turn_id=found.run_id, trace_ids=found.trace_ids, spans=_span_bodies(found))


class RunLoopBody(_Out):
    tool: str
    args_sha: str = Field(description="digest of the canonical JSON of the arguments")
    repeats: int
    first_step: int
    last_step: int


class RunCostBody(_Out):
    """What a run spent over its attempts (seconds and tokens), and the loops it showed."""

    attempts: int
    queue_s: float = Field(description="submitted → first step")
    wall_s: float = Field(description="the attempts' own time")
    tokens_in: int
    tokens_out: int
    model_calls: int
    model_s: float
    embed_calls: int
    embed_s: float
    tool_calls: int
    tool_s: float
    loops: list[RunLoopBody]


class TaskBody(TaskSummary):
    cost: RunCostBody | None = Field(
        default=None, description="tokens and seconds spent so far (null before any attempt)"
    )
    steps: list[StepBody]
    steps_json: str = Field(
        description="the same step log as `steps`, serialised as a JSON string (the seed's "
        "TaskRun.stepsJson: `JSON.parse(stepsJson)` equals `steps`)"
    )


def _summary_fields(run: TaskRun) -> dict[str, Any]:
    return {
        "id": run.id,
        "name": run.name,
        "agent_id": run.agent_id,
        "goal": run.goal,
        "status": run.status,
        "max_steps": run.max_steps,
        "caller_id": run.caller_id,
        "requested_by": run.requested_by,
        "contact_context": run.contact_context,
        "result": run.result,
        "reason": run.reason,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "run_mode": run.run_mode,
    }


def from_run(run: TaskRun, *, with_steps: bool = True) -> TaskBody | TaskSummary:
    if with_steps:
        steps = [_step(s) for s in run.steps]
        serialised = json.dumps(
            [s.model_dump(mode="json", by_alias=True) for s in steps], ensure_ascii=False
        )
        cost = None if run.cost is None else RunCostBody.model_validate(run.cost.model_dump())
        return TaskBody(**_summary_fields(run), cost=cost, steps=steps, steps_json=serialised)
    return TaskSummary(**_summary_fields(run))


class TaskList(_Out):
    tasks: list[TaskSummary]


class TaskCancel(_Body):
    reason: Annotated[str, Field(max_length=500), AfterValidator(_clean)] | None = Field(
        default=None, description="why, recorded after 'cancelled by <principal>'"
    )


# sessions --------------------------------------------------------------------------------


class SessionCreate(_Body):
    agent_id: Name = Field(description="an INTERACTIVE agent's id (or its name)")


class SessionBody(_Out):
    id: UUID
    agent_id: UUID
    caller_id: str
    status: SessionStatus
    created_at: datetime
    ended_at: datetime | None


def from_session(session: Session) -> SessionBody:
    return SessionBody(
        id=session.id,
        agent_id=session.agent_id,
        caller_id=session.caller_id,
        status=session.status,
        created_at=session.created_at,
        ended_at=session.ended_at,
    )


class MessageCreate(_Body):
    message: Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(_clean)]


class TurnBody(_Out):
    role: Literal["user", "assistant", "tool"]
    content: str
    tool: str | None
    turn_id: UUID | None = Field(
        default=None, description="the turn the message belongs to (none: before turns)"
    )
    turn_status: TurnStatus | None = Field(
        default=None,
        description="the turn's status: ACCEPTED or RUNNING (only its user message is shown "
        "yet), DONE, FAILED",
    )
    refused: str | None = Field(
        default=None,
        description="on the user message of a turn that ended without a reply: why (the "
        "refusal, or the reason it FAILED)",
    )

    @classmethod
    def of(cls, turn: Turn) -> TurnBody:
        if isinstance(turn, SessionMessage):
            return cls(
                role=turn.role,
                content=turn.content,
                tool=turn.tool,
                turn_id=turn.turn_id,
                turn_status=turn.turn_status,
                refused=turn.refused,
            )
        return cls(role=turn.role, content=turn.content, tool=turn.tool)


class MessageList(_Out):
    session_id: UUID
    messages: list[TurnBody]


class TurnStarted(_Out):
    """SSE ``started``: the turn is accepted (recorded) and queued or running."""

    session_id: UUID
    turn_id: UUID = Field(
        description="reconnect with GET .../turns/{turnId}/events (Last-Event-ID) to read "
        "what was missed"
    )


class TurnStatusBody(_Out):
    """An accepted turn: where it is, and its outcome once it has ended."""

    id: UUID
    session_id: UUID
    ordinal: int = Field(description="its place among the session's turns (0-based)")
    status: TurnStatus
    message: str
    reply: str | None
    refused: str | None
    reason: str | None = Field(description="why it FAILED")
    attempts: int = Field(description="times a driver took it (a recovery adds one)")
    events: int = Field(description="events it emitted (stored once it has ended)")
    last_event_id: str | None = Field(
        description="the id of its last event once it has ended (its done or error event)"
    )
    accepted_at: datetime
    finished_at: datetime | None

    @classmethod
    def of(cls, turn: TurnRecord) -> TurnStatusBody:
        return cls(
            id=turn.id,
            session_id=turn.session_id,
            ordinal=turn.ordinal,
            status=turn.status,
            message=turn.message,
            reply=turn.reply,
            refused=turn.refused,
            reason=turn.reason,
            attempts=turn.attempts,
            events=len(turn.events),
            last_event_id=f"{turn.id}:{turn.last_seq + 1}" if turn.status.ended else None,
            accepted_at=turn.accepted_at,
            finished_at=turn.finished_at,
        )


class TurnToolCall(_Out):
    """SSE ``tool_call``: the agent chose a tool in this round; its ``observation`` follows."""

    round: int
    tool: str
    args: JsonObject


class TurnApprovalRequired(_Out):
    """SSE ``approval_required``: the round's call needs a person's approval; the turn waits
    for the decision (``POST .../approvals/{approvalId}/decision``), then its ``observation``
    follows (refused when rejected or expired)."""

    round: int
    approval_id: UUID
    tool: str
    args: JsonObject
    reason: str
    approvers: list[str] = Field(description="who may decide; empty: any admin person")
    expires_at: datetime = Field(description="then the request expires: a rejection")


class TurnObservation(ObservationBody):
    """SSE ``observation``: what a tool call returned, as soon as it returned."""

    round: int


class TurnReply(_Out):
    """SSE ``reply``: the agent's answer, sent whole once the invocation gate passed it."""

    message: str


class TurnRefused(_Out):
    """SSE ``refused``: the turn ended without a reply, and why."""

    reason: str


class TurnError(_Out):
    """SSE ``error``: the turn failed; ``status`` is the HTTP status it maps to."""

    status: int
    code: str
    message: str
    correlation_id: str = Field(description="where the server log has the detail")


class TurnDone(_Out):
    """SSE ``done``: the turn's outcome, after every other event of the turn."""

    session_id: UUID
    reply: str | None
    refused: str | None
    observations: int


# memory ----------------------------------------------------------------------------------


class MemoryBody(_Out):
    id: UUID
    kind: MemoryKind
    content: str
    subject: str | None
    importance: float
    valid_from: datetime
    valid_to: datetime | None
    recorded_at: datetime
    superseded_at: datetime | None
    run_id: UUID | None
    session_id: UUID | None
    step_index: int | None
    metadata: dict[str, Any]

    @classmethod
    def of(cls, m: MemoryRecord) -> MemoryBody:
        return cls(
            id=m.id,
            kind=m.kind,
            content=m.content,
            subject=m.subject,
            importance=m.importance,
            valid_from=m.valid_from,
            valid_to=m.valid_to,
            recorded_at=m.recorded_at,
            superseded_at=m.superseded_at,
            run_id=m.run_id,
            session_id=m.session_id,
            step_index=m.step_index,
            metadata=m.metadata,
        )


class MemoryHit(_Out):
    memory: MemoryBody
    similarity: float
    recency: float
    importance: float
    score: float = Field(description="α·similarity + β·recency + γ·importance")

    @classmethod
    def of(cls, hit: ScoredMemory) -> MemoryHit:
        return cls(
            memory=MemoryBody.of(hit.memory),
            similarity=hit.similarity,
            recency=hit.recency,
            importance=hit.importance,
            score=hit.score,
        )


class MemorySearch(_Out):
    agent_id: UUID
    query: str
    results: list[MemoryHit]


class KnowledgeHit(_Out):
    """One passage, with everything needed to cite it."""

    citation: str = Field(description="path:lines (heading › path) @vN")
    text: str
    collection: str
    source_id: UUID
    version: int
    path: str
    heading_path: list[str]
    line_start: int
    line_end: int
    byte_start: int = Field(description="offset of the passage's first byte in the file")
    byte_end: int = Field(description="offset just past its last byte")
    score: float
    bm25_score: float | None
    dense_score: float | None
    rerank_score: float | None
    tiers: list[Tier]
    warning: str | None = Field(
        default=None, description="set when the source is unhealthy (its latest health report)"
    )

    @classmethod
    def of(cls, hit: SearchHit) -> KnowledgeHit:
        return cls(
            citation=hit.citation,
            text=hit.text,
            collection=hit.collection,
            source_id=hit.source_id,
            version=hit.version,
            path=hit.path,
            heading_path=list(hit.heading_path),
            line_start=hit.line_start,
            line_end=hit.line_end,
            byte_start=hit.byte_start,
            byte_end=hit.byte_end,
            score=hit.score,
            bm25_score=hit.bm25_score,
            dense_score=hit.dense_score,
            rerank_score=hit.rerank_score,
            tiers=list(hit.tiers),
            warning=hit.warning,
        )


class KnowledgeSearch(_Out):
    query: str
    hits: list[KnowledgeHit]
    tiers: list[Tier] = Field(description="the tiers that produced candidates")
    fusion: Fusion
    reranked: bool
    reranker: str | None = Field(
        default=None, description="the reranker that reordered the hits, if one ran"
    )
    skipped: list[str] = Field(description="stages that did not run, each with its reason")
    publications: dict[str, int] = Field(description="the generation searched per collection")


class FactList(_Out):
    agent_id: UUID
    facts: list[MemoryBody]


class ProposalBody(_Out):
    """A proposed edit of an agent's procedural memory, waiting for (or past) a decision."""

    id: UUID
    agent_id: UUID
    field: str
    value: str | list[str]
    rationale: str
    status: ProposalStatus
    proposed_by: str
    decided_by: str | None
    proposed_at: datetime
    decided_at: datetime | None

    @classmethod
    def of(cls, p: ProceduralProposal) -> ProposalBody:
        return cls(
            id=p.id,
            agent_id=p.agent_id,
            field=p.field,
            value=p.value if isinstance(p.value, str) else list(p.value),
            rationale=p.rationale,
            status=p.status,
            proposed_by=p.proposed_by,
            decided_by=p.decided_by,
            proposed_at=p.proposed_at,
            decided_at=p.decided_at,
        )


class ProposalList(_Out):
    agent_id: UUID
    proposals: list[ProposalBody]


class ProposalDecision(_Body):
    approve: bool = Field(description="true applies the edit; false rejects it")


class SessionEnded(_Out):
    session: SessionBody
    facts: list[MemoryBody] = Field(description="semantic facts the extraction pass wrote")


# tools -----------------------------------------------------------------------------------


class ToolCall(_Body):
    agent_id: Name = Field(description="the agent whose tool is called (id or name)")
    args: JsonObject = Field(default_factory=dict)


class ToolBody(_Out):
    name: str
    description: str
    parameters: dict[str, Any]
    action_type: ActionType
    tier: CapabilityTier = Field(description="read, write or admin: what a call may change")

    @classmethod
    def of(cls, spec: ToolSpec) -> ToolBody:
        return cls(
            name=spec.name,
            description=spec.description,
            parameters=spec.parameters,
            action_type=spec.action_type,
            tier=spec.tier,
        )


class ToolList(_Out):
    tools: list[ToolBody]


# evaluation ------------------------------------------------------------------------------
# A suite's cases (their cassettes and checks) and what a suite run keeps are the core's
# evaluation types as they are (``cortex_ray.evals``, snake_case fields): one vocabulary
# with suite files and ``cortex-ray eval``, so a suite read here can be kept in a file or
# posted back. Only the envelopes below are the API's own (camelCase, as everywhere).

Description = Annotated[str, Field(max_length=2000), AfterValidator(_clean)]


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()))
    message = str(error.get("msg", "invalid"))
    return f"{where}: {message}" if where else message


def _storable(what: str, items: list[BaseModel]) -> None:
    for i, item in enumerate(items):
        if (reason := has_bad_text(item.model_dump(mode="json"))) is not None:
            raise ValueError(f"{what}.{i}: {reason}")


class EvalSuiteCreate(_Body):
    """A suite's cases, saved as its next version (1 for a new name). The version, digest
    and author are the server's; the same cases as the latest version are that version
    (nothing new is written)."""

    name: str = Field(
        max_length=100,
        description="1-100 letters, digits, '_', '.' or '-', starting with a letter or digit",
    )
    description: Description = ""
    cases: list[EvalCase] = Field(
        min_length=1, max_length=1000, description="case names are unique in a suite"
    )

    @model_validator(mode="after")
    def _valid_suite(self) -> EvalSuiteCreate:
        _storable("cases", list(self.cases))
        self.to_suite()
        return self

    def to_suite(self) -> EvalSuite:
        """The core's suite (its rules: the name, case names unique)."""
        try:
            return EvalSuite(name=self.name, description=self.description, cases=tuple(self.cases))
        except ValidationError as exc:
            raise ValueError(_first_error(exc)) from None


class EvalCaseCreate(_Body):
    """A regression case made from an ended run of this organisation, added to a suite."""

    run_id: UUID = Field(
        description="an ended task run whose steps were recorded (the runtime's "
        "record_decisions, on by default)"
    )
    case: Name | None = Field(
        default=None,
        description="the case's name (default: run-<runId>); a case of that name in the "
        "suite is replaced",
    )
    description: Description = Field(default="", description="default: the run's goal")
    checks: list[Check] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="default: the run's recorded status, and every decision as recorded",
    )

    @model_validator(mode="after")
    def _valid_checks(self) -> EvalCaseCreate:
        _storable("checks", list(self.checks or ()))
        return self


class EvalRunCreate(_Body):
    suite: Name = Field(description="the suite's name")
    version: StrictInt | None = Field(default=None, ge=1, description="default: the latest")
    mode: EvalMode = Field(
        default=EvalMode.REPLAY,
        description="replay: the recorded model outputs answer the model calls (no model, "
        "deterministic); live: the server's model answers. Either way the recorded results "
        "answer the tools: nothing acts on the world",
    )
    judge: bool = Field(
        default=False,
        description="ask the server's model the model-scored checks (judge); else they are "
        "skipped, not failed",
    )
    overrides: JsonObject | None = Field(
        default=None,
        description='DECIDE settings to change for this run, e.g. {"evaluation": "scores"} '
        'or {"candidates": 1}; each case otherwise replays under the settings it was '
        "recorded with",
    )


class EvalSuiteList(_Out):
    suites: list[EvalSuiteSummary] = Field(description="each suite's latest version, by name")


class EvalRunList(_Out):
    runs: list[EvalRunSummary] = Field(description="newest first, without per-case results")


def from_eval_suite(suite: EvalSuite) -> EvalSuiteSummary:
    """A saved suite's summary (its version without the cases)."""
    if suite.version is None or suite.digest is None or suite.created_at is None:
        raise ValueError(f"suite {suite.name!r} is not saved: it has no version yet")
    return EvalSuiteSummary(
        name=suite.name,
        version=suite.version,
        description=suite.description,
        cases=len(suite.cases),
        digest=suite.digest,
        created_at=suite.created_at,
        created_by=suite.created_by,
    )
