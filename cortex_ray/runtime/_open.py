"""The composition root: the one place that opens and wires a runtime's parts.

``open_parts`` starts or reaches the database and opens the models the settings name;
``wire`` builds everything on top of them once: the stores, the tool registry and its
invocation gate, the drivers and the decision cycle, the ``UseCaseGate`` and the use-case
services (one per domain), and the executor seam. ``Runtime`` (the façade) holds the
``Parts`` and delegates to them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from uuid import uuid4

import cortex_ray.graph as _graph
from cortex_ray._exceptions import ConfigurationError
from cortex_ray.access import AccessControlService
from cortex_ray.act import (
    ActionClassifier,
    Tool,
    ToolDispatcher,
    ToolHook,
    ToolRegistry,
    builtin_tools,
)
from cortex_ray.cycle import DecisionCycle, build_drivers
from cortex_ray.decide import AutonomousDriver, InteractiveDriver
from cortex_ray.evals import EvalStore
from cortex_ray.governance import (
    Connector,
    ConnectorPolicy,
    GovernanceStore,
    InputLimits,
    SecretStore,
    discover_connectors,
)
from cortex_ray.knowledge import KnowledgeService, knowledge_search_tool
from cortex_ray.learn import Learner
from cortex_ray.mcp import McpClient
from cortex_ray.memory import EMBEDDING_DIM, ImportanceScorer, MemoryService, importance_scorer_for
from cortex_ray.models import (
    CrossEncoderReranker,
    Embedder,
    ModelClient,
    ModelSlot,
    Reranker,
    open_models,
)
from cortex_ray.observability import Tracing
from cortex_ray.perceive import PromptComposer, ToolRetriever, WorkingMemoryAssembler
from cortex_ray.runtime._admission import Admission
from cortex_ray.runtime._agents import AgentUseCases
from cortex_ray.runtime._connectors import McpConnectors
from cortex_ray.runtime._evals import EvalUseCases
from cortex_ray.runtime._execution import Execution
from cortex_ray.runtime._gate import AccessGate
from cortex_ray.runtime._governance import Governance
from cortex_ray.runtime._graph import GraphUseCases
from cortex_ray.runtime._keys import KeyUseCases
from cortex_ray.runtime._knowledge import KnowledgeUseCases
from cortex_ray.runtime._mcp_config import UrlGuard
from cortex_ray.runtime._mcp_refresh import McpListRefresher
from cortex_ray.runtime._mcp_wiring import wire_mcp
from cortex_ray.runtime._memory import MemoryUseCases
from cortex_ray.runtime._runs import RunUseCases
from cortex_ray.runtime._sessions import SessionUseCases
from cortex_ray.runtime._tools import ToolUseCases
from cortex_ray.runtime._traces import Traces
from cortex_ray.runtime._workflows import Workflows
from cortex_ray.settings import Settings, load_settings
from cortex_ray.storage import Database, Store, TurnStore

__all__ = ["Parts", "open_parts", "wire"]


@dataclass(slots=True)
class Parts:
    """A runtime's parts, wired once (see ``wire``); ``owns_model`` / ``owns_db``: whether
    closing the runtime closes them (``open_parts`` opened them)."""

    settings: Settings
    db: Database
    store: Store
    turns: TurnStore
    evals: EvalStore
    memory: MemoryService
    model: ModelClient | None
    knowledge: KnowledgeService | None
    access: AccessControlService
    graph: _graph.GraphStore
    registry: ToolRegistry
    connector_policy: ConnectorPolicy
    secrets: SecretStore
    dispatcher: ToolDispatcher
    composer: PromptComposer
    assembler: WorkingMemoryAssembler
    autonomous: AutonomousDriver
    interactive: InteractiveDriver
    learner: Learner
    cycle: DecisionCycle
    traces: Traces
    driver_id: str
    governance: Governance
    workflows: Workflows
    agents: AgentUseCases
    runs: RunUseCases
    sessions: SessionUseCases
    tools: ToolUseCases
    memory_cases: MemoryUseCases
    knowledge_cases: KnowledgeUseCases
    graph_cases: GraphUseCases
    eval_cases: EvalUseCases
    keys: KeyUseCases
    execution: Execution
    connectors: McpConnectors
    mcp_refresher: McpListRefresher
    mcp_client: McpClient
    owns_model: bool = False
    owns_db: bool = False
    owns_mcp_client: bool = False


def wire(
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
    mcp_client: McpClient | None = None,
    mcp_url_guard: UrlGuard | None = None,
) -> Parts:
    """Everything the decision cycle and the use cases need, built once on the database,
    the memory and the models given. ``mcp_client``: none is an ``SdkMcpClient`` of this
    process (the Ray layer gives one actor per organisation and server); ``mcp_url_guard``:
    none is ``check_mcp_url`` with ``connectors.mcp_allowed_hosts``."""
    store = Store(db)
    turns = TurnStore(db)
    access = AccessControlService()
    graph, searching = _retrieval_tools(db, knowledge)  # registered, not built in
    registry = ToolRegistry([*builtin_tools(), *searching, *tools], classifier)
    # Connector tools are decided by their grants too, in the same gate (issue 18).
    connector_policy = ConnectorPolicy(
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
    secrets = SecretStore(db, settings.governance, settings.storage.data_dir)
    mcp = wire_mcp(db, settings, mcp_client, mcp_url_guard)
    registry.attach(mcp.overlay)
    dispatcher = ToolDispatcher(
        registry,
        access,
        store,
        settings.tools,
        tracing=settings.tracing,
        memory=memory,
        hooks=hooks,
        governance=connector_policy,
        secrets=secrets,
    )
    # DECIDE's drivers, built where an evaluation's replay builds them (critic, recorder).
    drivers = build_drivers(settings, model, critic_model=critic_model)
    composer = drivers.composer
    # Above the threshold the prompt shows the tools retrieved for the objective, found
    # with the memory's embedder (one query vector a step; tool vectors are cached).
    tool_retrieval = ToolRetriever(
        memory.embedder,
        settings.knowledge,
        threshold=settings.decide.tool_retrieval_threshold,
        k=settings.decide.tool_retrieval_k,
    )
    assembler = WorkingMemoryAssembler(
        memory, dispatcher, recall_k=settings.memory.recall_k, tools=tool_retrieval
    )
    autonomous, interactive = drivers.autonomous, drivers.interactive
    learner = Learner(db, store, memory)
    cycle = DecisionCycle(
        settings=settings,
        db=db,
        store=store,
        registry=registry,
        assembler=assembler,
        dispatcher=dispatcher,
        autonomous=autonomous,
        interactive=interactive,
        learner=learner,
    )
    # Spans of this process's cycles go to an OTLP collector and/or this database's
    # trace_spans (settings.tracing; docs/operations.md, "Traces").
    traces = Traces(Tracing.open(settings.tracing, db.dsn))
    # Who this runtime is as the holder of a run's lease (unique per instance; a run actor
    # drives as its actor name instead: ``drive_run(owner=...)``).
    driver_id = f"{socket.gethostname()}:{os.getpid()}:{uuid4().hex[:8]}"
    gate = AccessGate(store, registry, access)
    evals = EvalStore(db)
    admission = Admission(
        store, model, settings.runs.max_in_progress, recent_s=settings.runs.orphan_grace_s,
        deadline_s=min(settings.sessions.turn_deadline_s, settings.runs.step_deadline_s),
    )  # fmt: skip
    runs = RunUseCases(gate, store, cycle, settings, traces, driver_id, admission)
    mcp_connectors = McpConnectors(
        gate=gate, store=store, mcp=mcp.store, governance=connector_policy.store,
        policy=connector_policy, overlay=mcp.overlay, client=mcp.client, secrets=secrets,
        url_guard=mcp.url_guard, list_timeout_s=mcp.call_timeout_s,
    )  # fmt: skip

    def tools_of(connector: str) -> list[str]:
        """The names of the registered tools that belong to ``connector``."""
        found = (registry.get(name) for name in registry.names())
        return [t.name for t in found if t is not None and t.connector == connector]

    async def tool_connector(org_id: str, name: str) -> tuple[bool, str | None]:
        """Whether a tool is registered (or is the organisation's own), and its connector."""
        await registry.load(org_id)
        tool = registry.get(name, org_id)
        return tool is not None, None if tool is None else tool.connector

    async def connectors_of(org_id: str) -> list[str]:
        """The connectors in code and the organisation's registered MCP servers."""
        mine = [r.name for r in await mcp.store.registrations(org_id)]
        return [*connector_policy.connectors, *mine]

    return Parts(
        settings=settings, db=db, store=store, turns=turns, evals=evals, memory=memory,
        model=model, knowledge=knowledge, access=access, graph=graph, registry=registry,
        connector_policy=connector_policy, secrets=secrets, dispatcher=dispatcher,
        composer=composer, assembler=assembler, autonomous=autonomous,
        interactive=interactive, learner=learner, cycle=cycle, traces=traces,
        driver_id=driver_id,
        governance=Governance(
            gate=gate, store=store, governance=connector_policy.store, policy=connector_policy,
            tools_of=tools_of, excludes_requester=settings.governance.approval_excludes_requester,
            secrets=secrets, input_limits=input_limits,
            mcp_tools_of=mcp_connectors.tool_names, mcp_health=mcp_connectors.health_of,
        ),
        workflows=Workflows(
            gate=gate, store=store, governance=connector_policy.store,
            tool_connector=tool_connector,
            connectors=connectors_of,
            start=runs.start, input_limits=input_limits,
        ),
        agents=AgentUseCases(gate, store, registry),
        runs=runs,
        sessions=SessionUseCases(gate, store, turns, settings, traces, admission),
        tools=ToolUseCases(gate, store, registry, dispatcher),
        memory_cases=MemoryUseCases(gate, memory),
        knowledge_cases=KnowledgeUseCases(gate, db, knowledge),
        graph_cases=GraphUseCases(gate, graph),
        eval_cases=EvalUseCases(gate, store, evals, settings, model),
        keys=KeyUseCases(gate, store),
        execution=Execution(
            cycle=cycle, store=store, turns=turns, learner=learner, model=model,
            settings=settings, driver_id=driver_id,
        ),
        connectors=mcp_connectors,
        mcp_refresher=mcp.refresher(mcp_connectors),
        mcp_client=mcp.client,
        owns_mcp_client=mcp.owns_client,
    )  # fmt: skip


async def open_parts(
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
    mcp_client: McpClient | None = None,
    mcp_url_guard: UrlGuard | None = None,
) -> Parts:
    """Start or reach the database, open the models the settings name, and ``wire`` the
    rest (see ``Runtime.open``); what this call opened is closed again if a later step
    fails, and is the runtime's to close (``Parts.owns_model``, ``owns_db``)."""
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
                settings.memory, chat_model, structured_retries=settings.models.structured_retries
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
        wired = wire(
            settings=settings,
            db=database,
            memory=memory,
            model=chat_model,
            tools=tools,
            hooks=hooks,
            knowledge=knowledge,
            critic_model=critic_model,
            connectors=connectors,
            mcp_client=mcp_client,
            mcp_url_guard=mcp_url_guard,
        )
        # Close only what this call opened; a caller's model or database is theirs.
        wired.owns_model = opens_chat
        wired.owns_db = db is None
        return wired
    except BaseException:
        if chat_model is not None and opens_chat:
            await chat_model.aclose()
        if db is None:
            await database.close()
        raise


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
