"""The typed vocabulary of the decision cycle.

These pydantic models are the boundary types: what is stored, what crosses the seams
(PERCEIVE → DECIDE → ACT → LEARN) and what the HTTP API and CLI show.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal
from uuid import UUID, uuid4

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "EMBEDDING_DIM",
    "OPERATOR_ID",
    "ActionType",
    "Agent",
    "AgentAction",
    "AgentChanges",
    "AgentMode",
    "Candidate",
    "Decision",
    "DecisionKind",
    "Grant",
    "MemoryKind",
    "MemoryRecord",
    "MemorySnapshot",
    "ModelExchange",
    "Observation",
    "ObservationStatus",
    "Principal",
    "PrincipalKind",
    "ProceduralProposal",
    "ProposalStatus",
    "RecordedToolCall",
    "RunCost",
    "RunLoop",
    "RunStatus",
    "ScoredMemory",
    "Session",
    "SessionStatus",
    "Step",
    "StepRecording",
    "TaskRun",
    "ToolSpec",
    "Turn",
    "TurnEvent",
    "TurnEventKind",
    "TurnResult",
    "WorkingMemory",
    "utcnow",
]


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC (the only clock the core reads)."""
    return datetime.now(UTC)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AgentMode(StrEnum):
    """Which driver decides: a person in the loop, or a goal and a step budget."""

    INTERACTIVE = "INTERACTIVE"
    AUTONOMOUS = "AUTONOMOUS"


class ActionType(StrEnum):
    """CoALA's action categories.

    REASONING and RETRIEVAL and LEARNING are internal actions (they read or write the
    agent's own memories); GROUNDING acts on the outside world, dialogue and reading the
    clock included. GROUNDING is the default for a tool nobody classified.
    """

    REASONING = "REASONING"
    RETRIEVAL = "RETRIEVAL"
    LEARNING = "LEARNING"
    GROUNDING = "GROUNDING"


class CapabilityTier(StrEnum):
    """What a tool (or a use case) can do: read, change things, or administer the tenant.

    Beside the action category: a GROUNDING call can read (``current_time``) or write (send
    an e-mail); run modes and connector grants decide on the tier. Unclassified tools are
    WRITE (``ActionClassifier.tier``): assuming a side effect is the safe default.
    """

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


class Grant(_Model):
    """What a principal may invoke: tool names (``"*"`` for all) and whole action types."""

    tools: frozenset[str] = frozenset()
    action_types: frozenset[ActionType] = frozenset()

    def allows(self, tool: str, action_type: ActionType) -> bool:
        return "*" in self.tools or tool in self.tools or action_type in self.action_types


class PrincipalKind(StrEnum):
    USER = "USER"
    AGENT = "AGENT"
    SERVICE = "SERVICE"


class Principal(_Model):
    """Who a tool call runs as. ``grant=None`` means no policy, which denies everything."""

    id: str
    org_id: str
    kind: PrincipalKind = PrincipalKind.USER
    name: str = ""
    is_admin: bool = False
    grant: Grant | None = None

    @classmethod
    def operator(cls, org_id: str) -> Principal:
        """The person at this machine: what in-process callers (the CLI, Python code that
        holds the database) act as when they name no principal. An admin with every tool;
        audited as ``operator``. The HTTP API never uses it: its callers authenticate."""
        return cls(
            id=OPERATOR_ID,
            org_id=org_id,
            kind=PrincipalKind.USER,
            name="local operator",
            is_admin=True,
            grant=Grant(tools=frozenset({"*"})),
        )


OPERATOR_ID = "operator"
"""The principal id of ``Principal.operator``."""


class AgentChanges(_Model):
    """A partial update of an agent: only the fields that are set change
    (``model_fields_set``); ``grant=None`` set explicitly removes the grant (deny all)."""

    mode: AgentMode | None = None
    persona: str | None = None
    tools: tuple[str, ...] | None = None
    skills: tuple[str, ...] | None = None
    grant: Grant | None = None
    critic: bool | None = None


class Agent(_Model):
    """An agent's definition: its procedural memory (persona, skills, tool set) and grant."""

    id: UUID = Field(default_factory=uuid4)
    org_id: str
    name: str = Field(min_length=1, max_length=200)
    persona: str = ""
    mode: AgentMode = AgentMode.INTERACTIVE
    tools: tuple[str, ...] = ()
    skills: tuple[str, ...] = ()
    grant: Grant | None = None
    critic: bool = False
    """The inner voice: an independent review of each final answer or reply, revised once
    (see ``cortex_ray.decide.Critic``)."""
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)

    def principal(self) -> Principal:
        """The non-admin principal an autonomous run of this agent acts as."""
        return Principal(
            id=f"agent:{self.id}",
            org_id=self.org_id,
            kind=PrincipalKind.AGENT,
            name=self.name,
            is_admin=False,
            grant=self.grant,
        )


class ToolSpec(_Model):
    """A tool as the model sees it: name, description, JSON schema and action category."""

    name: str
    description: str
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}, "additionalProperties": False}
    )
    action_type: ActionType = ActionType.GROUNDING
    tier: CapabilityTier = CapabilityTier.WRITE


class AgentAction(_Model):
    """One selected action: a tool with arguments, its category and why it was chosen."""

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    action_type: ActionType = ActionType.GROUNDING
    rationale: str = ""


class Candidate(_Model):
    """One proposal of the autonomous planner, with its score once evaluated."""

    index: int
    kind: Literal["tool", "finish"]
    tool: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    message: str | None = None
    rationale: str = ""
    score: float | None = None
    valid: bool = True
    invalid_reason: str | None = None
    repeats: int | None = None
    """The step (1-based) that already made this exact call, with the same arguments."""
    assessment: str | None = None
    """What the evaluation said this candidate gives toward the objective (choice mode)."""
    unsupported: tuple[str, ...] = ()
    """Numbers in a finish's answer that neither the objective, the results observed nor
    the memories recalled contain: values the model made up."""
    dropped: dict[str, Any] = Field(default_factory=dict)
    """Optional arguments the model filled with values nothing gave, left out of the call
    (the tool's default applies): name → the value proposed."""


class DecisionKind(StrEnum):
    ACT = "ACT"
    FINISH = "FINISH"
    REPLY = "REPLY"


class Decision(_Model):
    """What DECIDE hands to the cycle: act with a tool, finish the run, or reply to a person."""

    kind: DecisionKind
    action: AgentAction | None = None
    message: str | None = None
    candidates: tuple[Candidate, ...] = ()
    selected: int | None = None
    reason: str = ""
    failed: bool = False


class ObservationStatus(StrEnum):
    OK = "OK"
    REFUSED = "REFUSED"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    SIMULATED = "SIMULATED"
    """A dry run's WRITE or ADMIN call: validated and allowed, not executed."""
    PROPOSED = "PROPOSED"
    """A shadow run's WRITE or ADMIN call: recorded as a proposal, never executed."""


class RunMode(StrEnum):
    """How a run's calls take effect (docs/governance.md, "Run modes").

    EXECUTE runs every allowed call; DRY_RUN validates and decides every call but runs only
    READ tools (the others are SIMULATED, and the run's report lists them); SHADOW runs READ
    tools and records every WRITE or ADMIN call as a proposal (PROPOSED) that nothing ever
    executes, for a person to label the run.
    """

    EXECUTE = "execute"
    DRY_RUN = "dry_run"
    SHADOW = "shadow"


class Observation(_Model):
    """What an action returned, bounded in size, as the next cycle perceives it."""

    tool: str
    action_type: ActionType
    status: ObservationStatus
    summary: str
    output: Any = None
    truncated: bool = False
    duration_ms: float = 0.0
    step_index: int | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    """The arguments the call was made with (what the planner is told it already did)."""


class MemoryKind(StrEnum):
    EPISODIC = "EPISODIC"
    SEMANTIC = "SEMANTIC"
    PROCEDURAL = "PROCEDURAL"


class MemoryRecord(_Model):
    """One long-term memory row, with valid time and record time."""

    id: UUID = Field(default_factory=uuid4)
    org_id: str
    agent_id: UUID
    kind: MemoryKind
    content: str
    subject: str | None = None
    importance: float = Field(default=5.0, ge=1.0, le=10.0)
    valid_from: datetime = Field(default_factory=utcnow)
    valid_to: datetime | None = None
    recorded_at: datetime = Field(default_factory=utcnow)
    superseded_at: datetime | None = None
    superseded_by: UUID | None = None
    run_id: UUID | None = None
    session_id: UUID | None = None
    step_index: int | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class ScoredMemory(_Model):
    """A recalled memory with its normalised score terms and their weighted sum."""

    memory: MemoryRecord
    similarity: float
    recency: float
    importance: float
    score: float


class MemorySnapshot(_Model):
    """Long-term memory as read ONCE at the start of a cycle."""

    query: str
    recalled: tuple[ScoredMemory, ...] = ()
    taken_at: datetime = Field(default_factory=utcnow)


class WorkingMemory(_Model):
    """Everything the model sees in one cycle, before the composer renders it."""

    mode: AgentMode
    agent_name: str
    persona: str
    skills: tuple[str, ...] = ()
    objective: str
    snapshot: MemorySnapshot
    action_space: tuple[ToolSpec, ...] = ()
    """The tools the prompt shows: all the agent may use, or above
    ``tool_retrieval_threshold`` those tool retrieval chose (docs/architecture.md)."""
    observations: tuple[Observation, ...] = ()
    conversation: tuple[Turn, ...] = ()
    step_index: int = 0
    max_steps: int | None = None
    critic: bool = False
    """The agent's inner voice is on: its final answer or reply is reviewed first."""
    hidden_tools: tuple[ToolSpec, ...] = Field(default=(), exclude=True)
    """Tools the agent may use that tool retrieval left out of ``action_space``: a candidate
    naming one is validated against it and goes through the gate like any other. Not
    serialised (a step's recording keeps what the prompt showed, not hundreds of tools)."""


class Turn(_Model):
    """One message of an interactive conversation."""

    role: Literal["user", "assistant", "tool"]
    content: str
    tool: str | None = None


class TurnResult(_Model):
    """What one interactive turn produced: the reply (a dialogue action) and tool observations."""

    session_id: UUID
    reply: str | None
    observations: tuple[Observation, ...] = ()
    refused: str | None = None


class TurnEventKind(StrEnum):
    """What a turn reports while it runs, in order: tool calls and their observations per
    round, then the reply or the refusal."""

    TOOL_CALL = "tool_call"
    APPROVAL_REQUIRED = "approval_required"
    """The round's call needs a person's approval: the turn waits for the decision (the
    request's id, who may decide, until when), then its ``observation`` follows."""
    OBSERVATION = "observation"
    PROGRESS = "progress"
    """The round's call reported how far it got (an MCP server's progress notification):
    ``progress``, ``total`` and the message as ``text``; before its ``observation``."""
    REPLY = "reply"
    REFUSED = "refused"


class TurnEvent(_Model):
    """One event of a running turn, delivered as soon as it happens (see ``run_turn``).

    The reply is delivered whole, after the invocation gate has passed it: a reply is a
    dialogue action, and text the gate would refuse must never reach the caller."""

    kind: TurnEventKind
    round: int = Field(ge=0, description="the tool round it belongs to (0-based)")
    tool: str | None = None
    args: dict[str, Any] | None = None
    observation: Observation | None = None
    text: str | None = Field(
        default=None, description="the reply, the refusal's reason, or why approval is needed"
    )
    approval_id: UUID | None = Field(default=None, description="the approval request waited for")
    approvers: tuple[str, ...] | None = Field(
        default=None, description="who may decide the request (empty: any admin person)"
    )
    expires_at: datetime | None = Field(
        default=None, description="when the request expires (counts as a rejection)"
    )
    progress: float | None = Field(default=None, description="how far the call got (progress)")
    total: float | None = Field(default=None, description="what it counts to, if it knows")


class RunStatus(StrEnum):
    RUNNING = "RUNNING"
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    """Paused on an approval request (a row, ``cortex_ray.governance.Approval``): no driver,
    no actor; a person's decision, or its expiry, puts it back to RUNNING."""
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    """A person stopped it (``Runtime.cancel_run``); its reason says who and why. Terminal,
    like COMPLETED and FAILED: never driven or resumed again."""

    @property
    def ended(self) -> bool:
        """COMPLETED, FAILED or CANCELLED: nothing will drive the run again."""
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class RecordedToolCall(_Model):
    """A tool call as a model returned it (OpenAI's shape; arguments as written)."""

    id: str
    name: str
    arguments: str = ""


class ModelExchange(_Model):
    """One model call a decision made, as recorded for replay: what was asked (a digest of
    the whole request and its schema's name) and what came back."""

    model: str = ""
    constrained: bool = True
    """The model constrained decoding to the schema (else the schema was in the prompt)."""
    schema_name: str
    request_sha256: str
    """sha256 of the request as JSON (messages, tools, schema, sampling; not the priority):
    a replay whose request differs was given another prompt."""
    prompt_chars: int = 0
    content: str | None = None
    tool_calls: tuple[RecordedToolCall, ...] = ()
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0


class StepRecording(_Model):
    """What one step's DECIDE saw and what its model said: the step's part of a run's
    cassette. ``wm`` is the working memory as the driver got it, without the observations
    and conversation (the earlier steps' records hold those)."""

    wm: WorkingMemory
    model_calls: tuple[ModelExchange, ...] = ()
    decide_ms: float = 0.0
    settings: dict[str, Any] = Field(default_factory=dict)
    """The values of the settings DECIDE used (``DECIDE_SETTINGS``): K, the evaluation, ..."""


class Step(_Model):
    """One ledger row: propose → evaluate → select → act → observe, keyed by (run, index)."""

    run_id: UUID
    step_index: int
    decision: DecisionKind
    candidates: tuple[Candidate, ...] = ()
    selected: int | None = None
    action: AgentAction | None = None
    action_type: ActionType | None = None
    observation: Observation | None = None
    message: str | None = None
    note: str | None = None
    """Why the planner chose this step's action when it was not a plain argmax of the
    scores (one candidate, scores that carry no judgement, repeated calls); see
    ``Decision.reason``."""
    created_at: datetime = Field(default_factory=utcnow)
    recording: StepRecording | None = Field(default=None, exclude=True)
    """The step's cassette part (kept when ``record_decisions`` is on; stored in its own
    column, read only by ``Store.get_run(..., recordings=True)``, never shown with the step log)."""


class RunLoop(_Model):
    """A call the run proposed over and over: the same tool with the same arguments."""

    tool: str
    args_sha: str
    """A digest of the canonical JSON of the arguments (they may hold anything)."""
    repeats: int
    first_step: int
    last_step: int


class RunCost(_Model):
    """What a run spent, added up over its attempts: seconds in line before its first step
    (``queue_s``), in model calls, embedding calls and tool calls, in all (``wall_s``: the
    attempts' own time), tokens in and out, and the loops seen."""

    attempts: int = 0
    queue_s: float = 0.0
    wall_s: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    model_calls: int = 0
    model_s: float = 0.0
    embed_calls: int = 0
    embed_s: float = 0.0
    tool_calls: int = 0
    tool_s: float = 0.0
    loops: tuple[RunLoop, ...] = ()

    def plus(self, other: RunCost) -> RunCost:
        """This cost and ``other``'s added up (a later attempt's loops replace earlier ones
        for the same call)."""
        loops = {(lp.tool, lp.args_sha): lp for lp in self.loops}
        loops.update({(lp.tool, lp.args_sha): lp for lp in other.loops})
        summed = {
            name: round(getattr(self, name) + getattr(other, name), 4)
            if isinstance(getattr(self, name), float)
            else getattr(self, name) + getattr(other, name)
            for name in RunCost.model_fields
            if name != "loops"
        }
        return RunCost(**summed, loops=tuple(loops.values()))


class TaskRun(_Model):
    """One autonomous run of an agent against a goal, with its step log."""

    id: UUID = Field(default_factory=uuid4)
    org_id: str
    agent_id: UUID
    name: str = ""
    goal: str
    status: RunStatus = RunStatus.RUNNING
    max_steps: int
    caller_id: str | None = Field(default=None, description="the person the run acts for")
    requested_by: str | None = Field(default=None, description="the principal that started it")
    contact_context: dict[str, Any] | None = Field(
        default=None, description="what the requester said about the contact the task concerns"
    )
    result: str | None = None
    reason: str | None = None
    steps: tuple[Step, ...] = ()
    created_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None
    trace_parent: str | None = Field(
        default=None, description="W3C traceparent every attempt's trace continues"
    )
    trace_attempt: str | None = Field(
        default=None, description="span id of the latest attempt's invoke_agent span"
    )
    cost: RunCost | None = Field(
        default=None, description="tokens and seconds spent, over the attempts so far"
    )
    run_mode: RunMode = Field(
        default=RunMode.EXECUTE, description="execute, dry_run or shadow (RunMode)"
    )
    workflow_version_id: UUID | None = Field(
        default=None, description="the workflow version the run follows (its allow-list)"
    )
    workflow_inputs: dict[str, Any] | None = Field(
        default=None, description="the workflow run's inputs, valid against its version's schema"
    )
    deadline_at: datetime | None = Field(
        default=None,
        description="its wall-time cap (a schedule's max_seconds from when it fired): past "
        "it the run ends FAILED at its next step",
    )

    def objective(self) -> str:
        """What the agent works towards: the goal, and the contact context and the workflow
        inputs when there are any."""
        text = self.goal
        if self.contact_context:
            context = json.dumps(self.contact_context, ensure_ascii=False, sort_keys=True)
            text += f"\n\nContact context (JSON): {context}"
        if self.workflow_inputs is not None:
            inputs = json.dumps(self.workflow_inputs, ensure_ascii=False, sort_keys=True)
            text += f"\n\nWorkflow inputs (JSON): {inputs}"
        return text


class SessionStatus(StrEnum):
    OPEN = "OPEN"
    ENDED = "ENDED"


class Session(_Model):
    """An interactive conversation between a caller and an agent."""

    id: UUID = Field(default_factory=uuid4)
    org_id: str
    agent_id: UUID
    caller_id: str
    status: SessionStatus = SessionStatus.OPEN
    created_at: datetime = Field(default_factory=utcnow)
    ended_at: datetime | None = None


class ProposalStatus(StrEnum):
    PENDING = "PENDING"
    APPROVED = "APPROVED"
    REJECTED = "REJECTED"


class ProceduralProposal(_Model):
    """An edit of an agent's persona or skills that waits for a person's approval."""

    id: UUID = Field(default_factory=uuid4)
    org_id: str
    agent_id: UUID
    field: Literal["persona", "skills"]
    value: str | tuple[str, ...]
    rationale: str = ""
    status: ProposalStatus = ProposalStatus.PENDING
    proposed_by: str
    decided_by: str | None = None
    proposed_at: datetime = Field(default_factory=utcnow)
    decided_at: datetime | None = None


WorkingMemory.model_rebuild()


EMBEDDING_DIM = 384
"""The dimension of every stored vector: ``memories.embedding`` and the knowledge vectors
(``vector(384)`` / ``halfvec(384)`` in the schema). Not a setting: an embedder must have it
(docs/operations.md).
"""
