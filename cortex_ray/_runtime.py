"""The runtime: the one door into the core.

``Runtime`` wires the decision cycle once (``Runtime.open``) and offers every use case the
HTTP API, the CLI and Python callers have: agents, tasks, sessions, tool calls, memory and
knowledge search, API keys, procedural-edit approval. Each use case takes the calling
principal, is decided by ``AccessControlService.authorize`` and leaves an audit row (every
refusal; every allowed write and data read) with the action category the gate would give
it. The transports only parse, call one method and render.

What a use case sets going runs elsewhere: the loops are in ``cortex_ray._cycle``
(``DecisionCycle``), LEARN's cadences in ``cortex_ray.learn``, model opening in the backend
registry (``cortex_ray.models.open_models``). ``drive_run``, ``run_turn`` and
``end_session`` are the executor seam: an ``Executor`` (in-process, or a session actor)
calls them for work a use case already admitted.

In-process callers that name no principal act as ``Principal.operator(org)``: the person at
the machine, who holds the database anyway. Anything acting for someone else passes that
someone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from pydantic import ValidationError

from cortex_ray import graph as _graph
from cortex_ray._cycle import (
    DecisionCycle,
    StepCallback,
    TurnEventRelay,
    TurnEventSink,
    events_until,
)
from cortex_ray._exceptions import (
    AccessDeniedError,
    ConfigurationError,
    ConflictError,
    CortexError,
    InvalidRequestError,
    NotFoundError,
    UnavailableError,
)
from cortex_ray._tracing import GEN_AI_AGENT_NAME, current_traceparent, submission_span
from cortex_ray._types import (
    Agent,
    AgentChanges,
    AgentMode,
    Grant,
    MemoryKind,
    MemoryRecord,
    Observation,
    Principal,
    PrincipalKind,
    ProceduralProposal,
    ProposalStatus,
    RunMode,
    RunStatus,
    ScoredMemory,
    Session,
    SessionStatus,
    TaskRun,
    ToolSpec,
    TurnResult,
)
from cortex_ray.access import AccessControlService, UseCase, UseCaseRequest
from cortex_ray.act import (
    BUILTIN_TOOL_NAMES,
    ActionClassifier,
    InvocationContext,
    Tool,
    ToolDispatcher,
    ToolHook,
    ToolRegistry,
    builtin_tools,
)
from cortex_ray.decide import AutonomousDriver, Critic, InteractiveDriver
from cortex_ray.evals import (
    Check,
    EvalCase,
    EvalMode,
    EvalRun,
    EvalRunSummary,
    EvalStore,
    EvalSuite,
    EvalSuiteSummary,
    RunComparison,
    SameDecisions,
    StatusIs,
    cassette_from_run,
    compare_runs,
    decide_settings,
    run_suite,
)
from cortex_ray.governance import (
    Connector,
    ConnectorPolicy,
    Governance,
    GovernanceStore,
    InputLimits,
    SecretStore,
    Workflows,
    WorkflowVersion,
    discover_connectors,
)
from cortex_ray.knowledge import Fusion, KnowledgeService, SearchResult, knowledge_search_tool
from cortex_ray.learn import Learner
from cortex_ray.memory import (
    EMBEDDING_DIM,
    ImportanceScorer,
    MemoryService,
    importance_scorer_for,
)
from cortex_ray.models import (
    CrossEncoderReranker,
    Embedder,
    ModelClient,
    ModelSlot,
    RecordingModelClient,
    Reranker,
    open_models,
)
from cortex_ray.observability import RunTrace, Tracing, metrics
from cortex_ray.observability.diagnostics import Diagnosis
from cortex_ray.perceive import PromptComposer, ToolRetriever, WorkingMemoryAssembler
from cortex_ray.settings import Settings, load_settings
from cortex_ray.storage import (
    AuditEntry,
    Database,
    LeaseHolder,
    OrphanedRun,
    SessionMessage,
    Store,
    TurnLease,
    TurnLeaseLostError,
    TurnRecord,
    TurnRef,
    TurnStore,
)

__all__ = [
    "ApiKeyCreated",
    "ApiKeyRevoked",
    "Runtime",
    "StepCallback",
    "TurnEventRelay",
    "TurnEventSink",
    "events_until",
]

log = logging.getLogger("cortex_ray.runtime")

MAX_CONTACT_CONTEXT_BYTES = 8192
"""The largest contact context a run takes, as UTF-8 JSON."""


@dataclass(frozen=True, slots=True)
class ApiKeyCreated:
    """A new API key: the bearer key (shown once; only its hash is kept), its id, and the
    principal it acts as."""

    key: str
    key_id: UUID
    principal: Principal
    warnings: tuple[str, ...] = ()
    """What the key cannot do as created (e.g. no grant: no tool calls until granted)."""


@dataclass(frozen=True, slots=True)
class ApiKeyRevoked:
    """A revoked API key: when it was revoked, and whether this call revoked it (``False``:
    it already was, and nothing changed)."""

    key_id: UUID
    revoked_at: datetime
    revoked_now: bool


class Runtime:
    """Everything the decision cycle needs, wired once, and the use cases on top. Open with
    :meth:`open`."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        memory: MemoryService,
        model: ModelClient | None,
        tools: Iterable[Tool] = (),
        hooks: Sequence[ToolHook] = (),
        classifier: ActionClassifier | None = None,
        knowledge: KnowledgeService | None = None,
        critic_model: ModelClient | None = None,
        connectors: Iterable[Connector] = (),
    ) -> None:
        self.settings = settings
        self.db = db
        self.store = Store(db)
        self.turns = TurnStore(db)
        self.evals = EvalStore(db)
        # Set when a turn of the session ends here: the next one claims at once, not at its
        # next poll.
        self._turn_ended: dict[UUID, asyncio.Event] = {}
        self.memory = memory
        self.model = model
        self.knowledge = knowledge
        self.access = AccessControlService()
        self.graph, searching = _retrieval_tools(db, knowledge)  # registered, not built in
        self.registry = ToolRegistry([*builtin_tools(), *searching, *tools], classifier)
        # Connector tools are decided by their grants too, in the same gate (issue 18).
        self.connector_policy = ConnectorPolicy(
            GovernanceStore(db, payload_inline_bytes=settings.tools.payload_inline_bytes),
            connectors,
            cache_s=settings.governance.grant_cache_s,
            pattern_budget_s=settings.governance.schema_pattern_budget_s,
        )
        input_limits = InputLimits(
            max_bytes=settings.governance.workflow_input_max_bytes,
            max_pattern_chars=settings.governance.schema_pattern_max_chars,
            pattern_budget_s=settings.governance.schema_pattern_budget_s,
        )
        self.secrets = SecretStore(db, settings.governance, settings.storage.data_dir)
        self.dispatcher = ToolDispatcher(
            self.registry,
            self.access,
            self.store,
            settings.tools,
            tracing=settings.tracing,
            memory=memory,
            hooks=hooks,
            governance=self.connector_policy,
            secrets=self.secrets,
        )
        self.governance = Governance(
            store=self.store,
            governance=self.connector_policy.store,
            policy=self.connector_policy,
            tools_of=self._connector_tools,
            authorize=self._authorize,
            audited=self._audited,
            excludes_requester=settings.governance.approval_excludes_requester,
            secrets=self.secrets,
            input_limits=input_limits,
        )
        """Connectors, grants and the audit log (``cortex_ray.governance``), as use cases."""
        self.workflows = Workflows(
            store=self.store,
            governance=self.connector_policy.store,
            tool_connector=self._tool_connector,
            connectors=lambda: self.connector_policy.connectors.keys(),
            authorize=self._authorize,
            audited=self._audited,
            start=self._start_run,
            input_limits=input_limits,
        )
        """Workflow definitions, immutable versions, runs and their ledgers, as use cases."""
        self.composer = PromptComposer(
            show_action_space=settings.decide.show_action_space,
            earlier_chars=settings.decide.progress_earlier_chars,
        )
        # Above the threshold the prompt shows the tools retrieved for the objective, found
        # with the memory's embedder (one query vector a step; tool vectors are cached).
        tool_retrieval = ToolRetriever(
            memory.embedder,
            settings.knowledge,
            threshold=settings.decide.tool_retrieval_threshold,
            k=settings.decide.tool_retrieval_k,
        )
        self.assembler = WorkingMemoryAssembler(
            memory, self.dispatcher, recall_k=settings.memory.recall_k, tools=tool_retrieval
        )
        # The inner voice of agents with critic on: another model when one is given, else
        # the agent's own model with a reviewer's prompt (same lineage, said so in the log).
        # The drivers' calls go through a recorder: inside an autonomous step's DECIDE each
        # one is kept for the step's cassette (``record_decisions``); elsewhere it forwards.
        capture = settings.tracing
        deciding = None if model is None else RecordingModelClient(model, capture=capture)
        reviewing = (
            RecordingModelClient(critic_model, capture=capture)
            if critic_model is not None
            else deciding
        )
        retries = settings.models.structured_retries
        critic = Critic(
            reviewing,
            self.composer,
            structured_retries=retries,
            independent=critic_model is not None,
        )
        self.autonomous = AutonomousDriver(
            deciding, self.composer, settings.decide, structured_retries=retries, critic=critic
        )
        self.interactive = InteractiveDriver(deciding, self.composer, critic=critic)
        self.learner = Learner(db, self.store, memory)
        self.cycle = DecisionCycle(
            settings=settings,
            db=db,
            store=self.store,
            registry=self.registry,
            assembler=self.assembler,
            dispatcher=self.dispatcher,
            autonomous=self.autonomous,
            interactive=self.interactive,
            learner=self.learner,
        )
        self._owns_model = False
        self._owns_db = False
        # Spans of this process's cycles go to an OTLP collector and/or this database's
        # trace_spans (settings.tracing; docs/operations.md, "Traces").
        self.tracing = Tracing.open(settings.tracing, db.dsn)
        self.driver_id = f"{socket.gethostname()}:{os.getpid()}:{uuid4().hex[:8]}"
        """Who this runtime is as the holder of a run's lease (unique per instance; a run
        actor drives as its actor name instead: ``drive_run(owner=...)``)."""

    @classmethod
    async def open(
        cls,
        settings: Settings | None = None,
        *,
        model: ModelClient | str | None = "settings",
        embedder: Embedder | None = None,
        importance: ImportanceScorer | None = None,
        tools: Iterable[Tool] = (),
        hooks: Sequence[ToolHook] = (),
        db: Database | None = None,
        reranker: Reranker | None = None,
        critic_model: ModelClient | None = None,
        connectors: Iterable[Connector] | None = None,
    ) -> Runtime:
        """Start or reach the database, open the models the settings name, and wire the cycle.

        Models open through the backend registry (``cortex_ray.models.open_models``):
        ``model="settings"`` opens the chat model of ``model_backend``; pass a client (or
        ``None``) to override. Likewise ``embedder`` (else ``embedding_backend``) and
        ``importance``. ``reranker`` reranks knowledge search; without one, the CrossEncoder
        that ``reranker_model`` names (loaded here), else the backend's reranker if it has
        one (the ``served`` backend does), else that stage is skipped and each result says
        so. ``critic_model`` reviews the answers
        of agents with ``critic`` on (default: their own model, a same-lineage review).
        ``connectors`` (with their tools in ``tools``) default to those installed packages
        offer (``cortex_ray.governance.discover_connectors``).
        """
        if connectors is None:
            connectors, offered = discover_connectors()
            tools = [*tools, *offered]
        if settings is None:
            settings = load_settings()
        if isinstance(model, str) and model != "settings":
            raise ConfigurationError(f"model must be a ModelClient or None, not {model!r}")
        # The database first: it is the cheapest to fail, and everything opened after it
        # is closed again if a later step fails.
        database = db or await Database.open(settings.storage)
        chat_model: ModelClient | None = None
        opens_chat = isinstance(model, str)
        try:
            slots: list[ModelSlot] = []
            if opens_chat:
                slots.append("chat")
            if embedder is None:
                slots.append("embedder")
            parts = await open_models(settings, slots)
            chat_model = parts.chat if opens_chat else model  # type: ignore[assignment]
            emb = embedder or parts.embedder
            if emb is None:
                raise ConfigurationError(
                    f"embedding_backend={settings.embeddings.backend} opened no embedder"
                )
            if emb.dim != EMBEDDING_DIM:
                source = type(emb).__name__
                if embedder is None:
                    model_name = settings.embeddings.model or "packaged MiniLM"
                    source += (
                        f" (embedding_backend={settings.embeddings.backend}, "
                        f"embedding_model={model_name})"
                    )
                raise ConfigurationError(
                    f"the embedder {source} makes {emb.dim}-d vectors, but the database "
                    f"stores {EMBEDDING_DIM}-d ones (the schema's dimension, not a setting; "
                    "docs/operations.md)"
                )
            if importance is None:
                importance = importance_scorer_for(
                    settings.memory,
                    chat_model,
                    structured_retries=settings.models.structured_retries,
                )
            memory = MemoryService(
                database,
                emb,
                settings.memory,
                importance,
                structured_retries=settings.models.structured_retries,
            )
            knowledge = KnowledgeService(
                database,
                emb,
                config=settings.knowledge,
                reranker=reranker or _configured_reranker(settings) or parts.reranker,
            )
            runtime = cls(
                settings=settings,
                db=database,
                memory=memory,
                model=chat_model,
                tools=tools,
                hooks=hooks,
                knowledge=knowledge,
                critic_model=critic_model,
                connectors=connectors,
            )
            # Close only what this call opened; a caller's model or database is theirs.
            runtime._owns_model = opens_chat
            runtime._owns_db = db is None
            return runtime
        except BaseException:
            if chat_model is not None and opens_chat:
                await chat_model.aclose()
            if db is None:
                await database.close()
            raise

    def _connector_tools(self, connector: str) -> list[str]:
        """The names of the registered tools that belong to ``connector``."""
        tools = (self.registry.get(name) for name in self.registry.names())
        return [t.name for t in tools if t is not None and t.connector == connector]

    def _tool_connector(self, name: str) -> tuple[bool, str | None]:
        """Whether a tool is registered, and its connector."""
        tool = self.registry.get(name)
        return tool is not None, None if tool is None else tool.connector

    async def close(self, *, close_db: bool = True) -> None:
        """Release the run leases this runtime still holds (the next driver takes the runs
        at once, without waiting for the leases to expire), then close the model and the
        database if this runtime opened them."""
        await self.cycle.leases.release_all()
        # Background importance scoring first: it uses the model and the database.
        await self.memory.aclose()
        if self.model is not None and self._owns_model:
            await self.model.aclose()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.close)  # flushes the spans still queued
            self.tracing = None
        if close_db and self._owns_db:
            await self.db.close()

    async def ping(self) -> None:
        """Readiness: the database answers within ``settings.api.readyz_timeout_s``.

        Raises:
            UnavailableError: It did not, with the reason.
        """
        try:
            async with asyncio.timeout(self.settings.api.readyz_timeout_s):
                async with self.db.connection() as conn:
                    await conn.execute("SELECT 1")
        except Exception as exc:
            raise UnavailableError(f"the database does not answer: {type(exc).__name__}") from exc

    # access and audit ---------------------------------------------------------------------

    async def _authorize(
        self,
        principal: Principal | None,
        use_case: UseCase,
        org_id: str,
        *,
        agent: Agent | None = None,
        owner_id: str | None = None,
        args: dict[str, Any] | None = None,
        session_id: UUID | None = None,
        approvers: tuple[str, ...] = (),
    ) -> Principal:
        """Decide ``use_case`` for the caller (the operator when ``None``); a refusal is
        audited and raised as ``AccessDeniedError``. Returns the acting principal."""
        caller = principal or Principal.operator(org_id)
        category = None
        if use_case is UseCase.MEMORY_SEARCH:
            tool = self.registry.get("memory_search")
            category = self.registry.classifier.classify(tool or "memory_search")
        request = UseCaseRequest(
            org_id, agent=agent, owner_id=owner_id, tool_category=category, approvers=approvers
        )
        decision = self.access.authorize(caller, use_case, request)
        if not decision.allowed:
            await self._audit(
                caller, use_case, org_id, "REFUSED", decision.reason, agent, args, session_id
            )
            log.info("refused %s for %s: %s", use_case.label, caller.id, decision.reason)
            raise AccessDeniedError(decision.reason)
        return caller

    async def _audited(
        self,
        caller: Principal,
        use_case: UseCase,
        org_id: str,
        *,
        agent: Agent | None = None,
        args: dict[str, Any] | None = None,
        session_id: UUID | None = None,
        run_id: UUID | None = None,
    ) -> None:
        """The OK row of an allowed use case that is audited when allowed."""
        if use_case.audit_allowed:
            await self._audit(caller, use_case, org_id, "OK", None, agent, args, session_id, run_id)

    async def _audit(
        self,
        caller: Principal,
        use_case: UseCase,
        org_id: str,
        status: str,
        reason: str | None,
        agent: Agent | None,
        args: dict[str, Any] | None,
        session_id: UUID | None = None,
        run_id: UUID | None = None,
    ) -> None:
        entry = self._audit_entry(
            caller, use_case, org_id, status, reason, agent, args, session_id, run_id
        )
        async with self.db.transaction() as conn:
            await self.store.insert_audit(conn, entry)
        self._log_audited(caller, use_case, status)

    @staticmethod
    def _audit_entry(
        caller: Principal,
        use_case: UseCase,
        org_id: str,
        status: str,
        reason: str | None,
        agent: Agent | None,
        args: dict[str, Any] | None,
        session_id: UUID | None = None,
        run_id: UUID | None = None,
    ) -> AuditEntry:
        """A use case's audit row (written by ``_audit``, or by the caller in the same
        transaction as the write it audits)."""
        return AuditEntry(
            org_id=org_id,
            principal_id=caller.id,
            agent_id=None if agent is None else agent.id,
            mode=None,
            tool=use_case.label,
            action_type=use_case.category,
            status=status,
            reason=reason,
            args=args or {},
            duration_ms=0.0,
            run_id=run_id,
            step_index=None,
            session_id=session_id,
            idempotency_key=None,
            tier=use_case.tier,
        )

    @staticmethod
    def _log_audited(caller: Principal, use_case: UseCase, status: str) -> None:
        log.info(
            "use case %s category=%s status=%s principal=%s",
            use_case.label,
            use_case.category.value,
            status,
            caller.id,
            extra={"action_type": use_case.category.value, "use_case": use_case.label},
        )

    async def _agent_for(
        self,
        principal: Principal | None,
        use_case: UseCase,
        org_id: str,
        agent_ref: UUID | str,
        *,
        args: dict[str, Any] | None = None,
    ) -> tuple[Principal, Agent]:
        """The agent a use case concerns, looked up only for a member of its organisation
        (so another organisation's principal learns nothing), then the use case decided."""
        caller = principal or Principal.operator(org_id)
        if caller.org_id != org_id:
            await self._authorize(caller, use_case, org_id, args=args)
        agent = await self.store.get_agent(org_id, agent_ref)
        return await self._authorize(caller, use_case, org_id, agent=agent, args=args), agent

    # agents -------------------------------------------------------------------------------

    async def list_agents(self, org_id: str, *, principal: Principal | None = None) -> list[Agent]:
        """The organisation's agents."""
        await self._authorize(principal, UseCase.AGENTS_LIST, org_id)
        return await self.store.list_agents(org_id)

    async def get_agent(
        self, org_id: str, agent_ref: UUID | str, *, principal: Principal | None = None
    ) -> Agent:
        """One agent, by id or name."""
        _, agent = await self._agent_for(principal, UseCase.AGENTS_GET, org_id, agent_ref)
        return agent

    async def create_agent(
        self,
        org_id: str,
        name: str,
        *,
        persona: str = "",
        mode: AgentMode = AgentMode.INTERACTIVE,
        tools: Sequence[str] | None = None,
        skills: Sequence[str] = (),
        grant: Grant | None = None,
        critic: bool = False,
        principal: Principal | None = None,
    ) -> Agent:
        """Create an agent (admin only). By default it has every built-in tool and a grant
        for them; ``critic`` turns on its inner voice (a review of each final answer)."""
        args = {"name": name, "mode": mode.value}
        caller = await self._authorize(principal, UseCase.AGENTS_CREATE, org_id, args=args)
        tool_names = tuple(tools) if tools is not None else BUILTIN_TOOL_NAMES
        self._check_tools(tool_names)
        try:
            agent = Agent(
                org_id=org_id,
                name=name.strip(),
                persona=persona,
                mode=mode,
                tools=tool_names,
                skills=tuple(skills),
                grant=grant if grant is not None else Grant(tools=frozenset(tool_names)),
                critic=critic,
            )
        except ValidationError as exc:
            raise InvalidRequestError(f"invalid agent: {_first_error(exc)}") from exc
        created = await self.store.create_agent(agent)
        await self._audited(caller, UseCase.AGENTS_CREATE, org_id, agent=created, args=args)
        return created

    async def update_agent(
        self,
        org_id: str,
        agent_ref: UUID | str,
        changes: AgentChanges,
        *,
        principal: Principal | None = None,
    ) -> Agent:
        """Change an agent's mode, persona, tools, skills, grant or critic (admin only): the
        fields set on ``changes``."""
        given = changes.model_fields_set
        args = {"fields": sorted(given)}
        caller, agent = await self._agent_for(
            principal, UseCase.AGENTS_UPDATE, org_id, agent_ref, args=args
        )
        update: dict[str, Any] = {}
        if "tools" in given and changes.tools is not None:
            self._check_tools(changes.tools)
            update["tools"] = tuple(changes.tools)
        if "persona" in given and changes.persona is not None:
            update["persona"] = changes.persona
        if "mode" in given and changes.mode is not None:
            update["mode"] = changes.mode
        if "skills" in given and changes.skills is not None:
            update["skills"] = tuple(changes.skills)
        if "grant" in given:
            update["grant"] = changes.grant
        if "critic" in given and changes.critic is not None:
            update["critic"] = changes.critic
        changed = await self.store.update_agent(agent.model_copy(update=update))
        await self._audited(caller, UseCase.AGENTS_UPDATE, org_id, agent=changed, args=args)
        return changed

    def _check_tools(self, names: Iterable[str]) -> None:
        unknown = [t for t in names if self.registry.get(t) is None]
        if unknown:
            raise InvalidRequestError(f"unknown tools: {', '.join(unknown)}")

    # tasks --------------------------------------------------------------------------------

    async def start_run(
        self,
        org_id: str,
        agent_ref: UUID | str,
        goal: str,
        *,
        max_steps: int | None = None,
        name: str = "",
        caller_id: str | None = None,
        contact_context: dict[str, Any] | None = None,
        principal: Principal | None = None,
        run_mode: RunMode = RunMode.EXECUTE,
    ) -> TaskRun:
        """Validate and record a new RUNNING task run (nothing is executed yet; hand its id
        to an ``Executor``, or call :meth:`drive_run`).

        ``caller_id`` is the person the run acts for; the calling principal is recorded as
        ``requested_by``. ``contact_context`` (a JSON object, at most 8 KiB) is shown to the
        agent with the goal. ``run_mode``: execute, dry_run or shadow (``RunMode``)."""
        _, _, run = await self._start(
            org_id,
            agent_ref,
            goal,
            max_steps,
            name,
            caller_id,
            contact_context,
            principal,
            run_mode,
        )
        return run

    async def _start_run(
        self,
        org_id: str,
        agent_ref: UUID | str,
        goal: str,
        max_steps: int | None,
        name: str,
        caller_id: str | None,
        contact_context: dict[str, Any] | None,
        principal: Principal | None,
        run_mode: RunMode = RunMode.EXECUTE,
        *,
        workflow: WorkflowVersion | None = None,
        inputs: dict[str, Any] | None = None,
    ) -> TaskRun:
        _, _, run = await self._start(
            org_id, agent_ref, goal, max_steps, name, caller_id, contact_context, principal,
            run_mode, workflow=workflow, inputs=inputs,
        )  # fmt: skip
        return run

    async def _start(
        self,
        org_id: str,
        agent_ref: UUID | str,
        goal: str,
        max_steps: int | None,
        name: str,
        caller_id: str | None,
        contact_context: dict[str, Any] | None,
        principal: Principal | None,
        run_mode: RunMode = RunMode.EXECUTE,
        *,
        workflow: WorkflowVersion | None = None,
        inputs: dict[str, Any] | None = None,
    ) -> tuple[Principal, Agent, TaskRun]:
        args: dict[str, Any] = {"agent": str(agent_ref), "max_steps": max_steps}
        if run_mode is not RunMode.EXECUTE:
            args["run_mode"] = run_mode.value
        if workflow is not None:
            args["workflow"] = workflow.workflow
            args["version"] = workflow.version
        caller, agent = await self._agent_for(
            principal, UseCase.TASKS_SUBMIT, org_id, agent_ref, args=args
        )
        if not goal or not goal.strip():
            raise InvalidRequestError("the goal is empty")
        if contact_context is not None:
            size = len(json.dumps(contact_context, ensure_ascii=False, sort_keys=True).encode())
            if size > MAX_CONTACT_CONTEXT_BYTES:
                raise InvalidRequestError(
                    f"contact context: at most {MAX_CONTACT_CONTEXT_BYTES} bytes as JSON, "
                    f"got {size}"
                )
        steps = self.settings.decide.default_max_steps if max_steps is None else max_steps
        if isinstance(steps, bool) or not isinstance(steps, int):
            raise InvalidRequestError("max_steps must be an integer")
        if not 1 <= steps <= self.settings.decide.max_steps_limit:
            raise InvalidRequestError(
                f"max_steps must be between 1 and {self.settings.decide.max_steps_limit}, "
                f"got {steps}"
            )
        if agent.mode is not AgentMode.AUTONOMOUS:
            # An interactive agent acts for a person (agent grant ∩ caller grant); running
            # it alone would act with the agent's grant only.
            raise InvalidRequestError(
                f"agent {agent.name!r} is {agent.mode.value}; "
                "set its mode to AUTONOMOUS to run tasks"
            )
        run_id = uuid4()
        with submission_span(
            f"submit_task {agent.name}",
            {"cortex.org_id": org_id, "cortex.run_id": str(run_id), GEN_AI_AGENT_NAME: agent.name},
        ):
            run = TaskRun(
                id=run_id,
                org_id=org_id,
                agent_id=agent.id,
                name=name,
                goal=goal.strip(),
                max_steps=steps,
                caller_id=caller_id,
                requested_by=caller.id,
                contact_context=contact_context or None,
                # every attempt's spans go under this (the hop to the actor is the run's row)
                trace_parent=current_traceparent(),
                run_mode=run_mode,
                workflow_version_id=None if workflow is None else workflow.id,
                workflow_inputs=None if workflow is None else dict(inputs or {}),
            )
            # The submission's OK row goes in the run's own transaction: one round trip of
            # statements instead of a second transaction, and never a run without its row.
            audit = None
            if UseCase.TASKS_SUBMIT.audit_allowed:
                audit = self._audit_entry(
                    caller, UseCase.TASKS_SUBMIT, org_id, "OK", None, agent, args, run_id=run.id
                )
                if workflow is not None:
                    audit.workflow_id = workflow.workflow_id
            created = await self.store.create_run(run, audit=audit)
        if audit is not None:
            self._log_audited(caller, UseCase.TASKS_SUBMIT, "OK")
        metrics.record(metrics.RUNS_STARTED, org=org_id, agent=agent.name)
        return caller, agent, created

    async def run_autonomous(
        self,
        org_id: str,
        agent_ref: UUID | str,
        goal: str,
        *,
        max_steps: int | None = None,
        name: str = "",
        caller_id: str | None = None,
        on_step: StepCallback | None = None,
        principal: Principal | None = None,
        run_mode: RunMode = RunMode.EXECUTE,
    ) -> TaskRun:
        """Run an agent autonomously against ``goal`` here, until it finishes or the budget
        ends (``start_run`` + ``drive_run``)."""
        _, agent, run = await self._start(
            org_id, agent_ref, goal, max_steps, name, caller_id, None, principal, run_mode
        )
        return await self.cycle.drive(agent, run, on_step, owner=self.driver_id)

    async def resume_run(
        self,
        org_id: str,
        run_id: UUID,
        *,
        on_step: StepCallback | None = None,
        principal: Principal | None = None,
    ) -> TaskRun:
        """Continue a RUNNING run here, after its last recorded step (a run already ended is
        returned as it is). A run another driver holds (its lease is live: the API's
        executor, another ``runs resume``) is not driven here: it is returned RUNNING, and
        :meth:`run_lease` says who holds it."""
        caller = await self._authorize(principal, UseCase.TASKS_RESUME, org_id)
        run = await self.store.get_run(org_id, run_id)
        if run.status is RunStatus.RUNNING:
            await self._audited(caller, UseCase.TASKS_RESUME, org_id, run_id=run.id)
            return await self.cycle.resume(org_id, run_id, on_step=on_step, owner=self.driver_id)
        return run

    async def run_lease(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> LeaseHolder:
        """Who drives a run now: its lease's owner and expiry (``live`` False: nobody)."""
        await self._authorize(principal, UseCase.TASKS_GET, org_id)
        return await self.cycle.leases.holder(org_id, run_id)

    async def cancel_run(
        self,
        org_id: str,
        run_id: UUID,
        *,
        principal: Principal | None = None,
        reason: str | None = None,
    ) -> TaskRun:
        """Stop a RUNNING run, or one AWAITING_APPROVAL (its pending request is then
        CANCELLED), as the person it acts for or an admin: it becomes CANCELLED with
        the reason "cancelled by <principal>" (then ``reason``, if given) and loses its step
        intents, in one transaction; its driver stops at its next step commit, whose fenced
        write finds the run no longer RUNNING. A run that already ended is returned as it
        is: nothing is written and no executor is asked.

        Raises:
            InvalidRequestError: ``reason`` is longer than 500 characters or holds a NUL.
        """
        caller = principal or Principal.operator(org_id)
        args: dict[str, Any] = {"run": str(run_id)}
        if caller.org_id != org_id:
            await self._authorize(caller, UseCase.TASKS_CANCEL, org_id, args=args)
        run = await self.store.get_run(org_id, run_id)
        caller = await self._authorize(
            caller, UseCase.TASKS_CANCEL, org_id, owner_id=run.caller_id, args=args
        )
        if run.status not in (RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL):
            return run
        note = (reason or "").strip()
        if len(note) > 500 or "\x00" in note:
            raise InvalidRequestError("a cancel reason is at most 500 characters, without NUL")
        why = f"cancelled by {caller.id}" + (f": {note}" if note else "")
        audit = None
        if UseCase.TASKS_CANCEL.audit_allowed:
            audit = self._audit_entry(
                caller, UseCase.TASKS_CANCEL, org_id, "OK", None, None,
                {**args, "reason": why}, run_id=run_id,
            )  # fmt: skip
        if await self.store.cancel_run(org_id, run_id, why, audit=audit):
            if audit is not None:
                self._log_audited(caller, UseCase.TASKS_CANCEL, "OK")
            # The driver that loses the run records nothing (its fenced write fails): the
            # cancel is where the run ends, so it counts the run's outcome.
            agent = await self.store.get_agent(org_id, run.agent_id)
            metrics.record(
                metrics.RUNS_FINISHED, org=org_id, agent=agent.name,
                outcome=RunStatus.CANCELLED.value,
            )  # fmt: skip
        return await self.store.get_run(org_id, run_id)

    async def list_runs(
        self,
        org_id: str,
        *,
        agent_ref: UUID | str | None = None,
        limit: int = 50,
        principal: Principal | None = None,
    ) -> list[TaskRun]:
        """Recent task runs, newest first (without their step logs)."""
        await self._authorize(principal, UseCase.TASKS_LIST, org_id)
        agent_id = None if agent_ref is None else (await self.store.get_agent(org_id, agent_ref)).id
        return await self.store.list_runs(org_id, agent_id, limit=limit)

    async def get_run(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> TaskRun:
        """A run with its step log."""
        await self._authorize(principal, UseCase.TASKS_GET, org_id)
        return await self.store.get_run(org_id, run_id)

    async def run_trace(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> RunTrace:
        """The run's locally kept trace (spans in tree order; one trace per attempt unless a
        resume continued it). Empty when spans go only to a collector (``tracing.local``).

        Raises:
            NotFoundError: No such run in the organisation.
        """
        await self._authorize(principal, UseCase.TASKS_GET, org_id)
        await self.store.run_status(org_id, run_id)  # 404 for a run that does not exist
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.flush)  # this process's finished spans
        return RunTrace.of(run_id, await self.store.trace_spans(org_id, run_id))

    async def run_diagnostics(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> Diagnosis:
        """The run's diagnostic timeline over its attempts (request, model calls, candidates
        and scores, the selected action, tool input and result, retrieval evidence, stalls,
        loops, the end), its cost, and whether it is stalled now.

        Raises:
            NotFoundError: No such run in the organisation.
        """
        await self._authorize(principal, UseCase.TASKS_GET, org_id)
        run = await self.store.get_run(org_id, run_id)
        events = await self.store.diagnostics(org_id, run_id=run_id)
        cost = None if run.cost is None else run.cost.model_dump(mode="json")
        return Diagnosis.of(run.id, run.status.value, events, cost)

    async def turn_diagnostics(
        self,
        org_id: str,
        session_id: UUID,
        turn_id: UUID,
        *,
        principal: Principal | None = None,
    ) -> Diagnosis:
        """A turn's diagnostic timeline, as reading the session (its caller, or an admin).

        Raises:
            NotFoundError: No such session or turn in the organisation.
        """
        await self._session_for(principal, UseCase.SESSIONS_READ, org_id, session_id)
        turn = await self.turns.get(org_id, session_id, turn_id)
        events = await self.store.diagnostics(org_id, session_id=session_id, turn_id=turn_id)
        return Diagnosis.of(turn.id, turn.status.value, events)

    async def run_status(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> RunStatus:
        """Only a run's status (one row): what a long poll reads."""
        await self._authorize(principal, UseCase.TASKS_GET, org_id)
        return await self.store.run_status(org_id, run_id)

    # executor seam: work a use case already admitted ------------------------------------

    async def drive_run(
        self,
        org_id: str,
        run_id: UUID,
        *,
        on_step: StepCallback | None = None,
        owner: str | None = None,
    ) -> TaskRun:
        """Drive a RUNNING run to a terminal state, continuing after its last recorded step,
        holding its lease as ``owner`` (default :attr:`driver_id`).

        A run whose live lease another owner holds is returned as it is (RUNNING), and so
        is one whose lease this driver loses on the way: one driver per run. For executors
        (the run was authorised when it was started); people resume runs with
        :meth:`resume_run`."""
        return await self.cycle.resume(
            org_id, run_id, on_step=on_step, owner=owner or self.driver_id
        )

    async def orphaned_runs(self, limit: int = 1000) -> list[OrphanedRun]:
        """RUNNING runs of every organisation that nobody drives (no live lease), older
        than ``settings.runs.orphan_grace_s``: what the supervisor resumes."""
        return await self.cycle.leases.orphaned(self.settings.runs.orphan_grace_s, limit)

    async def give_up_run(self, org_id: str, run_id: UUID, reason: str) -> bool:
        """End a RUNNING run that nobody drives FAILED with ``reason`` (a run taken again
        meanwhile keeps going); ``True`` when it was ended here."""
        if not reason.strip():
            raise InvalidRequestError("a failed run needs a reason")
        return await self.cycle.leases.give_up(org_id, run_id, reason)

    async def fail_run(self, org_id: str, run_id: UUID, reason: str) -> TaskRun:
        """Give up on a RUNNING run: it becomes FAILED with ``reason`` (a supervisor that
        cannot drive it any more). A run already terminal is returned unchanged."""
        if not reason.strip():
            raise InvalidRequestError("a failed run needs a reason")
        await self.store.fail_run(org_id, run_id, reason)
        return await self.store.get_run(org_id, run_id)

    async def run_turn(
        self,
        session: Session,
        caller: Principal,
        message: str,
        *,
        turn_id: UUID | None = None,
        owner: str | None = None,
        on_event: TurnEventSink | None = None,
    ) -> TurnResult:
        """One interactive turn of ``caller`` (who must be the session's own caller):
        tool rounds through the gate, then a reply. See ``DecisionCycle.turn``.

        ``turn_id`` is a turn :meth:`accept_turn` recorded (``message`` is then its
        message); without one the turn is accepted here first (no pending bound: in-process
        callers). The turn waits for the session's earlier turns, runs under a lease held
        by ``owner`` (default :attr:`driver_id`) and ends DONE, or FAILED with the reason
        when the cycle raises (the error is raised again). An ended turn returns its stored
        result."""
        if turn_id is None:
            accepted = await self.turns.accept(session.org_id, session.id, caller.id, message)
            turn_id = accepted.id
        return await self._drive_turn(session, caller, turn_id, owner, on_event)

    async def recover_turn(
        self,
        org_id: str,
        session_id: UUID,
        turn_id: UUID,
        *,
        owner: str | None = None,
        on_event: TurnEventSink | None = None,
    ) -> TurnResult:
        """Drive an accepted turn again after its driver went away (see
        :meth:`orphaned_turns`): the caller is the turn's own, tool calls carry the same
        idempotency keys as the first attempt. An ended turn returns its stored result; one
        driven ``sessions.turn_max_attempts`` times already ends FAILED."""
        turn = await self.turns.get(org_id, session_id, turn_id)
        if turn.status.ended:
            return turn.result()
        session = await self.store.get_session(org_id, session_id)
        caller = await self.store.get_principal(org_id, turn.caller_id)
        return await self._drive_turn(session, caller, turn_id, owner, on_event)

    async def orphaned_turns(self, limit: int = 1000) -> list[TurnRef]:
        """Accepted turns that nobody drives: not ended, lease missing or expired, accepted
        over ``sessions.turn_orphan_grace_s`` ago, in a session where no turn holds a live
        lease; oldest first, across organisations. A supervisor hands each to
        ``Executor.recover_turn``."""
        return await self.turns.orphans(self.settings.sessions.turn_orphan_grace_s, limit)

    async def _drive_turn(
        self,
        session: Session,
        caller: Principal,
        turn_id: UUID,
        owner: str | None,
        on_event: TurnEventSink | None,
    ) -> TurnResult:
        policy = self.settings.sessions
        holder = owner or self.driver_id
        delay = 0.01
        while True:  # one at a time, in ordinal order: wait for the earlier turns
            claim = await self.turns.claim(
                session.org_id,
                session.id,
                turn_id,
                owner=holder,
                ttl_s=policy.turn_lease_ttl_s,
                max_attempts=policy.turn_max_attempts,
            )
            if claim.outcome == "ended":
                return claim.turn.result()
            if claim.lease is not None:
                lease = claim.lease
                break
            handoff = self._turn_ended.setdefault(session.id, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(handoff.wait(), delay)
            delay = min(delay * 2, 0.25)
        renewing = asyncio.create_task(self._renew_turn(lease), name=f"lease turn {turn_id}")
        try:
            return await self.cycle.turn(
                session, caller, lease.turn.message, lease=lease, on_event=on_event
            )
        except TurnLeaseLostError:
            # Taken over after this driver's lease expired: the new holder's outcome counts.
            log.warning("turn %s: the lease of %s was taken over", turn_id, holder)
            ended = await self.wait_turn(session.org_id, session.id, turn_id, None)
            return ended.result()
        except asyncio.CancelledError:
            # Shutting down: let another driver take the turn at once instead of at expiry.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.turns.release(lease))
            raise
        except Exception as exc:
            reason = _turn_failure(exc)
            with contextlib.suppress(TurnLeaseLostError):
                await self.turns.fail(lease, reason)
            metrics.record(metrics.TURNS_FINISHED, org=session.org_id, outcome="failed")
            raise
        finally:
            renewing.cancel()
            if (waiting := self._turn_ended.pop(session.id, None)) is not None:
                waiting.set()

    async def _renew_turn(self, lease: TurnLease) -> None:
        ttl = self.settings.sessions.turn_lease_ttl_s
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                if not await self.turns.renew(lease, ttl):
                    return  # lost: the turn's end will say so
            except Exception:
                log.warning("turn %s: renewing the lease failed", lease.turn.id, exc_info=True)

    async def wait_turn(
        self, org_id: str, session_id: UUID, turn_id: UUID, wait_s: float | None
    ) -> TurnRecord:
        """The turn once it has ended, or as it is after ``wait_s`` seconds (``None``: no
        bound): a long poll of its status with back-off, one full read at the end."""
        loop = asyncio.get_running_loop()
        deadline = None if wait_s is None else loop.time() + wait_s
        delay = 0.01
        while not (await self.turns.status(org_id, session_id, turn_id)).ended:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                break
            await asyncio.sleep(delay if left is None else min(delay, left))
            delay = min(delay * 2, 0.25)
        return await self.turns.get(org_id, session_id, turn_id)

    async def end_session(self, session: Session) -> list[MemoryRecord]:
        """End a session; the extraction pass writes the semantic facts it finds. For
        executors and in-process callers; people end sessions through
        :meth:`authorize_end_session` first."""
        return await self.learner.end_session(session, self.model)

    # sessions -----------------------------------------------------------------------------

    async def open_session(self, org_id: str, agent_ref: UUID | str, caller: Principal) -> Session:
        """Open a conversation between ``caller`` and an INTERACTIVE agent."""
        caller, agent = await self._agent_for(caller, UseCase.SESSIONS_OPEN, org_id, agent_ref)
        if agent.mode is not AgentMode.INTERACTIVE:
            raise InvalidRequestError(
                f"agent {agent.name!r} is {agent.mode.value}; set its mode to INTERACTIVE "
                "to talk with it"
            )
        await self.store.put_principal(caller)
        session = await self.store.create_session(
            Session(org_id=org_id, agent_id=agent.id, caller_id=caller.id)
        )
        await self._audited(
            caller, UseCase.SESSIONS_OPEN, org_id, agent=agent, session_id=session.id
        )
        return session

    async def _session_for(
        self, principal: Principal | None, use_case: UseCase, org_id: str, session_id: UUID
    ) -> tuple[Principal, Session]:
        caller = principal or Principal.operator(org_id)
        if caller.org_id != org_id:
            await self._authorize(caller, use_case, org_id, session_id=session_id)
        session = await self.store.get_session(org_id, session_id)
        caller = await self._authorize(
            caller, use_case, org_id, owner_id=session.caller_id, session_id=session_id
        )
        return caller, session

    async def get_session(
        self, org_id: str, session_id: UUID, *, principal: Principal | None = None
    ) -> Session:
        """A session (its caller, or an admin)."""
        _, session = await self._session_for(principal, UseCase.SESSIONS_READ, org_id, session_id)
        return session

    async def conversation(
        self, org_id: str, session_id: UUID, *, principal: Principal | None = None
    ) -> list[SessionMessage]:
        """The conversation so far (its caller, or an admin): the messages of ended turns in
        order, then the user message of each accepted turn not ended yet, by arrival; each
        with its turn's id and status (and, for a turn that ended without a reply, why)."""
        await self._session_for(principal, UseCase.SESSIONS_READ, org_id, session_id)
        return await self.turns.history(org_id, session_id)

    async def accept_turn(
        self, org_id: str, session_id: UUID, message: str, *, principal: Principal
    ) -> TurnRecord:
        """Admit a message and record it as the session's next turn (ACCEPTED), before any
        reply: from here the turn is durable. Only the session's own caller, only while it
        is open; an executor then drives it (``Executor.turn`` with its id).

        Raises:
            ConflictError: The session has ended, or it already holds
                ``sessions.max_pending_turns`` turns not ended (busy: try again later).
            InvalidRequestError: The message is empty.
        """
        try:
            session = await self.authorize_turn(org_id, session_id, principal)
            return await self.turns.accept(
                org_id,
                session.id,
                principal.id,
                message,
                max_pending=self.settings.sessions.max_pending_turns,
            )
        except ConflictError as exc:
            reason = "ended" if "has ended" in str(exc) else "busy"
            metrics.record(metrics.TURNS_REJECTED, org=org_id, reason=reason)
            raise

    async def get_turn(
        self,
        org_id: str,
        session_id: UUID,
        turn_id: UUID,
        *,
        principal: Principal | None = None,
        wait_s: float = 0.0,
    ) -> TurnRecord:
        """An accepted turn: its status, reply or refusal, and the events it emitted (the
        session's caller, or an admin, as reading the session). ``wait_s`` > 0 waits up to
        that long for a turn not ended yet to end."""
        await self._session_for(principal, UseCase.SESSIONS_READ, org_id, session_id)
        turn = await self.turns.get(org_id, session_id, turn_id)
        if turn.status.ended or wait_s <= 0:
            return turn
        return await self.wait_turn(org_id, session_id, turn_id, wait_s)

    async def turn_trace(
        self,
        org_id: str,
        session_id: UUID,
        turn_id: UUID,
        *,
        principal: Principal | None = None,
    ) -> RunTrace:
        """The locally kept trace a turn belongs to (the request's it was accepted in, with
        the turn's ``invoke_agent`` tree wherever it was driven), as reading the session.
        Empty for a turn accepted without tracing, or when spans go only to a collector.

        Raises:
            NotFoundError: No such session or turn in the organisation.
        """
        await self._session_for(principal, UseCase.SESSIONS_READ, org_id, session_id)
        turn = await self.turns.get(org_id, session_id, turn_id)
        parts = (turn.trace_parent or "").split("-")
        if len(parts) < 2:
            return RunTrace.of(turn_id, [])
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.flush)
        return RunTrace.of(turn_id, await self.store.spans_of_trace(org_id, parts[1]))

    async def authorize_turn(self, org_id: str, session_id: UUID, principal: Principal) -> Session:
        """Admit a message: only the session's own caller, only while it is open
        (``ConflictError`` once it ended). The turn itself runs in an executor."""
        _, session = await self._session_for(
            principal, UseCase.SESSIONS_MESSAGE, org_id, session_id
        )
        if session.status is not SessionStatus.OPEN:
            raise ConflictError(f"session {session_id} has ended")
        return session

    async def authorize_end_session(
        self, org_id: str, session_id: UUID, *, principal: Principal | None = None
    ) -> Session:
        """Admit ending a session (its caller, or an admin); the executor then ends it.

        A session that already ended is returned as it is (status ENDED) and nothing is
        written: the caller answers with it and wakes no executor (ending is idempotent)."""
        caller, session = await self._session_for(
            principal, UseCase.SESSIONS_END, org_id, session_id
        )
        if session.status is SessionStatus.OPEN:
            await self._audited(caller, UseCase.SESSIONS_END, org_id, session_id=session_id)
        return session

    # tools --------------------------------------------------------------------------------

    async def list_tools(
        self,
        org_id: str,
        *,
        agent_ref: UUID | str | None = None,
        principal: Principal | None = None,
    ) -> list[ToolSpec]:
        """Every tool of this runtime, or (with ``agent_ref``) what the caller may use with
        that agent: the agent's grant ∩ the caller's grant."""
        if agent_ref is None:
            await self._authorize(principal, UseCase.TOOLS_LIST, org_id)
            tools = (self.registry.get(name) for name in self.registry.names())
            return [self.registry.spec(tool) for tool in tools if tool is not None]
        caller, agent = await self._agent_for(principal, UseCase.TOOLS_LIST, org_id, agent_ref)
        return self.dispatcher.action_space(agent, caller, AgentMode.INTERACTIVE)

    async def invoke_tool(
        self,
        org_id: str,
        agent_ref: UUID | str,
        caller: Principal,
        tool: str,
        args: dict[str, Any],
        *,
        idempotency_key: str | None = None,
    ) -> Observation:
        """A direct call (not chosen by a model), as ``caller``, through the invocation gate,
        which decides it (agent grant ∩ caller grant) and audits it like any call.

        ``idempotency_key`` (the HTTP ``Idempotency-Key`` header) reaches the tool as
        ``ToolContext.idempotency_key``, namespaced by caller, agent and tool
        (``call:<caller>:<agent id>:<tool>:<key>``) so that no other caller's key can
        replay this one's result; a tool that writes returns its first result for a
        repeated key (docs/architecture.md, "Writing a tool").

        Raises:
            InvalidRequestError: The key is empty, longer than 200 characters or not
                printable ASCII.
            NotFoundError: No tool of that name here.
        """
        if caller.org_id != org_id:
            raise InvalidRequestError("the caller belongs to another organisation")
        if idempotency_key is not None and not (
            0 < len(idempotency_key) <= 200
            and idempotency_key.isascii()
            and idempotency_key.isprintable()
        ):
            raise InvalidRequestError("an idempotency key is 1 to 200 printable ASCII characters")
        if self.registry.get(tool) is None:
            raise NotFoundError(f"unknown tool {tool!r}")
        agent = await self.store.get_agent(org_id, agent_ref)
        key = (
            None
            if idempotency_key is None
            else f"call:{caller.id}:{agent.id}:{tool}:{idempotency_key}"
        )
        ctx = InvocationContext(
            agent=agent, caller=caller, mode=AgentMode.INTERACTIVE, idempotency_key=key
        )
        return await self.dispatcher.invoke(ctx, tool, args)

    # memory -------------------------------------------------------------------------------

    async def search_memory(
        self,
        org_id: str,
        agent_ref: UUID | str,
        query: str,
        *,
        k: int = 5,
        kinds: Sequence[MemoryKind] | None = None,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        principal: Principal | None = None,
    ) -> tuple[Agent, list[ScoredMemory]]:
        """Recall an agent's long-term memory (α·similarity + β·recency + γ·importance), as
        of a time if asked. Admins, or a caller who may use ``memory_search`` with it."""
        args = {"query": query[:200], "k": k}
        caller, agent = await self._agent_for(
            principal, UseCase.MEMORY_SEARCH, org_id, agent_ref, args=args
        )
        hits = await self.memory.recall(
            org_id=org_id,
            agent_id=agent.id,
            query=query,
            k=k,
            kinds=list(kinds) if kinds else None,
            valid_at=valid_at,
            known_at=known_at,
        )
        await self._audited(caller, UseCase.MEMORY_SEARCH, org_id, agent=agent, args=args)
        return agent, hits

    async def list_facts(
        self,
        org_id: str,
        agent_ref: UUID | str,
        *,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        principal: Principal | None = None,
    ) -> tuple[Agent, list[MemoryRecord]]:
        """The agent's semantic facts (latest per subject, or as of a time); the same right
        as memory search."""
        args = {"facts": True}
        caller, agent = await self._agent_for(
            principal, UseCase.MEMORY_SEARCH, org_id, agent_ref, args=args
        )
        facts = await self.memory.facts(
            org_id=org_id, agent_id=agent.id, valid_at=valid_at, known_at=known_at
        )
        await self._audited(caller, UseCase.MEMORY_SEARCH, org_id, agent=agent, args=args)
        return agent, facts

    async def list_proposals(
        self,
        org_id: str,
        agent_ref: UUID | str,
        *,
        status: ProposalStatus | None = None,
        principal: Principal | None = None,
    ) -> tuple[Agent, list[ProceduralProposal]]:
        """An agent (by id or name) and its proposed procedural edits (persona, skills),
        oldest first."""
        _, agent = await self._agent_for(principal, UseCase.PROPOSALS_LIST, org_id, agent_ref)
        return agent, await self.memory.proposals(org_id=org_id, agent_id=agent.id, status=status)

    async def decide_proposal(
        self,
        org_id: str,
        proposal_id: UUID,
        *,
        approve: bool,
        principal: Principal | None = None,
    ) -> ProceduralProposal:
        """Approve or reject a proposed procedural edit (an admin person): approval changes
        the agent and records a PROCEDURAL memory, in one transaction."""
        args = {"proposal": str(proposal_id), "approve": approve}
        caller = await self._authorize(principal, UseCase.PROPOSALS_DECIDE, org_id, args=args)
        decided = await self.memory.decide_proposal(
            org_id=org_id, proposal_id=proposal_id, approver=caller, approve=approve
        )
        await self._audited(caller, UseCase.PROPOSALS_DECIDE, org_id, args=args)
        return decided

    # evaluation (issue 14, point 6; docs/evaluation.md) ------------------------------------

    async def eval_case_from_run(
        self,
        org_id: str,
        run_id: UUID,
        *,
        name: str | None = None,
        description: str = "",
        checks: Sequence[Check] | None = None,
        principal: Principal | None = None,
    ) -> EvalCase:
        """A regression case from an ended run: its cassette (each step's working memory,
        model outputs, decision and result) and ``checks`` (default: the run's recorded
        status, and every decision as recorded).

        Raises:
            InvalidRequestError: the run is still running, or a step has no recording.
        """
        await self._authorize(principal, UseCase.TASKS_GET, org_id)
        run = await self.store.get_run(org_id, run_id, recordings=True)
        try:
            cassette = cassette_from_run(run)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from exc
        if checks is None:
            checks = (StatusIs(equals=run.status), SameDecisions())
        try:
            return EvalCase(
                name=name or f"run-{run.id}",
                description=description or run.goal[:200],
                cassette=cassette,
                checks=tuple(checks),
            )
        except ValidationError as exc:
            raise InvalidRequestError(f"case: {_first_error(exc)}") from exc

    async def save_eval_suite(
        self, org_id: str, suite: EvalSuite, *, principal: Principal | None = None
    ) -> EvalSuite:
        """Save ``suite``'s cases as its next version (the same cases as the latest version
        are that version) and return it with its version number."""
        args = {"suite": suite.name, "cases": len(suite.cases)}
        caller = await self._authorize(principal, UseCase.EVALS_WRITE, org_id, args=args)
        return await self._save_suite(caller, org_id, suite)

    async def _save_suite(self, caller: Principal, org_id: str, suite: EvalSuite) -> EvalSuite:
        await self.store.ensure_org(org_id)  # a suite file may be the first thing an org holds
        saved = await self.evals.save_suite(org_id, suite, caller.id)
        args = {"suite": suite.name, "cases": len(suite.cases), "version": saved.version}
        await self._audited(caller, UseCase.EVALS_WRITE, org_id, args=args)
        return saved

    async def add_eval_case(
        self,
        org_id: str,
        suite_name: str,
        case: EvalCase,
        *,
        description: str | None = None,
        principal: Principal | None = None,
    ) -> EvalSuite:
        """The suite's next version: its latest cases with ``case`` added (replacing a case
        of the same name), or version 1 of a new suite."""
        args = {"suite": suite_name, "case": case.name}
        caller = await self._authorize(principal, UseCase.EVALS_WRITE, org_id, args=args)
        try:
            latest = await self.evals.get_suite(org_id, suite_name)
            cases = (*(c for c in latest.cases if c.name != case.name), case)
            about = latest.description if description is None else description
        except NotFoundError:
            cases, about = (case,), description or ""
        try:
            suite = EvalSuite(name=suite_name, description=about, cases=cases)
        except ValidationError as exc:
            raise InvalidRequestError(f"suite: {_first_error(exc)}") from exc
        return await self._save_suite(caller, org_id, suite)

    async def get_eval_suite(
        self,
        org_id: str,
        name: str,
        *,
        version: int | None = None,
        principal: Principal | None = None,
    ) -> EvalSuite:
        """A suite's version (default: the latest), with its cases."""
        await self._authorize(principal, UseCase.EVALS_READ, org_id)
        return await self.evals.get_suite(org_id, name, version)

    async def list_eval_suites(
        self, org_id: str, *, principal: Principal | None = None
    ) -> list[EvalSuiteSummary]:
        await self._authorize(principal, UseCase.EVALS_READ, org_id)
        return await self.evals.list_suites(org_id)

    async def run_eval_suite(
        self,
        org_id: str,
        name: str,
        *,
        version: int | None = None,
        mode: EvalMode = EvalMode.REPLAY,
        model: ModelClient | None = None,
        judge: bool | ModelClient = False,
        overrides: dict[str, Any] | None = None,
        principal: Principal | None = None,
    ) -> EvalRun:
        """Run a saved suite and store the run and its per-case results.

        ``replay`` (the default) answers the model calls from the recordings: no model is
        needed, and the run shows where today's prompts, planner and settings decide
        otherwise. ``live`` asks ``model`` (default: this runtime's chat model); the recorded
        results answer the tools, so nothing acts on the world. ``judge``: model-scored
        checks are asked of this model (``True``: the runtime's), else they are skipped.
        Each case replays under the DECIDE settings it was recorded with (K, the
        evaluation, ...); ``overrides`` changes them (``{"candidates": 3}``), which is how a
        planner setting is tried on recorded runs.

        Raises:
            InvalidRequestError: an override that is not a DECIDE setting or not valid.
        """
        args: dict[str, Any] = {
            "suite": name,
            "version": version,
            "mode": mode.value,
            "overrides": overrides or {},
        }
        caller = await self._authorize(principal, UseCase.EVALS_RUN, org_id, args=args)
        try:
            decide_settings(self.settings, {}, overrides)
        except (ValueError, ValidationError) as exc:
            why = _first_error(exc) if isinstance(exc, ValidationError) else str(exc)
            raise InvalidRequestError(f"overrides: {why}") from exc
        suite = await self.evals.get_suite(org_id, name, version)
        live = model or self.model
        if mode is EvalMode.LIVE and live is None:
            raise InvalidRequestError("a live eval run needs a model, and this runtime has none")
        grader: ModelClient | None = None
        if judge is True:
            grader = self.model
        elif judge is not False:
            grader = judge
        ran = await run_suite(
            suite,
            self.settings,
            org_id=org_id,
            mode=mode,
            model=live if mode is EvalMode.LIVE else None,
            judge=grader,
            created_by=caller.id,
            overrides=overrides,
        )
        await self.evals.save_run(org_id, ran)
        await self._audited(
            caller,
            UseCase.EVALS_RUN,
            org_id,
            args={**args, "version": suite.version, "eval_run": str(ran.id), "passed": ran.passed},
        )
        return ran

    async def get_eval_run(
        self, org_id: str, eval_run_id: UUID, *, principal: Principal | None = None
    ) -> EvalRun:
        await self._authorize(principal, UseCase.EVALS_READ, org_id)
        return await self.evals.get_run(org_id, eval_run_id)

    async def list_eval_runs(
        self,
        org_id: str,
        *,
        suite: str | None = None,
        limit: int = 50,
        principal: Principal | None = None,
    ) -> list[EvalRunSummary]:
        await self._authorize(principal, UseCase.EVALS_READ, org_id)
        return await self.evals.list_runs(org_id, suite, limit)

    async def compare_eval_runs(
        self, org_id: str, a: UUID, b: UUID, *, principal: Principal | None = None
    ) -> RunComparison:
        """Suite run ``b`` against ``a``: cases fixed and broken, per-case changes, metric
        deltas (b − a)."""
        await self._authorize(principal, UseCase.EVALS_READ, org_id)
        return compare_runs(
            await self.evals.get_run(org_id, a), await self.evals.get_run(org_id, b)
        )

    # knowledge ----------------------------------------------------------------------------

    async def search_knowledge(
        self,
        org_id: str,
        query: str,
        *,
        collection: Sequence[str] | None = None,
        k: int = 10,
        fusion: Fusion | None = None,
        rerank: bool = True,
        principal: Principal | None = None,
    ) -> SearchResult:
        """Hybrid search over the organisation's published knowledge, every hit cited.
        Admins, or callers granted ``knowledge_search``.

        Raises:
            UnavailableError: This runtime was built without a knowledge store.
        """
        args = {"query": query[:200], "k": k, "collection": list(collection or ())}
        caller = await self._authorize(principal, UseCase.KNOWLEDGE_SEARCH, org_id, args=args)
        if self.knowledge is None:
            raise UnavailableError("this runtime was built without a knowledge store")
        for name in collection or ():
            if not name or "\x00" in name or len(name) > 128:
                raise InvalidRequestError("collection: 1 to 128 characters, no NUL")
        # A collection with readers listed is searched only by them (and admins).
        scope = await _graph.readable_scope(
            self.knowledge, org_id, caller.id, collection or None, is_admin=caller.is_admin
        )
        result = await self.knowledge.search(
            org_id, query, collection=scope, k=k, fusion=fusion, rerank=rerank
        )
        result = await self._with_source_warnings(org_id, result)
        await self._audited(caller, UseCase.KNOWLEDGE_SEARCH, org_id, args=args)
        return result

    async def _with_source_warnings(self, org_id: str, result: SearchResult) -> SearchResult:
        """Hits from unhealthy sources say so (their collection's latest health report)."""
        async with self.db.connection() as conn:
            sources = [h.source_id for h in result.hits]
            warnings = await _graph.source_warnings(conn, org_id, sources)
        if not warnings:
            return result
        hits = [h.model_copy(update={"warning": warnings.get(h.source_id)}) for h in result.hits]
        return result.model_copy(update={"hits": hits})

    # source health (docs/graph.md, "Source health") -------------------------------------------

    async def set_freshness_policy(
        self,
        org_id: str,
        collection: str,
        expected_interval_s: float,
        *,
        expires_after_s: float | None = None,
        path: str | None = None,
        principal: Principal | None = None,
    ) -> None:
        """How often a collection's sources (or one source, ``path``) are expected to be
        updated; a source not read within it is STALE, within ``expires_after_s`` (default
        four intervals) EXPIRED. Admins."""
        args = {"collection": collection, "expected_interval_s": expected_interval_s}
        caller = await self._authorize(principal, UseCase.SOURCES_POLICY, org_id, args=args)
        await _graph.SourceHealthMonitor(self.db).set_policy(
            org_id, collection, expected_interval_s, expires_after_s=expires_after_s, path=path
        )
        await self._audited(caller, UseCase.SOURCES_POLICY, org_id, args=args)

    async def check_source_health(
        self, org_id: str, collection: str, *, principal: Principal | None = None
    ) -> _graph.SourceHealthReport:
        """Check every source of the collection and persist the report. Admins."""
        args = {"collection": collection}
        caller = await self._authorize(principal, UseCase.SOURCES_CHECK, org_id, args=args)
        report = await _graph.SourceHealthMonitor(self.db).check(org_id, collection)
        await self._audited(caller, UseCase.SOURCES_CHECK, org_id, args=args)
        return report

    async def source_health(
        self, org_id: str, collection: str, *, principal: Principal | None = None
    ) -> _graph.SourceHealthReport | None:
        """The collection's latest health report (``None`` before the first check)."""
        await self._authorize(principal, UseCase.SOURCES_HEALTH, org_id)
        return await _graph.SourceHealthMonitor(self.db).latest(org_id, collection)

    # context graph (docs/graph.md) ---------------------------------------------------------

    async def search_graph(
        self,
        org_id: str,
        *,
        terms: Sequence[str] = (),
        entity_ids: Sequence[UUID] = (),
        source_ids: Sequence[UUID] = (),
        depth: int = 1,
        max_facts: int = 50,
        per_entity: int = 10,
        predicates: Sequence[str] | None = None,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        path_to: UUID | None = None,
        principal: Principal | None = None,
    ) -> _graph.GraphResult:
        """Seeds (terms, entity ids, the sources of knowledge hits) → entities → neighbours
        within the budgets, as of ``valid_at`` / ``known_at``; with ``path_to``, a shortest
        path from the one entity id given to it (``depth`` long at most). Facts whose source
        the caller may not read are left out before anything is returned. Admins, or callers
        granted ``graph_search``."""
        args = {"terms": [t[:100] for t in terms][:10], "depth": depth, "max_facts": max_facts}
        caller = await self._authorize(principal, UseCase.GRAPH_SEARCH, org_id, args=args)
        reader = _graph.Reader(caller.id, caller.is_admin, valid_at, known_at)
        if path_to is not None:
            if len(entity_ids) != 1 or terms or source_ids:
                raise InvalidRequestError("a path search takes one entity id and path_to")
            result = await self.graph.path(
                org_id, reader, entity_ids[0], path_to, max_depth=depth, per_entity=per_entity,
                predicates=predicates,
            )  # fmt: skip
        else:
            result = await self.graph.search(
                org_id, reader, terms=terms, entity_ids=entity_ids, source_ids=source_ids,
                depth=depth, max_facts=max_facts, per_entity=per_entity, predicates=predicates,
            )  # fmt: skip
        await self._audited(caller, UseCase.GRAPH_SEARCH, org_id, args=args)
        return result

    async def submit_triples(
        self, org_id: str, triples: Sequence[_graph.Triple], *, principal: Principal | None = None
    ) -> _graph.SubmitReport:
        """Record the caller's own facts (one extraction run of method ``user``); a
        ``functional`` predicate's newer fact closes the older one's validity. Admins, or
        writers granted ``graph_submit``."""
        args = {"triples": len(triples)}
        caller = await self._authorize(principal, UseCase.GRAPH_SUBMIT, org_id, args=args)
        if not 1 <= len(triples) <= 1000:
            raise InvalidRequestError("triples: 1 to 1000 per call")
        report = await self.graph.submit(org_id, triples, principal_id=caller.id)
        await self._audited(caller, UseCase.GRAPH_SUBMIT, org_id, args=args)
        return report

    async def set_collection_readers(
        self,
        org_id: str,
        collection: str,
        principal_ids: Sequence[str],
        *,
        principal: Principal | None = None,
    ) -> None:
        """Restrict who may read a collection's facts (none listed: every member). Admins."""
        args = {"collection": collection, "readers": list(principal_ids)[:50]}
        caller = await self._authorize(principal, UseCase.COLLECTION_READERS, org_id, args=args)
        await self.graph.set_collection_readers(org_id, collection, principal_ids)
        await self._audited(caller, UseCase.COLLECTION_READERS, org_id, args=args)

    # principals and API keys ------------------------------------------------------------

    async def authenticate(self, key: str) -> Principal | None:
        """The principal of a bearer API key, or ``None`` for an unknown or revoked one."""
        return await self.store.principal_for_api_key(key)

    async def create_api_key(
        self,
        org_id: str,
        principal_id: str,
        *,
        name: str = "",
        admin: bool | None = None,
        grant: Iterable[str] | None = None,
        kind: PrincipalKind = PrincipalKind.USER,
        principal: Principal | None = None,
    ) -> ApiKeyCreated:
        """A bearer key for ``principal_id`` (admin only), shown once; only its hash is kept.

        A new principal gets what the arguments say (no ``grant``: no tools, fail closed);
        for an existing one, ``admin`` and ``grant`` replace its settings when given."""
        args = {"principal": principal_id, "name": name, "admin": admin}
        caller = await self._authorize(principal, UseCase.API_KEYS_CREATE, org_id, args=args)
        if kind is PrincipalKind.AGENT:
            raise InvalidRequestError("API keys are for users and services, not agents")
        try:
            existing: Principal | None = await self.store.get_principal(org_id, principal_id)
        except NotFoundError:
            existing = None
        is_admin = admin if admin is not None else bool(existing and existing.is_admin)
        policy = existing.grant if existing else None
        if grant is not None:
            policy = Grant(tools=frozenset(grant))
        try:
            wanted = Principal(
                id=principal_id,
                org_id=org_id,
                kind=kind,
                name=existing.name if existing else principal_id,
                is_admin=is_admin,
                grant=policy,
            )
        except ValidationError as exc:
            raise InvalidRequestError(f"invalid principal: {_first_error(exc)}") from exc
        if existing != wanted:
            await self.store.put_principal(wanted)
        key, key_id = await self.store.create_api_key(wanted, name)
        await self._audited(
            caller, UseCase.API_KEYS_CREATE, org_id, args={**args, "key_id": str(key_id)}
        )
        warnings: tuple[str, ...] = ()
        if wanted.grant is None or not (wanted.grant.tools or wanted.grant.action_types):
            # Fail closed is right, but silent: say so while the key is being handed out.
            cannot = "call no tool" if is_admin else "call no tool nor search memory or knowledge"
            warnings = (
                f"principal {principal_id!r} has no grant: this key can {cannot} until it is "
                "granted some (create a key again with a grant, e.g. --grant current_time, "
                "or --grant '*' for every tool)",
            )
        return ApiKeyCreated(key=key, key_id=key_id, principal=wanted, warnings=warnings)

    async def revoke_api_key(
        self, org_id: str, key_id: UUID, *, principal: Principal | None = None
    ) -> ApiKeyRevoked:
        """Revoke a key (admin only): requests with it are refused from then on. Revoking a
        revoked key changes nothing and returns when it was revoked.

        Raises:
            NotFoundError: No such key in the organisation.
        """
        args = {"key_id": str(key_id)}
        caller = await self._authorize(principal, UseCase.API_KEYS_REVOKE, org_id, args=args)
        revoked_at, revoked_now = await self.store.revoke_api_key(org_id, key_id)
        if revoked_now:
            await self._audited(caller, UseCase.API_KEYS_REVOKE, org_id, args=args)
        return ApiKeyRevoked(key_id=key_id, revoked_at=revoked_at, revoked_now=revoked_now)


def _retrieval_tools(
    db: Database, knowledge: KnowledgeService | None
) -> tuple[_graph.GraphStore, list[Tool]]:
    """The context graph's store, and the RETRIEVAL tools an agent gets by naming them
    (registered, not built in): ``knowledge_search`` (with a knowledge store) and
    ``graph_search``."""
    graph = _graph.GraphStore(db)
    searching = [knowledge_search_tool(knowledge)] if knowledge is not None else []
    return graph, [*searching, _graph.graph_search_tool(graph)]


def _configured_reranker(settings: Settings) -> Reranker | None:
    """The CrossEncoder ``reranker_model`` names, loaded in this process; a named model
    that does not load stops the start (a reranker asked for by name is not skipped)."""
    if settings.embeddings.reranker_model is None:
        return None
    reranker = CrossEncoderReranker(
        settings.embeddings.reranker_model, device=settings.embeddings.device
    )
    if not reranker.available:
        raise ConfigurationError(
            f"reranker_model={settings.embeddings.reranker_model}: {reranker.reason}"
        )
    return reranker


def _turn_failure(exc: BaseException) -> str:
    """Why a turn failed, as its row keeps it: a cortex-ray error's own message (written for
    a client), only the kind of anything else (its detail goes to the log)."""
    if isinstance(exc, CortexError):
        return f"the turn failed: {str(exc)[:500]}"
    return f"the turn failed: internal error ({type(exc).__name__})"


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ())) or "value"
    return f"{where}: {error.get('msg', 'invalid')}"
