"""``Runtime``: the public façade of the door.

It opens and wires the parts once (``Runtime.open``, through the composition root
``_open``) and offers every use case the HTTP API, the CLI and Python callers have, with
the names they have always had. Each use case lives in the service of its domain
(``_agents``, ``_runs``, ``_sessions``, ``_tools``, ``_memory``, ``_knowledge``,
``_graph``, ``_evals``, ``_keys``; ``governance`` and ``workflows`` are reached as
attributes), takes the calling principal and is decided and audited by the one
``UseCaseGate`` (``_gate``). ``drive_run``, ``run_turn``, ``end_session`` and the rest of
the executor seam (``_execution``) are what an ``Executor`` calls for work a use case
already admitted.

In-process callers that name no principal act as ``Principal.operator(org)``: the person at
the machine, who holds the database anyway. Anything acting for someone else passes that
someone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from cortex_ray._exceptions import UnavailableError
from cortex_ray.act import Tool, ToolHook
from cortex_ray.governance import Connector
from cortex_ray.mcp import McpClient
from cortex_ray.memory import ImportanceScorer
from cortex_ray.models import Embedder, ModelClient, Reranker
from cortex_ray.observability import Tracing
from cortex_ray.runtime._agents import AgentUseCases
from cortex_ray.runtime._delegate import delegate
from cortex_ray.runtime._evals import EvalUseCases
from cortex_ray.runtime._execution import Execution
from cortex_ray.runtime._graph import GraphUseCases
from cortex_ray.runtime._keys import KeyUseCases
from cortex_ray.runtime._knowledge import KnowledgeUseCases
from cortex_ray.runtime._mcp_config import UrlGuard
from cortex_ray.runtime._memory import MemoryUseCases
from cortex_ray.runtime._open import Parts, open_parts
from cortex_ray.runtime._runs import RunUseCases
from cortex_ray.runtime._sessions import SessionUseCases
from cortex_ray.runtime._tools import ToolUseCases
from cortex_ray.settings import Settings
from cortex_ray.storage import Database

__all__ = ["Runtime"]


class Runtime:
    """Everything the decision cycle needs, wired once, and the use cases on top. Open with
    :meth:`open`.

    A façade: each use case is a one-line delegation (``delegate``) to the method of the
    same name on its domain's service, typed with that method's own signature (and showing
    its docstring), so callers keep one flat surface while each room stays small; the
    ``governance`` and ``workflows`` use cases are reached as those attributes. The parts
    (``store``, ``registry``, ``cycle``, ``memory``, ...) are plain attributes.
    """

    def __init__(self, parts: Parts) -> None:
        """Hold wired ``parts`` (``_open.wire`` / ``open_parts``); use :meth:`open`."""
        self.settings = parts.settings
        self.db = parts.db
        self.store = parts.store
        self.turns = parts.turns
        self.evals = parts.evals
        self.memory = parts.memory
        self.model = parts.model
        self.knowledge = parts.knowledge
        self.access = parts.access
        self.graph = parts.graph
        self.registry = parts.registry
        self.connector_policy = parts.connector_policy
        self.secrets = parts.secrets
        self.dispatcher = parts.dispatcher
        self.governance = parts.governance
        """Connectors, grants, the audit log, approvals, schedules, secrets: use cases."""
        self.workflows = parts.workflows
        """Workflow definitions, immutable versions, runs and their ledgers: use cases."""
        self.connectors = parts.connectors
        """MCP servers as connectors: register, refresh and pin, approve, tiers: use cases."""
        self.mcp_client = parts.mcp_client
        self.mcp_refresher = parts.mcp_refresher
        """Keeps pinned MCP definitions live: on announced changes; ``start()`` sweeps."""
        self.composer = parts.composer
        self.assembler = parts.assembler
        self.autonomous = parts.autonomous
        self.interactive = parts.interactive
        self.learner = parts.learner
        self.cycle = parts.cycle
        self.driver_id = parts.driver_id
        """Who this runtime is as the holder of a run's lease (unique per instance; a run
        actor drives as its actor name instead: ``drive_run(owner=...)``)."""
        self._traces = parts.traces
        self._agents = parts.agents
        self._runs = parts.runs
        self._sessions = parts.sessions
        self._tools = parts.tools
        self._memory = parts.memory_cases
        self._knowledge = parts.knowledge_cases
        self._graph = parts.graph_cases
        self._evals = parts.eval_cases
        self._keys = parts.keys
        self._execution = parts.execution
        self._owns_model = parts.owns_model
        self._owns_db = parts.owns_db
        self._mcp_client = parts.mcp_client if parts.owns_mcp_client else None

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
        mcp_client: McpClient | None = None,
        mcp_url_guard: UrlGuard | None = None,
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
        offer (``cortex_ray.governance.discover_connectors``). ``mcp_client`` speaks to the
        MCP servers organisations register (``runtime.connectors``); ``mcp_url_guard``
        checks their URLs. The caller closes the client.
        """
        parts = await open_parts(
            settings, model=model, embedder=embedder, importance=importance, tools=tools,
            hooks=hooks, db=db, reranker=reranker, critic_model=critic_model,
            connectors=connectors, mcp_client=mcp_client, mcp_url_guard=mcp_url_guard,
        )  # fmt: skip
        return cls(parts)

    @property
    def tracing(self) -> Tracing | None:
        """This process's tracing (``None``: off, or closed with the runtime)."""
        return self._traces.tracing

    async def close(self, *, close_db: bool = True) -> None:
        """Release the run leases this runtime still holds (the next driver takes the runs
        at once, without waiting for the leases to expire), then close the model and the
        database if this runtime opened them."""
        await self.cycle.leases.release_all()
        # Background importance scoring first: it uses the model and the database.
        await self.memory.aclose()
        if self.model is not None and self._owns_model:
            await self.model.aclose()
        await self.mcp_refresher.aclose()
        if self._mcp_client is not None:  # the stdio servers this process started stop
            await self._mcp_client.aclose()
        await self._traces.close()  # flushes the spans still queued
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

    # agents
    list_agents = delegate("_agents", AgentUseCases.list_agents)
    get_agent = delegate("_agents", AgentUseCases.get_agent)
    create_agent = delegate("_agents", AgentUseCases.create_agent)
    update_agent = delegate("_agents", AgentUseCases.update_agent)

    # tasks
    start_run = delegate("_runs", RunUseCases.start_run)
    run_autonomous = delegate("_runs", RunUseCases.run_autonomous)
    resume_run = delegate("_runs", RunUseCases.resume_run)
    run_lease = delegate("_runs", RunUseCases.run_lease)
    resume_or_wait = delegate("_runs", RunUseCases.resume_or_wait)
    cancel_run = delegate("_runs", RunUseCases.cancel_run)
    list_runs = delegate("_runs", RunUseCases.list_runs)
    get_run = delegate("_runs", RunUseCases.get_run)
    run_trace = delegate("_runs", RunUseCases.run_trace)
    run_diagnostics = delegate("_runs", RunUseCases.run_diagnostics)
    run_status = delegate("_runs", RunUseCases.run_status)

    # the executor seam: work a use case already admitted
    drive_run = delegate("_execution", Execution.drive_run)
    orphaned_runs = delegate("_execution", Execution.orphaned_runs)
    give_up_run = delegate("_execution", Execution.give_up_run)
    fail_run = delegate("_execution", Execution.fail_run)
    run_turn = delegate("_execution", Execution.run_turn)
    recover_turn = delegate("_execution", Execution.recover_turn)
    orphaned_turns = delegate("_execution", Execution.orphaned_turns)
    wait_turn = delegate("_execution", Execution.wait_turn)
    end_session = delegate("_execution", Execution.end_session)

    # sessions
    open_session = delegate("_sessions", SessionUseCases.open_session)
    get_session = delegate("_sessions", SessionUseCases.get_session)
    conversation = delegate("_sessions", SessionUseCases.conversation)
    accept_turn = delegate("_sessions", SessionUseCases.accept_turn)
    get_turn = delegate("_sessions", SessionUseCases.get_turn)
    follow_turn = delegate("_sessions", SessionUseCases.follow_turn)
    turn_trace = delegate("_sessions", SessionUseCases.turn_trace)
    turn_diagnostics = delegate("_sessions", SessionUseCases.turn_diagnostics)
    authorize_turn = delegate("_sessions", SessionUseCases.authorize_turn)
    authorize_end_session = delegate("_sessions", SessionUseCases.authorize_end_session)

    # tools
    list_tools = delegate("_tools", ToolUseCases.list_tools)
    invoke_tool = delegate("_tools", ToolUseCases.invoke_tool)

    # memory
    search_memory = delegate("_memory", MemoryUseCases.search_memory)
    list_facts = delegate("_memory", MemoryUseCases.list_facts)
    list_proposals = delegate("_memory", MemoryUseCases.list_proposals)
    decide_proposal = delegate("_memory", MemoryUseCases.decide_proposal)

    # evaluation (docs/evaluation.md)
    eval_case_from_run = delegate("_evals", EvalUseCases.eval_case_from_run)
    save_eval_suite = delegate("_evals", EvalUseCases.save_eval_suite)
    add_eval_case = delegate("_evals", EvalUseCases.add_eval_case)
    get_eval_suite = delegate("_evals", EvalUseCases.get_eval_suite)
    list_eval_suites = delegate("_evals", EvalUseCases.list_eval_suites)
    run_eval_suite = delegate("_evals", EvalUseCases.run_eval_suite)
    get_eval_run = delegate("_evals", EvalUseCases.get_eval_run)
    list_eval_runs = delegate("_evals", EvalUseCases.list_eval_runs)
    compare_eval_runs = delegate("_evals", EvalUseCases.compare_eval_runs)

    # knowledge and source health (docs/graph.md, "Source health")
    search_knowledge = delegate("_knowledge", KnowledgeUseCases.search_knowledge)
    set_freshness_policy = delegate("_knowledge", KnowledgeUseCases.set_freshness_policy)
    check_source_health = delegate("_knowledge", KnowledgeUseCases.check_source_health)
    source_health = delegate("_knowledge", KnowledgeUseCases.source_health)

    # context graph (docs/graph.md)
    search_graph = delegate("_graph", GraphUseCases.search_graph)
    submit_triples = delegate("_graph", GraphUseCases.submit_triples)
    set_collection_readers = delegate("_graph", GraphUseCases.set_collection_readers)

    # principals and API keys
    authenticate = delegate("_keys", KeyUseCases.authenticate)
    create_api_key = delegate("_keys", KeyUseCases.create_api_key)
    revoke_api_key = delegate("_keys", KeyUseCases.revoke_api_key)
