"""The HTTP API as a FastAPI app: tasks, agents, sessions with streamed replies, direct tool
calls, memory search, health.

``create_app`` takes the runtime (or the settings to open one) and the ``Executor`` that
drives runs and turns, so the same app runs in-process (tests, one machine) and as the Ray
Serve ingress (``serve.ApiIngress``) in front of session actors.

Every route under ``/api/orgs/{org}`` authenticates a bearer API key and checks that its
principal belongs to ``{org}``; a principal of another organisation gets 404, exactly as if
nothing existed there, so no route tells one tenant anything about another.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol, runtime_checkable
from uuid import UUID

from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import AwareDatetime
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

import cortex_ray
from cortex_ray import (
    ApiOptions,
    ConflictError,
    Executor,
    InProcessExecutor,
    MemoryKind,
    Principal,
    ProposalStatus,
    RunStatus,
    RunSupervisor,
    Runtime,
    SessionStatus,
    Settings,
    TaskRun,
    TurnEvent,
    TurnEventKind,
    TurnResult,
    events_until,
    load_settings,
)
from cortex_ray.evals import EvalRun, EvalSuite, EvalSuiteSummary, RunComparison
from cortex_ray.knowledge import Fusion, HealthSweeper, SourceHealthMonitor
from cortex_ray.storage import TurnRecord, TurnStatus
from serve._errors import ApiProblem, error_response, install_error_handlers, report
from serve._schemas import (
    ORG_PATTERN,
    AgentBody,
    AgentCreate,
    AgentList,
    AgentUpdate,
    ApiError,
    DiagnosticsBody,
    EvalCaseCreate,
    EvalRunCreate,
    EvalRunList,
    EvalSuiteCreate,
    EvalSuiteList,
    FactList,
    Health,
    KnowledgeHit,
    KnowledgeSearch,
    MemoryBody,
    MemoryHit,
    MemorySearch,
    MessageCreate,
    MessageList,
    ObservationBody,
    PrincipalBody,
    ProposalBody,
    ProposalDecision,
    ProposalList,
    SessionBody,
    SessionCreate,
    SessionEnded,
    TaskAccepted,
    TaskBody,
    TaskCancel,
    TaskCreate,
    TaskList,
    TaskSummary,
    TaskTrace,
    ToolBody,
    ToolCall,
    ToolList,
    TurnApprovalRequired,
    TurnBody,
    TurnDone,
    TurnError,
    TurnObservation,
    TurnRefused,
    TurnReply,
    TurnStarted,
    TurnStatusBody,
    TurnToolCall,
    TurnTrace,
    from_agent,
    from_eval_suite,
    from_observation,
    from_run,
    from_session,
)
from serve._tracing import TraceRequests

__all__ = [
    "ApiOptions",
    "ApiState",
    "ExecutorFactory",
    "RuntimeFactory",
    "create_app",
]

log = logging.getLogger("serve.api")

RuntimeFactory = Callable[[], Awaitable[Runtime]]
"""Opens the runtime the app serves (called once, at start-up, in the serving process)."""

ExecutorFactory = Callable[[Runtime], "Executor | Awaitable[Executor]"]
"""Builds the executor for the opened runtime (e.g. ``InProcessExecutor``)."""

MAX_WAIT_S = 60.0


def options_for(runtime: Runtime | Settings | object | None) -> ApiOptions:
    """The serving options of these settings (or of an open runtime's), else the
    environment's (``CORTEX_API__*``)."""
    if isinstance(runtime, Runtime):
        return runtime.settings.api
    if isinstance(runtime, Settings):
        return runtime.api
    return load_settings().api


@dataclass(frozen=True, slots=True)
class ApiState:
    """What the routes use: the open runtime and the executor, and the turns this process
    is waiting on (held here: asyncio keeps only weak references to tasks, and a turn must
    outlive the request whose client went away)."""

    runtime: Runtime
    executor: Executor
    turns: set[asyncio.Future[Any]] = field(default_factory=set)

    def keep(self, task: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """Hold ``task`` until it ends."""
        self.turns.add(task)
        task.add_done_callback(self.turns.discard)
        task.add_done_callback(_retrieve)
        return task


@runtime_checkable
class _RunWaiter(Protocol):
    """Executors that can wait for a run to end (``actors.SessionManager``); not part of
    the ``Executor`` protocol (yet)."""

    async def wait_run(self, org_id: str, run_id: UUID) -> object: ...


def _waiter(executor: Executor, org: str, run_id: UUID) -> Awaitable[object] | None:
    """Something to await until the run ends, if the executor offers it."""
    if isinstance(executor, _RunWaiter):
        return executor.wait_run(org, run_id)
    if isinstance(executor, InProcessExecutor):
        return executor.wait(run_id)
    return None


async def _open_runtime(source: Runtime | Settings | RuntimeFactory | None) -> Runtime:
    if isinstance(source, Runtime):
        return source
    if source is None or isinstance(source, Settings):
        # The backend registry opens a ``served`` model through its entry point.
        return await Runtime.open(source or load_settings())
    return await source()


async def _build_executor(source: Executor | ExecutorFactory | None, runtime: Runtime) -> Executor:
    if source is None:
        return InProcessExecutor(runtime)
    if isinstance(source, Executor):
        return source
    made = source(runtime)
    return await made if inspect.isawaitable(made) else made


async def _aclose(thing: object) -> None:
    close = getattr(thing, "aclose", None)
    if close is not None:
        result = close()
        if inspect.isawaitable(result):
            await result


# dependencies ----------------------------------------------------------------------------


def _state(request: Request) -> ApiState:
    state: ApiState | None = getattr(request.app.state, "api", None)
    if state is None:
        raise ApiProblem(503, "the runtime is not open yet")
    return state


StateDep = Annotated[ApiState, Depends(_state)]

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="apiKey",
    description="An API key from `cortex-ray api-keys create`: `Authorization: Bearer crx_…`",
)


async def _authenticate(
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None:
        raise ApiProblem(
            401,
            "missing API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = await state.runtime.authenticate(credentials.credentials)
    if principal is None:
        raise ApiProblem(
            401,
            "unknown or revoked API key",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    return principal


OrgPath = Annotated[str, Path(pattern=ORG_PATTERN, description="the organisation (tenant) id")]


async def _member(
    org: OrgPath, principal: Annotated[Principal, Depends(_authenticate)]
) -> Principal:
    # 404, not 403: to a principal of another organisation, nothing exists there.
    if principal.org_id != org:
        raise ApiProblem(404, f"organisation {org!r} not found")
    return principal


MemberDep = Annotated[Principal, Depends(_member)]
AgentRef = Annotated[
    str, Path(pattern=r"^[^\x00]{1,200}$", description="the agent's id or its name")
]
ToolName = Annotated[str, Path(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")]
SuiteName = Annotated[str, Path(pattern=r"^[^\x00]{1,200}$", description="the suite's name")]


@dataclass(frozen=True, slots=True)
class _StartedTurn:
    turn: TurnRecord
    running: asyncio.Future[TurnResult]
    events: asyncio.Queue[TurnEvent]


async def _started_turn(
    state: StateDep, org: OrgPath, session_id: UUID, principal: MemberDep, body: MessageCreate
) -> _StartedTurn:
    """The message recorded as the session's next turn (the caller's own session, still
    open, not busy) and handed to the executor, before the event stream starts: a refusal is
    an ordinary JSON error response, and a client that goes away at once loses nothing."""
    turn = await state.runtime.accept_turn(org, session_id, body.message, principal=principal)
    events: asyncio.Queue[TurnEvent] = asyncio.Queue()
    running = asyncio.ensure_future(
        state.executor.turn(
            org,
            turn.session_id,
            principal,
            turn.message,
            turn_id=turn.id,
            on_event=events.put_nowait,
        )
    )
    state.keep(running)
    return _StartedTurn(turn, running, events)


async def _readable_turn(
    state: StateDep, org: OrgPath, session_id: UUID, turn_id: UUID, principal: MemberDep
) -> TurnRecord:
    """A turn of a session the caller may read (its caller, or an admin)."""
    return await state.runtime.get_turn(org, session_id, turn_id, principal=principal)


def _last_seen(
    turn_id: UUID,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            max_length=100,
            description="the id of the last event the client has (`<turnId>:<seq>`)",
        ),
    ] = None,
    after: Annotated[
        int | None,
        Query(ge=0, le=1_000_000, description="replay the events after this sequence number"),
    ] = None,
) -> int:
    """The sequence number of the last event the client has; -1: none (replay from
    ``started``)."""
    if last_event_id is not None and last_event_id.strip():
        turn_part, _, seq = last_event_id.strip().rpartition(":")
        if turn_part != str(turn_id) or not seq.isdigit():
            raise ApiProblem(422, f"Last-Event-ID must be '{turn_id}:<seq>'")
        return int(seq)
    return -1 if after is None else after


def _event_id(turn_id: UUID, seq: int) -> str:
    return f"{turn_id}:{seq}"


def _sse(event: str, body: Any, *, event_id: str | None = None) -> ServerSentEvent:
    data = body.model_dump(mode="json", by_alias=True) if hasattr(body, "model_dump") else body
    return ServerSentEvent(event=event, data=data, id=event_id)


def _turn_event(event: TurnEvent, *, event_id: str | None = None) -> ServerSentEvent:
    if event.kind is TurnEventKind.TOOL_CALL:
        return _sse(
            "tool_call",
            TurnToolCall(round=event.round, tool=event.tool or "", args=event.args or {}),
            event_id=event_id,
        )
    if (
        event.kind is TurnEventKind.APPROVAL_REQUIRED
        and event.approval_id is not None
        and event.expires_at is not None
    ):
        asked = TurnApprovalRequired(
            round=event.round,
            approval_id=event.approval_id,
            tool=event.tool or "",
            args=event.args or {},
            reason=event.text or "",
            approvers=list(event.approvers or ()),
            expires_at=event.expires_at,
        )
        return _sse("approval_required", asked, event_id=event_id)
    if event.kind is TurnEventKind.OBSERVATION and event.observation is not None:
        body = from_observation(event.observation).model_dump()
        return _sse("observation", TurnObservation(round=event.round, **body), event_id=event_id)
    if event.kind is TurnEventKind.REPLY:
        return _sse("reply", TurnReply(message=event.text or ""), event_id=event_id)
    return _sse("refused", TurnRefused(reason=event.text or "no reply"), event_id=event_id)


def _turn_done(session_id: UUID, result: TurnResult, *, event_id: str) -> ServerSentEvent:
    body = TurnDone(
        session_id=session_id,
        reply=result.reply,
        refused=result.refused,
        observations=len(result.observations),
    )
    return _sse("done", body, event_id=event_id)


def _turn_error(exc: BaseException, what: str, *, event_id: str) -> ServerSentEvent:
    # The stream has started (200): the refusal travels as an event with the status the
    # request would otherwise have got.
    problem = report(exc, what=what)
    error = TurnError(
        status=problem.status,
        code=problem.code,
        message=problem.message,
        correlation_id=problem.correlation_id,
    )
    return _sse("error", error, event_id=event_id)


def _retrieve(task: asyncio.Future[Any]) -> None:
    # A turn (or wait) outlives its request when the client goes away; mark its error as
    # retrieved (the request reports it when still there) so asyncio does not warn.
    if not task.cancelled() and (error := task.exception()) is not None:
        log.debug("background %s ended with %r", task, error)


async def _wait_terminal(
    state: ApiState, org: str, principal: Principal, run: TaskRun, wait_s: float
) -> TaskRun:
    """Wait up to ``wait_s`` for a RUNNING run to end (long poll)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    waiter = _waiter(state.executor, org, run.id)
    if waiter is not None:
        # Shielded: a timeout here must never cancel the run itself.
        waiting = asyncio.ensure_future(waiter)
        waiting.add_done_callback(_retrieve)
        try:
            async with asyncio.timeout(wait_s):
                await asyncio.shield(waiting)
        except TimeoutError:
            pass
        run = await state.runtime.get_run(org, run.id, principal=principal)
    delay = 0.01
    status = run.status
    # Driven elsewhere (another replica, a session actor): poll the status (one row) with
    # back-off, and read the ledger once at the end.
    while status is RunStatus.RUNNING and (left := deadline - loop.time()) > 0:
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, 0.25)
        status = await state.runtime.run_status(org, run.id, principal=principal)
    if status is run.status:
        return run
    return await state.runtime.get_run(org, run.id, principal=principal)


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ApiError, "description": text}
    for status, text in (
        (401, "no valid API key"),
        (404, "not found in this organisation (or another organisation's path)"),
        (422, "invalid request"),
    )
}


# the app ---------------------------------------------------------------------------------


class _Api(FastAPI):
    """FastAPI, refusing a declared oversized body with the JSON error body before any of it
    is read. (A body without ``Content-Length`` is counted as it streams in, by FastAPI's
    ``max_body_size``, which raises the 413 that ``install_error_handlers`` renders; for a
    declared length Starlette would answer in plain text.)"""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.max_body_size is not None:
            declared = Headers(scope=scope).get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_body_size:
                response = error_response(
                    413,
                    f"the request body is larger than this server accepts "
                    f"({self.max_body_size} bytes)",
                )
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(
    runtime: Runtime | Settings | RuntimeFactory | None = None,
    executor: Executor | ExecutorFactory | None = None,
    *,
    options: ApiOptions | None = None,
) -> FastAPI:
    """Build the HTTP API.

    Args:
        runtime: An open ``Runtime`` (the caller closes it), or ``Settings`` / a factory
            (or ``None``: settings from the environment) to open one at start-up and close at
            shutdown, in the serving process.
        executor: Drives runs and turns. An ``Executor`` is used as given (the caller closes
            it); a factory gets the opened runtime; ``None`` means an ``InProcessExecutor``.
            Either of the last two is closed at shutdown. The app's start-up also starts a
            ``RunSupervisor`` on them: RUNNING runs that nobody drives are resumed.
        options: Limits and serving options (default: the settings' ``api``, from
            ``CORTEX_API__*``).
    """
    opts = options or options_for(runtime)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            state: ApiState | None = getattr(app.state, "api", None)
            if state is None:
                opened = await _open_runtime(runtime)
                if opened is not runtime:
                    stack.push_async_callback(opened.close)
                made = await _build_executor(executor, opened)
                if made is not executor:
                    stack.push_async_callback(_aclose, made)
                app.state.api = state = ApiState(opened, made)
            elif executor is None:
                stack.push_async_callback(_aclose, state.executor)
            # Resumes the runs nobody drives (interrupted by a stop or a crash), now and
            # periodically; stopped first on the way out (the stack unwinds in reverse).
            supervisor = RunSupervisor(state.runtime, state.executor)
            await supervisor.start()
            stack.push_async_callback(supervisor.aclose)
            every = state.runtime.settings.knowledge.health_check_interval_s
            if every is not None:  # the source health monitor, on a schedule (docs/graph.md)
                knowledge = state.runtime.settings.knowledge
                sweeper = HealthSweeper(
                    SourceHealthMonitor(state.runtime.db),
                    every,
                    retention_days=knowledge.health_report_retention_days,
                )
                await sweeper.start()
                stack.push_async_callback(sweeper.aclose)
            log.info("cortex-ray API ready (executor: %s)", type(state.executor).__name__)
            try:
                yield
            finally:
                app.state.api = None

    app = _Api(
        title="cortex-ray",
        version=cortex_ray.__version__,
        summary="A CoALA agent runtime: tasks, agents, sessions, tools and memory.",
        lifespan=lifespan,
        max_body_size=opts.max_body_bytes,
        docs_url="/docs" if opts.docs else None,
        redoc_url=None,
        generate_unique_id_function=lambda route: route.name,
    )
    app.state.api = None
    if isinstance(runtime, Runtime) and (executor is None or isinstance(executor, Executor)):
        # Usable at once, also by a client that does not run the ASGI lifespan.
        app.state.api = ApiState(runtime, executor or InProcessExecutor(runtime))
    install_error_handlers(app)
    app.add_middleware(TraceRequests, prefix="/api/")
    app.include_router(_health_router())
    app.include_router(_me_router())
    app.include_router(_org_router())
    app.include_router(_governance_router())
    # The context graph's routes live in their own module, which imports this one's
    # dependencies (hence imported here, not at the top).
    from serve._graph import graph_router
    from serve._workflows import workflows_router

    app.include_router(graph_router())
    app.include_router(workflows_router())
    return app


def _governance_router() -> APIRouter:
    from serve._governance import governance_router  # it imports this module's dependencies

    return governance_router()


def _health_router() -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        """Liveness: the process answers. Open (no key)."""
        return Health(status="ok")

    @router.get(
        "/readyz",
        response_model=Health,
        responses={503: {"model": ApiError, "description": "not ready"}},
    )
    async def readyz(request: Request) -> Health:
        """Readiness: the runtime is open and the database answers. Open (no key)."""
        await _state(request).runtime.ping()
        return Health(status="ready")

    return router


def _me_router() -> APIRouter:
    router = APIRouter(prefix="/api", tags=["principals"], responses={401: _ERRORS[401]})

    @router.get("/me", response_model=PrincipalBody, response_model_by_alias=True)
    async def whoami(principal: Annotated[Principal, Depends(_authenticate)]) -> PrincipalBody:
        """The principal the API key belongs to (and so its organisation)."""
        return PrincipalBody.of(principal)

    return router


def _org_router() -> APIRouter:
    router = APIRouter(
        prefix="/api/orgs/{org}",
        dependencies=[Depends(_member)],
        responses=dict(_ERRORS),
    )

    # agents ------------------------------------------------------------------------------

    @router.get("/agents", response_model=AgentList, tags=["agents"])
    async def list_agents(state: StateDep, org: OrgPath, principal: MemberDep) -> AgentList:
        """The organisation's agents."""
        agents = await state.runtime.list_agents(org, principal=principal)
        return AgentList(agents=[from_agent(a) for a in agents])

    @router.post(
        "/agents",
        response_model=AgentBody,
        status_code=201,
        tags=["agents"],
        responses={403: {"model": ApiError, "description": "not an admin"}},
    )
    async def create_agent(
        state: StateDep, org: OrgPath, principal: MemberDep, body: AgentCreate
    ) -> AgentBody:
        """Create an agent (admin only). Default tools: every built-in; default grant: its tools."""
        agent = await state.runtime.create_agent(
            org,
            body.name,
            persona=body.persona,
            mode=body.mode,
            tools=body.tools,
            skills=body.skills,
            grant=None if body.grant is None else body.grant.to_grant(),
            critic=body.critic,
            principal=principal,
        )
        return from_agent(agent)

    @router.get("/agents/{agent_ref}", response_model=AgentBody, tags=["agents"])
    async def get_agent(
        state: StateDep, org: OrgPath, principal: MemberDep, agent_ref: AgentRef
    ) -> AgentBody:
        """One agent, by id or name."""
        return from_agent(await state.runtime.get_agent(org, agent_ref, principal=principal))

    @router.patch(
        "/agents/{agent_ref}",
        response_model=AgentBody,
        tags=["agents"],
        responses={403: {"model": ApiError, "description": "not an admin"}},
    )
    async def update_agent(
        state: StateDep, org: OrgPath, principal: MemberDep, agent_ref: AgentRef, body: AgentUpdate
    ) -> AgentBody:
        """Change an agent's mode, persona, tools, skills, grant or critic (admin only)."""
        changed = await state.runtime.update_agent(
            org, agent_ref, body.to_changes(), principal=principal
        )
        return from_agent(changed)

    # memory ------------------------------------------------------------------------------

    @router.get(
        "/agents/{agent_ref}/memory",
        response_model=MemorySearch,
        tags=["memory"],
        responses={403: {"model": ApiError, "description": "memory_search not granted"}},
    )
    async def search_memory(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        agent_ref: AgentRef,
        query: Annotated[str, Query(pattern=r"^[^\x00]{1,2000}$")],
        k: Annotated[int, Query(ge=1, le=50)] = 5,
        kind: Annotated[list[MemoryKind] | None, Query(max_length=3)] = None,
        valid_at: Annotated[AwareDatetime | None, Query(alias="validAt")] = None,
        known_at: Annotated[AwareDatetime | None, Query(alias="knownAt")] = None,
    ) -> MemorySearch:
        """Recall an agent's long-term memory: α·similarity + β·recency + γ·importance.

        Allowed to admins and to callers granted ``memory_search`` (with this agent).
        ``validAt``/``knownAt`` read as of a time (valid time, record time)."""
        agent, hits = await state.runtime.search_memory(
            org,
            agent_ref,
            query,
            k=k,
            kinds=kind or None,
            valid_at=valid_at,
            known_at=known_at,
            principal=principal,
        )
        return MemorySearch(agent_id=agent.id, query=query, results=[MemoryHit.of(h) for h in hits])

    @router.get(
        "/agents/{agent_ref}/memory/facts",
        response_model=FactList,
        tags=["memory"],
        responses={403: {"model": ApiError, "description": "memory_search not granted"}},
    )
    async def list_facts(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        agent_ref: AgentRef,
        valid_at: Annotated[AwareDatetime | None, Query(alias="validAt")] = None,
        known_at: Annotated[AwareDatetime | None, Query(alias="knownAt")] = None,
    ) -> FactList:
        """The agent's semantic facts (latest per subject, or as of a time)."""
        agent, facts = await state.runtime.list_facts(
            org, agent_ref, valid_at=valid_at, known_at=known_at, principal=principal
        )
        return FactList(agent_id=agent.id, facts=[MemoryBody.of(f) for f in facts])

    @router.get(
        "/agents/{agent_ref}/proposals",
        response_model=ProposalList,
        tags=["memory"],
    )
    async def list_proposals(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        agent_ref: AgentRef,
        status: ProposalStatus | None = None,
    ) -> ProposalList:
        """The agent's proposed edits of its procedural memory (persona, skills), oldest
        first; only ``status`` when given. An edit takes effect only when approved."""
        agent, proposals = await state.runtime.list_proposals(
            org, agent_ref, status=status, principal=principal
        )
        return ProposalList(agent_id=agent.id, proposals=[ProposalBody.of(p) for p in proposals])

    @router.post(
        "/proposals/{proposal_id}/decision",
        response_model=ProposalBody,
        tags=["memory"],
        responses={
            403: {"model": ApiError, "description": "not an admin person"},
            422: {"model": ApiError, "description": "already decided"},
        },
    )
    async def decide_proposal(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        proposal_id: UUID,
        body: ProposalDecision,
    ) -> ProposalBody:
        """Approve (the edit is applied and recorded as PROCEDURAL memory, in one
        transaction) or reject a proposed edit. Admin persons only."""
        decided = await state.runtime.decide_proposal(
            org, proposal_id, approve=body.approve, principal=principal
        )
        return ProposalBody.of(decided)

    # knowledge ---------------------------------------------------------------------------

    @router.get(
        "/knowledge/search",
        response_model=KnowledgeSearch,
        tags=["knowledge"],
        responses={
            403: {"model": ApiError, "description": "knowledge_search not granted"},
            503: {"model": ApiError, "description": "this runtime has no knowledge store"},
        },
    )
    async def search_knowledge(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        query: Annotated[str, Query(pattern=r"^[^\x00]{1,2000}$")],
        collection: Annotated[
            list[str] | None, Query(max_length=16, description="search only these collections")
        ] = None,
        k: Annotated[int, Query(ge=1, le=50)] = 10,
        fusion: Fusion | None = None,
        rerank: bool = True,
    ) -> KnowledgeSearch:
        """Hybrid search (BM25 in PostgreSQL + pgvector, fused, reranked when a reranker is
        available) over the organisation's published knowledge; every hit carries its
        citation. Allowed to admins and to callers granted ``knowledge_search``."""
        result = await state.runtime.search_knowledge(
            org,
            query,
            collection=collection or None,
            k=k,
            fusion=fusion,
            rerank=rerank,
            principal=principal,
        )
        return KnowledgeSearch(
            query=result.query,
            hits=[KnowledgeHit.of(h) for h in result.hits],
            tiers=result.tiers,
            fusion=result.fusion,
            reranked=result.reranked,
            reranker=result.reranker,
            skipped=result.skipped,
            publications=result.publications,
        )

    # tasks -------------------------------------------------------------------------------

    @router.post("/tasks", response_model=TaskAccepted, status_code=202, tags=["tasks"])
    async def create_task(
        state: StateDep, org: OrgPath, principal: MemberDep, body: TaskCreate, response: Response
    ) -> TaskAccepted:
        """Start an autonomous run of an AUTONOMOUS agent; poll the returned location.

        The objective is the payload's first non-empty goal, objective, instructions or
        description; ``contactContext`` is kept with the run and shown to the agent with it.
        The run acts for ``callerUserId`` (default: the caller); ``requestedBy`` records the
        calling principal."""
        payload = body.payload
        goal = payload.objective_text()
        if goal is None:
            raise ApiProblem(
                422, "payload needs a non-empty goal, objective, instructions or description"
            )
        run = await state.runtime.start_run(
            org,
            body.agent_id,
            goal,
            max_steps=payload.max_steps,
            name=body.name,
            caller_id=payload.caller_user_id or principal.id,
            contact_context=payload.contact_context,
            principal=principal,
            run_mode=body.run_mode,
        )
        await state.executor.start_run(org, run.id)
        location = f"/api/orgs/{org}/tasks/{run.id}"
        response.headers["Location"] = location
        return TaskAccepted(
            id=run.id,
            status=run.status,
            agent_id=run.agent_id,
            max_steps=run.max_steps,
            location=location,
        )

    @router.get("/tasks", response_model=TaskList, tags=["tasks"])
    async def list_tasks(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        agent_id: Annotated[str | None, Query(alias="agentId", pattern=r"^[^\x00]{1,200}$")] = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
    ) -> TaskList:
        """Recent task runs, newest first (without their step logs)."""
        runs = await state.runtime.list_runs(
            org, agent_ref=agent_id, limit=limit, principal=principal
        )
        return TaskList(tasks=[from_run(r, with_steps=False) for r in runs])

    @router.get("/tasks/{task_id}", response_model=TaskBody, tags=["tasks"])
    async def get_task(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        task_id: UUID,
        wait: Annotated[
            float,
            Query(
                ge=0,
                le=MAX_WAIT_S,
                description="seconds to wait for a RUNNING run to end before answering",
            ),
        ] = 0,
    ) -> TaskSummary:
        """A task run: status (RUNNING, AWAITING_APPROVAL, COMPLETED, FAILED, CANCELLED), its
        step log and its result."""
        run = await state.runtime.get_run(org, task_id, principal=principal)
        if run.status is RunStatus.RUNNING and wait > 0:
            run = await _wait_terminal(state, org, principal, run, wait)
        return from_run(run)

    @router.get("/tasks/{task_id}/diagnostics", response_model=DiagnosticsBody, tags=["tasks"])
    async def get_task_diagnostics(
        state: StateDep, org: OrgPath, principal: MemberDep, task_id: UUID
    ) -> DiagnosticsBody:
        """A task run's diagnostic timeline over its attempts: model calls, decisions with
        their candidates and scores, tool calls with input and result (scrubbed), retrieval
        evidence, stalls, loops, the end, and what the run cost."""
        found = await state.runtime.run_diagnostics(org, task_id, principal=principal)
        return DiagnosticsBody.of(found)

    @router.get("/tasks/{task_id}/trace", response_model=TaskTrace, tags=["tasks"])
    async def get_task_trace(
        state: StateDep, org: OrgPath, principal: MemberDep, task_id: UUID
    ) -> TaskTrace:
        """A task run's trace: one span tree per attempt (``invoke_agent`` → steps →
        perceive / decide / ``execute_tool`` / learn, model and retrieval calls beneath),
        from the spans this deployment keeps locally (docs/operations.md, "Traces")."""
        return TaskTrace.of(await state.runtime.run_trace(org, task_id, principal=principal))

    @router.post(
        "/tasks/{task_id}/cancel",
        response_model=TaskBody,
        tags=["tasks"],
        responses={403: {"model": ApiError, "description": "not the run's caller nor an admin"}},
    )
    async def cancel_task(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        task_id: UUID,
        body: TaskCancel | None = None,
    ) -> TaskSummary:
        """Cancel a RUNNING run (the person it acts for, or an admin): it ends CANCELLED with
        the reason "cancelled by <principal>"; its driver stops at its next step. A run that
        already ended is returned as it is, at once: cancelling twice changes nothing."""
        run = await state.runtime.cancel_run(
            org, task_id, principal=principal, reason=None if body is None else body.reason
        )
        return from_run(run)

    # sessions ----------------------------------------------------------------------------

    @router.post("/sessions", response_model=SessionBody, status_code=201, tags=["sessions"])
    async def create_session(
        state: StateDep, org: OrgPath, principal: MemberDep, body: SessionCreate
    ) -> SessionBody:
        """Open a conversation between the caller and an INTERACTIVE agent."""
        session = await state.runtime.open_session(org, body.agent_id, principal)
        return from_session(session)

    @router.get(
        "/sessions/{session_id}",
        response_model=SessionBody,
        tags=["sessions"],
        responses={403: {"model": ApiError, "description": "another caller's session"}},
    )
    async def get_session(
        state: StateDep, org: OrgPath, principal: MemberDep, session_id: UUID
    ) -> SessionBody:
        """A session (its caller, or an admin)."""
        return from_session(await state.runtime.get_session(org, session_id, principal=principal))

    @router.get(
        "/sessions/{session_id}/messages",
        response_model=MessageList,
        tags=["sessions"],
        responses={403: {"model": ApiError, "description": "another caller's session"}},
    )
    async def list_messages(
        state: StateDep, org: OrgPath, principal: MemberDep, session_id: UUID
    ) -> MessageList:
        """The conversation so far (its caller, or an admin)."""
        turns = await state.runtime.conversation(org, session_id, principal=principal)
        return MessageList(session_id=session_id, messages=[TurnBody.of(t) for t in turns])

    @router.post(
        "/sessions/{session_id}/messages",
        response_class=EventSourceResponse,
        tags=["sessions"],
        responses={
            200: {
                "description": "Server-sent events, each as it happens: `started`; per tool "
                "round a `tool_call` and its `observation`; then `reply` (sent whole, after "
                "the invocation gate passed it) or `refused`; then `done` (or `error`)."
            },
            403: {"model": ApiError, "description": "another caller's session"},
            409: {
                "model": ApiError,
                "description": "the session has ended, or is busy (its queue of turns is full)",
            },
        },
    )
    async def post_message(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        started_turn: Annotated[_StartedTurn, Depends(_started_turn)],
    ) -> AsyncIterator[ServerSentEvent]:
        """Send a message; the turn's events come back as server-sent events, each with an
        id ``<turnId>:<seq>`` (``started`` is 0).

        The message is recorded (the turn accepted) before the stream starts; turns of one
        session run one at a time, in arrival order. The turn runs to its end even if the
        client disconnects: its messages are then in the history, and
        ``GET .../turns/{turnId}/events`` with ``Last-Event-ID`` replays what was missed."""
        turn, running, events = started_turn.turn, started_turn.running, started_turn.events
        started = TurnStarted(session_id=turn.session_id, turn_id=turn.id)
        yield _sse("started", started, event_id=_event_id(turn.id, 0))
        seq = 0
        async for event in events_until(running, events):
            seq += 1
            yield _turn_event(event, event_id=_event_id(turn.id, seq))
        end_id = _event_id(turn.id, seq + 1)
        try:
            result = running.result()
        except Exception as exc:
            yield _turn_error(exc, f"turn {turn.id} of session {turn.session_id}", event_id=end_id)
            return
        yield _turn_done(turn.session_id, result, event_id=end_id)

    @router.get(
        "/sessions/{session_id}/turns/{turn_id}",
        response_model=TurnStatusBody,
        tags=["sessions"],
        responses={403: {"model": ApiError, "description": "another caller's session"}},
    )
    async def get_turn(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        session_id: UUID,
        turn_id: UUID,
        wait: Annotated[
            float,
            Query(
                ge=0,
                le=MAX_WAIT_S,
                description="seconds to wait for a turn not ended yet to end before answering",
            ),
        ] = 0,
    ) -> TurnStatusBody:
        """An accepted turn (its session's caller, or an admin): ACCEPTED, RUNNING, DONE or
        FAILED, with its reply or refusal (or why it failed) once it has ended."""
        turn = await state.runtime.get_turn(
            org, session_id, turn_id, principal=principal, wait_s=wait
        )
        return TurnStatusBody.of(turn)

    @router.get(
        "/sessions/{session_id}/turns/{turn_id}/diagnostics",
        response_model=DiagnosticsBody,
        tags=["sessions"],
        responses={403: {"model": ApiError, "description": "another caller's session"}},
    )
    async def get_turn_diagnostics(
        state: StateDep, org: OrgPath, principal: MemberDep, session_id: UUID, turn_id: UUID
    ) -> DiagnosticsBody:
        """A turn's diagnostic timeline (its session's caller, or an admin)."""
        found = await state.runtime.turn_diagnostics(org, session_id, turn_id, principal=principal)
        return DiagnosticsBody.of(found)

    @router.get(
        "/sessions/{session_id}/turns/{turn_id}/trace",
        response_model=TurnTrace,
        tags=["sessions"],
        responses={403: {"model": ApiError, "description": "another caller's session"}},
    )
    async def get_turn_trace(
        state: StateDep, org: OrgPath, principal: MemberDep, session_id: UUID, turn_id: UUID
    ) -> TurnTrace:
        """The trace a turn belongs to (its session's caller, or an admin): the request it
        was accepted in, then ``invoke_agent`` → tool rounds → ``chat`` and tool spans,
        wherever the turn was driven (a session actor, a recovery)."""
        return TurnTrace.of(
            await state.runtime.turn_trace(org, session_id, turn_id, principal=principal)
        )

    @router.get(
        "/sessions/{session_id}/turns/{turn_id}/events",
        response_class=EventSourceResponse,
        tags=["sessions"],
        responses={
            200: {
                "description": "The turn's events after `Last-Event-ID` (or `after`; neither: "
                "from `started`), with the same ids as on the first stream, then `done` (or "
                "`error` for a turn that FAILED). A turn still running is waited for up to "
                "the server's `sessions.turn_replay_wait_s`; if it is still running then, the "
                "stream is one `pending` event (the turn's status): reconnect."
            },
            403: {"model": ApiError, "description": "another caller's session"},
            422: {"model": ApiError, "description": "a Last-Event-ID of another turn"},
        },
    )
    async def turn_events(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        turn: Annotated[TurnRecord, Depends(_readable_turn)],
        seen: Annotated[int, Depends(_last_seen)],
    ) -> AsyncIterator[ServerSentEvent]:
        """Reconnect to a turn: replay the events a client missed once the turn has ended."""
        if not turn.status.ended:
            turn = await state.runtime.get_turn(
                org,
                turn.session_id,
                turn.id,
                principal=principal,
                wait_s=state.runtime.settings.sessions.turn_replay_wait_s,
            )
        if not turn.status.ended:
            yield _sse("pending", TurnStatusBody.of(turn))
            return
        if seen < 0:
            started = TurnStarted(session_id=turn.session_id, turn_id=turn.id)
            yield _sse("started", started, event_id=_event_id(turn.id, 0))
        for stored in turn.events:
            if stored.seq > seen:
                yield _turn_event(stored.event, event_id=_event_id(turn.id, stored.seq))
        end_seq = turn.last_seq + 1
        if seen >= end_seq:
            return
        end_id = _event_id(turn.id, end_seq)
        if turn.status is TurnStatus.FAILED:
            failed = ConflictError(turn.reason or "the turn failed")
            yield _turn_error(failed, f"replay of turn {turn.id}", event_id=end_id)
            return
        yield _turn_done(turn.session_id, turn.result(), event_id=end_id)

    @router.post(
        "/sessions/{session_id}/end",
        response_model=SessionEnded,
        tags=["sessions"],
        responses={403: {"model": ApiError, "description": "another caller's session"}},
    )
    async def end_session(
        state: StateDep, org: OrgPath, principal: MemberDep, session_id: UUID
    ) -> SessionEnded:
        """End a session (its caller, or an admin); the extraction pass writes facts.
        Ending an ended session changes nothing: it answers at once with the session as it
        is (and no facts), without waking its actor."""
        session = await state.runtime.authorize_end_session(org, session_id, principal=principal)
        if session.status is SessionStatus.ENDED:
            return SessionEnded(session=from_session(session), facts=[])
        facts = await state.executor.end_session(org, session_id)
        session = await state.runtime.get_session(org, session_id, principal=principal)
        return SessionEnded(session=from_session(session), facts=[MemoryBody.of(f) for f in facts])

    # tools -------------------------------------------------------------------------------

    @router.get("/tools", response_model=ToolList, tags=["tools"])
    async def list_tools(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        agent_id: Annotated[str | None, Query(alias="agentId", pattern=r"^[^\x00]{1,200}$")] = None,
    ) -> ToolList:
        """Every tool of this server, or (with ``agentId``) what the caller may use with
        that agent: the agent's grant ∩ the caller's grant."""
        specs = await state.runtime.list_tools(org, agent_ref=agent_id, principal=principal)
        return ToolList(tools=[ToolBody.of(s) for s in specs])

    @router.post(
        "/tools/{tool_name}",
        response_model=ObservationBody,
        tags=["tools"],
    )
    async def call_tool(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        tool_name: ToolName,
        body: ToolCall,
        idempotency_key: Annotated[
            str | None,
            Header(
                alias="Idempotency-Key",
                min_length=1,
                max_length=200,
                pattern=r"^[\x20-\x7e]+$",
                description="repeat a call safely: a tool that writes returns the result "
                "of the first call with this key (per caller, agent and tool) and writes "
                "nothing",
            ),
        ] = None,
    ) -> ObservationBody:
        """Call a tool directly, as the caller, through the invocation gate (schema check,
        agent grant ∩ caller grant, hooks, limits, audit). The gate's verdict is the
        observation's ``status``: OK, REFUSED (with the reason), ERROR or TIMEOUT."""
        observation = await state.runtime.invoke_tool(
            org, body.agent_id, principal, tool_name, body.args, idempotency_key=idempotency_key
        )
        return from_observation(observation)

    # evaluation --------------------------------------------------------------------------
    # Suites, cases and runs are the core's evaluation types as they are (snake_case; the
    # JSON of a suite file), inside the API's camelCase envelopes: see serve/_schemas.py.

    @router.post("/evals/suites", response_model=EvalSuite, status_code=201, tags=["evals"])
    async def create_eval_suite(
        state: StateDep, org: OrgPath, principal: MemberDep, body: EvalSuiteCreate
    ) -> EvalSuite:
        """Save a suite's cases as its next version (1 for a new name) and return it with
        its version. The same cases as the latest version are that version: it is returned
        (also 201) and nothing new is written; compare ``version``."""
        return await state.runtime.save_eval_suite(org, body.to_suite(), principal=principal)

    @router.get("/evals/suites", response_model=EvalSuiteList, tags=["evals"])
    async def list_eval_suites(
        state: StateDep, org: OrgPath, principal: MemberDep
    ) -> EvalSuiteList:
        """The organisation's suites: each one's latest version, without its cases."""
        return EvalSuiteList(suites=await state.runtime.list_eval_suites(org, principal=principal))

    @router.get("/evals/suites/{name}", response_model=EvalSuite, tags=["evals"])
    async def get_eval_suite(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        name: SuiteName,
        version: Annotated[int | None, Query(ge=1, description="default: the latest")] = None,
    ) -> EvalSuite:
        """A suite's version with its cases (their cassettes and checks)."""
        return await state.runtime.get_eval_suite(org, name, version=version, principal=principal)

    @router.post(
        "/evals/suites/{name}/cases",
        response_model=EvalSuiteSummary,
        status_code=201,
        tags=["evals"],
        responses={
            404: {"model": ApiError, "description": "no such run in this organisation"},
            422: {
                "model": ApiError,
                "description": "invalid request, or a run that cannot be a case (still "
                "RUNNING, or a step without its recording)",
            },
        },
    )
    async def add_eval_case(
        state: StateDep, org: OrgPath, principal: MemberDep, name: SuiteName, body: EvalCaseCreate
    ) -> EvalSuiteSummary:
        """Turn an ended run into a regression case (its cassette: what each step's DECIDE
        saw, the model's outputs, the decisions and the results) and add it to the suite:
        its next version, with the latest version's cases and this one (replacing a case of
        the same name); a new suite starts at version 1."""
        case = await state.runtime.eval_case_from_run(
            org,
            body.run_id,
            name=body.case,
            description=body.description,
            checks=body.checks,
            principal=principal,
        )
        suite = await state.runtime.add_eval_case(org, name, case, principal=principal)
        return from_eval_suite(suite)

    @router.post(
        "/evals/runs",
        response_model=EvalRun,
        status_code=201,
        tags=["evals"],
        responses={
            422: {
                "model": ApiError,
                "description": "invalid request, an override that is not a DECIDE setting "
                "(or not valid), or live mode on a server without a model",
            }
        },
    )
    async def run_eval_suite(
        state: StateDep, org: OrgPath, principal: MemberDep, body: EvalRunCreate
    ) -> EvalRun:
        """Run a saved suite now and store the run with its per-case results and metrics.
        Each case replays under the DECIDE settings it was recorded with (K, the
        evaluation, ...); ``overrides`` changes them, which is how a planner setting is
        tried on recorded runs.

        Synchronous: the response is the finished run. A replay takes milliseconds per case
        (no model is called); a live run calls the server's model for every decision of
        every case, as long as the runs took, so keep live suites small or use the CLI."""
        return await state.runtime.run_eval_suite(
            org,
            body.suite,
            version=body.version,
            mode=body.mode,
            judge=body.judge,
            overrides=body.overrides,
            principal=principal,
        )

    @router.get("/evals/runs", response_model=EvalRunList, tags=["evals"])
    async def list_eval_runs(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        suite: Annotated[str | None, Query(pattern=r"^[^\x00]{1,200}$")] = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
    ) -> EvalRunList:
        """Suite runs, newest first, without their per-case results; only ``suite``'s when
        given."""
        runs = await state.runtime.list_eval_runs(
            org, suite=suite, limit=limit, principal=principal
        )
        return EvalRunList(runs=runs)

    @router.get("/evals/runs/{eval_run_id}", response_model=EvalRun, tags=["evals"])
    async def get_eval_run(
        state: StateDep, org: OrgPath, principal: MemberDep, eval_run_id: UUID
    ) -> EvalRun:
        """A suite run with its per-case results: each check's verdict, the replayed steps,
        where the replay left its recording (``divergence``) and the case's metrics."""
        return await state.runtime.get_eval_run(org, eval_run_id, principal=principal)

    @router.get("/evals/compare", response_model=RunComparison, tags=["evals"])
    async def compare_eval_runs(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        a: Annotated[UUID, Query(description="the earlier (baseline) suite run")],
        b: Annotated[UUID, Query(description="the suite run compared with it")],
    ) -> RunComparison:
        """Suite run ``b`` against ``a``, cases matched by name: those fixed (failed in
        ``a``, pass in ``b``) and broken (passed in ``a``, fail in ``b``), per-case changes,
        and each metric's delta (b − a)."""
        return await state.runtime.compare_eval_runs(org, a, b, principal=principal)

    return router
