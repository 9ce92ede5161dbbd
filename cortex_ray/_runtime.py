"""The runtime: one PERCEIVE → DECIDE → ACT → LEARN cycle for both kinds of agent.

``Runtime.run_autonomous`` loops the cycle against a goal and a step budget;
``Runtime.run_turn`` runs it for one message of a conversation. Both use the same assembler
(PERCEIVE), the same invocation gate (ACT) and the same memory service (LEARN); only the
driver (DECIDE) differs.

Each autonomous step is ONE transaction holding its ledger row (keyed by run id and step
index, so it can never be written twice), its audit row and its episodic memory. A run can
therefore be resumed from its ledger: ``drive_run`` continues after the last recorded step.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar
from uuid import UUID

from opentelemetry import trace
from pydantic import ValidationError

from cortex_ray._exceptions import (
    AccessDeniedError,
    ConfigurationError,
    ConflictError,
    InvalidRequestError,
)
from cortex_ray._settings import Settings, load_settings
from cortex_ray._types import (
    Agent,
    AgentAction,
    AgentMode,
    Decision,
    DecisionKind,
    Grant,
    MemoryKind,
    MemoryRecord,
    Observation,
    ObservationStatus,
    Principal,
    RunStatus,
    Session,
    SessionStatus,
    Step,
    TaskRun,
    Turn,
    TurnEvent,
    TurnEventKind,
    TurnResult,
    utcnow,
)
from cortex_ray.access import AccessControlService
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
from cortex_ray.decide import AutonomousDriver, InteractiveDriver
from cortex_ray.knowledge import VECTOR_DIM as KNOWLEDGE_DIM
from cortex_ray.knowledge import KnowledgeService, knowledge_search_tool
from cortex_ray.memory import ImportanceScorer, MemoryService, importance_scorer_for
from cortex_ray.models import Embedder, HashEmbedder, ModelClient, Reranker
from cortex_ray.perceive import PromptComposer, WorkingMemoryAssembler
from cortex_ray.storage import Database, Store

__all__ = [
    "Runtime",
    "StepCallback",
    "TurnEventRelay",
    "TurnEventSink",
    "build_embedder",
    "build_model",
    "events_until",
]

log = logging.getLogger("cortex_ray.cycle")
tracer = trace.get_tracer("cortex_ray")

E = TypeVar("E")

MAX_CONTACT_CONTEXT_BYTES = 8192
"""The largest contact context a run takes, as UTF-8 JSON."""

StepCallback = Callable[[Step], Awaitable[None] | None]
TurnEventSink = Callable[[TurnEvent], Awaitable[None] | None]
"""Receives a turn's events as they happen. A sink that raises is dropped for the rest of
the turn (logged); the turn itself always runs to its end and is recorded."""


_SERVED = (
    "%s=served reaches the deployments of the Serve app %r through Ray handles, which only "
    "the Ray layers open (actors.open_runtime, the API on Serve, serve.models."
    "open_served_runtime); in a plain process use local or openai"
)


def build_model(settings: Settings) -> ModelClient | None:
    """The chat model the settings name (``None`` for ``model_backend=none``)."""
    if settings.model_backend == "none":
        return None
    if settings.model_backend == "served":
        raise ConfigurationError(_SERVED % ("model_backend", settings.models_app))
    if settings.model_backend == "openai":
        from cortex_ray.models.openai_compatible import OpenAICompatibleClient

        assert settings.model_url is not None
        return OpenAICompatibleClient(
            settings.model_url,
            settings.model_name,
            api_key=settings.model_api_key,
            timeout_s=settings.model_timeout_s,
            default_temperature=settings.model_temperature,
            default_max_tokens=settings.model_max_tokens,
        )
    from cortex_ray.models.llama_cpp import LlamaCppClient

    return LlamaCppClient(
        settings.local_model_path,
        n_ctx=settings.local_model_context,
        n_threads=settings.local_model_threads,
        default_temperature=settings.model_temperature,
        default_max_tokens=settings.model_max_tokens,
    )


def build_embedder(settings: Settings) -> Embedder:
    """The embedder the settings name: the packaged MiniLM in-process (``local``), an
    OpenAI-compatible ``/v1/embeddings`` server (``openai``), or the test ``hash``."""
    if settings.embedding_backend == "hash":
        return HashEmbedder(settings.embedding_dim)
    if settings.embedding_backend == "served":
        raise ConfigurationError(_SERVED % ("embedding_backend", settings.models_app))
    if settings.embedding_backend == "openai":
        from cortex_ray.models.openai_embeddings import OpenAICompatibleEmbedder

        return OpenAICompatibleEmbedder.from_settings(settings)
    from cortex_ray.models.embeddings import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(settings.embedding_model, device=settings.embedding_device)


def _step_memory_text(step_index: int, decision: Decision, observation: Observation) -> str:
    action = decision.action
    assert action is not None
    args = ", ".join(f"{k}={v!r}" for k, v in action.args.items())
    return (
        f"Step {step_index + 1}: {action.tool}({args}) [{observation.action_type.value}] → "
        f"{observation.status.value}: {observation.summary[:1000]}"
    )


class Runtime:
    """Everything the decision cycle needs, wired once. Open with :meth:`open`."""

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
    ) -> None:
        self.settings = settings
        self.db = db
        self.store = Store(db)
        self.memory = memory
        self.model = model
        self.knowledge = knowledge
        self.access = AccessControlService()
        # knowledge_search is registered, not built in: an agent gets it by naming it.
        searching = [knowledge_search_tool(knowledge)] if knowledge is not None else []
        self.registry = ToolRegistry([*builtin_tools(), *searching, *tools], classifier)
        self.dispatcher = ToolDispatcher(
            self.registry, self.access, self.store, settings, memory=memory, hooks=hooks
        )
        self.composer = PromptComposer(show_action_space=settings.show_action_space)
        self.assembler = WorkingMemoryAssembler(memory, self.dispatcher, recall_k=settings.recall_k)
        self.autonomous = AutonomousDriver(model, self.composer, settings)
        self.interactive = InteractiveDriver(model, self.composer, settings)
        self._owns_model = False
        self._owns_db = False

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
    ) -> Runtime:
        """Start or reach the database, load the models the settings name, and wire the cycle.

        ``model="settings"`` builds the model from settings; pass a client (or ``None``) to
        override. Likewise ``embedder`` and ``importance``. ``reranker`` (a cross-encoder,
        e.g. the served one) reranks knowledge search; without one that stage is skipped
        and each result says so.
        """
        if settings is None:
            settings = load_settings()
        if isinstance(model, str) and model != "settings":
            raise ConfigurationError(f"model must be a ModelClient or None, not {model!r}")
        # The database first: it is the cheapest to fail, and everything opened after it
        # is closed again if a later step fails.
        database = db or await Database.open(settings)
        chat_model: ModelClient | None = None
        try:
            chat_model = build_model(settings) if isinstance(model, str) else model
            emb = embedder or build_embedder(settings)
            if importance is None:
                importance = importance_scorer_for(settings, chat_model)
            memory = MemoryService(database, emb, settings, importance)
            knowledge: KnowledgeService | None = None
            if emb.dim == KNOWLEDGE_DIM:
                knowledge = KnowledgeService(
                    database, emb, config=settings.knowledge, reranker=reranker
                )
            else:
                log.warning(
                    "knowledge search is off: the store holds %d-d vectors, the embedder "
                    "makes %d-d ones",
                    KNOWLEDGE_DIM,
                    emb.dim,
                )
            runtime = cls(
                settings=settings,
                db=database,
                memory=memory,
                model=chat_model,
                tools=tools,
                hooks=hooks,
                knowledge=knowledge,
            )
            # Close only what this call opened; a caller's model or database is theirs.
            runtime._owns_model = isinstance(model, str)
            runtime._owns_db = db is None
            return runtime
        except BaseException:
            if chat_model is not None and model == "settings":
                await chat_model.aclose()
            if db is None:
                await database.close()
            raise

    async def close(self, *, close_db: bool = True) -> None:
        """Close the model and the database if this runtime opened them."""
        if self.model is not None and self._owns_model:
            await self.model.aclose()
        if close_db and self._owns_db:
            await self.db.close()

    # agents -------------------------------------------------------------------------------

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
    ) -> Agent:
        """Create an agent. By default it has every built-in tool and a grant for them."""
        tool_names = tuple(tools) if tools is not None else BUILTIN_TOOL_NAMES
        unknown = [t for t in tool_names if self.registry.get(t) is None]
        if unknown:
            raise InvalidRequestError(f"unknown tools: {', '.join(unknown)}")
        try:
            agent = Agent(
                org_id=org_id,
                name=name.strip(),
                persona=persona,
                mode=mode,
                tools=tool_names,
                skills=tuple(skills),
                grant=grant if grant is not None else Grant(tools=frozenset(tool_names)),
            )
        except ValidationError as exc:
            raise InvalidRequestError(f"invalid agent: {_first_error(exc)}") from exc
        return await self.store.create_agent(agent)

    # autonomous ---------------------------------------------------------------------------

    async def start_run(
        self,
        org_id: str,
        agent_ref: UUID | str,
        goal: str,
        *,
        max_steps: int | None = None,
        name: str = "",
        caller_id: str | None = None,
        requested_by: str | None = None,
        contact_context: dict[str, Any] | None = None,
    ) -> TaskRun:
        """Validate and record a new RUNNING task run (nothing is executed yet).

        ``caller_id`` is the person the run acts for, ``requested_by`` the principal that
        asked for it; ``contact_context`` (a JSON object, at most 8 KiB) is shown to the
        agent with the goal."""
        _, run = await self._start(
            org_id,
            agent_ref,
            goal,
            max_steps,
            name,
            caller_id,
            requested_by=requested_by,
            contact_context=contact_context,
        )
        return run

    async def _start(
        self,
        org_id: str,
        agent_ref: UUID | str,
        goal: str,
        max_steps: int | None,
        name: str,
        caller_id: str | None,
        *,
        requested_by: str | None = None,
        contact_context: dict[str, Any] | None = None,
    ) -> tuple[Agent, TaskRun]:
        if not goal or not goal.strip():
            raise InvalidRequestError("the goal is empty")
        if contact_context is not None:
            size = len(json.dumps(contact_context, ensure_ascii=False, sort_keys=True).encode())
            if size > MAX_CONTACT_CONTEXT_BYTES:
                raise InvalidRequestError(
                    f"contact context: at most {MAX_CONTACT_CONTEXT_BYTES} bytes as JSON, "
                    f"got {size}"
                )
        steps = self.settings.default_max_steps if max_steps is None else max_steps
        if isinstance(steps, bool) or not isinstance(steps, int):
            raise InvalidRequestError("max_steps must be an integer")
        if not 1 <= steps <= self.settings.max_steps_limit:
            raise InvalidRequestError(
                f"max_steps must be between 1 and {self.settings.max_steps_limit}, got {steps}"
            )
        agent = await self.store.get_agent(org_id, agent_ref)
        if agent.mode is not AgentMode.AUTONOMOUS:
            # An interactive agent acts for a person (agent grant ∩ caller grant); running
            # it alone would act with the agent's grant only.
            raise InvalidRequestError(
                f"agent {agent.name!r} is {agent.mode.value}; "
                "set its mode to AUTONOMOUS to run tasks"
            )
        run = TaskRun(
            org_id=org_id,
            agent_id=agent.id,
            name=name,
            goal=goal.strip(),
            max_steps=steps,
            caller_id=caller_id,
            requested_by=requested_by,
            contact_context=contact_context or None,
        )
        return agent, await self.store.create_run(run)

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
    ) -> TaskRun:
        """Run an agent autonomously against ``goal`` until it finishes or the budget ends."""
        agent, run = await self._start(org_id, agent_ref, goal, max_steps, name, caller_id)
        return await self._drive(agent, run, on_step)

    async def fail_run(self, org_id: str, run_id: UUID, reason: str) -> TaskRun:
        """Give up on a RUNNING run: it becomes FAILED with ``reason`` (a supervisor that
        cannot drive it any more). A run already terminal is returned unchanged."""
        if not reason.strip():
            raise InvalidRequestError("a failed run needs a reason")
        await self.store.fail_run(org_id, run_id, reason)
        return await self.store.get_run(org_id, run_id)

    async def drive_run(
        self, org_id: str, run_id: UUID, *, on_step: StepCallback | None = None
    ) -> TaskRun:
        """Drive a RUNNING run to a terminal state, continuing after its last recorded step."""
        run = await self.store.get_run(org_id, run_id)
        if run.status is not RunStatus.RUNNING:
            return run
        agent = await self.store.get_agent(org_id, run.agent_id)
        observations = [s.observation for s in run.steps if s.observation is not None]
        step_index = len(run.steps)
        # A side-effecting step whose process died after it began acting is decided again,
        # not re-executed, and the model is told its effect is unknown. The intent is
        # consumed in the same transaction as the audit row that keeps the evidence; a
        # retried call carries the same idempotency key.
        async with self.db.transaction() as conn:
            interrupted = await self.store.take_intent(conn, org_id, run.id, step_index)
            if interrupted is not None:
                note = self._interrupted(run, step_index, interrupted)
                ctx = InvocationContext(
                    agent=agent,
                    caller=None,
                    mode=AgentMode.AUTONOMOUS,
                    run_id=run.id,
                    step_index=step_index,
                )
                audit = self.dispatcher.audit_entry(
                    ctx, interrupted, status="INTERRUPTED", reason=note.summary
                )
                await self.store.insert_audit(conn, audit)
                observations.append(note)
        return await self._drive(agent, run, on_step, observations)

    @staticmethod
    def _interrupted(run: TaskRun, step_index: int, action: AgentAction) -> Observation:
        summary = (
            f"interrupted: the process stopped while {action.tool} was running; it may or may "
            f"not have taken effect (idempotency key {run.id}:{step_index})"
        )
        log.warning("run %s step %d: %s", run.id, step_index, summary)
        return Observation(
            tool=action.tool,
            action_type=action.action_type,
            status=ObservationStatus.ERROR,
            summary=summary,
            step_index=step_index,
        )

    async def _drive(
        self,
        agent: Agent,
        run: TaskRun,
        on_step: StepCallback | None,
        observations: list[Observation] | None = None,
    ) -> TaskRun:
        steps = list(run.steps)
        if observations is None:
            observations = [s.observation for s in steps if s.observation is not None]
        with tracer.start_as_current_span(
            "cortex.run", attributes={"cortex.run_id": str(run.id), "cortex.org": run.org_id}
        ):
            for step_index in range(len(steps), run.max_steps):
                step, final = await self._autonomous_step(
                    agent, run, step_index, observations, on_step
                )
                steps.append(step)
                if final is not None:
                    return final.model_copy(update={"steps": tuple(steps)})
            final = await self._finish(
                agent,
                run,
                RunStatus.FAILED,
                reason=f"step budget of {run.max_steps} exhausted before the goal was met",
            )
        return final.model_copy(update={"steps": tuple(steps)})

    async def _autonomous_step(
        self,
        agent: Agent,
        run: TaskRun,
        step_index: int,
        observations: list[Observation],
        on_step: StepCallback | None,
    ) -> tuple[Step, TaskRun | None]:
        """One cycle: its ledger row, and the finished run when it reached a terminal state."""
        with tracer.start_as_current_span("cortex.step", attributes={"cortex.step": step_index}):
            wm = await self.assembler.assemble(  # PERCEIVE
                agent=agent,
                mode=AgentMode.AUTONOMOUS,
                objective=run.objective(),
                observations=observations,
                step_index=step_index,
                max_steps=run.max_steps,
            )
            decision = await self.autonomous.decide(wm)  # DECIDE
            if decision.kind is DecisionKind.FINISH:
                step = Step(
                    run_id=run.id,
                    step_index=step_index,
                    decision=DecisionKind.FINISH,
                    candidates=decision.candidates,
                    selected=decision.selected,
                    message=decision.message or decision.reason,
                )
                status = RunStatus.FAILED if decision.failed else RunStatus.COMPLETED
                final = await self._finish(
                    agent,
                    run,
                    status,
                    result=None if decision.failed else decision.message,
                    reason=decision.reason,
                    step=step,
                )
                await _notify(on_step, step)
                return step, final

            assert decision.action is not None
            ctx = InvocationContext(
                agent=agent,
                caller=None,
                mode=AgentMode.AUTONOMOUS,
                run_id=run.id,
                step_index=step_index,
            )
            tool = self.registry.get(decision.action.tool)
            side_effects = tool is not None and not tool.idempotent
            if side_effects:
                # Durable before acting: if the process dies now, resume knows this step
                # began and decides it again instead of blindly repeating it.
                await self.store.insert_intent(run.org_id, run.id, step_index, decision.action)
            dispatch = await self.dispatcher.execute(
                ctx, decision.action.tool, decision.action.args
            )  # ACT
            observation = dispatch.observation  # OBSERVE
            observations.append(observation)
            step = Step(
                run_id=run.id,
                step_index=step_index,
                decision=DecisionKind.ACT,
                candidates=decision.candidates,
                selected=decision.selected,
                action=decision.action,
                action_type=observation.action_type,
                observation=observation,
            )
            with tracer.start_as_current_span("cortex.learn"):  # LEARN
                prepared = await self.memory.prepare(
                    org_id=run.org_id,
                    agent_id=agent.id,
                    kind=MemoryKind.EPISODIC,
                    content=_step_memory_text(step_index, decision, observation),
                    run_id=run.id,
                    step_index=step_index,
                    metadata={"tool": observation.tool, "status": observation.status.value},
                )
                async with self.db.transaction() as conn:
                    await self.store.insert_step(conn, run.org_id, step)
                    await self.store.insert_audit(conn, dispatch.audit)
                    await self.memory.write_prepared(conn, [prepared])
                    if side_effects:
                        await self.store.clear_intent(conn, run.org_id, run.id, step_index)
            await _notify(on_step, step)
            if dispatch.refused_as_invalid:
                # Never executed; end the run safely rather than loop on a broken plan.
                final = await self._finish(
                    agent,
                    run,
                    RunStatus.FAILED,
                    reason=f"step {step_index + 1}: {observation.summary}",
                )
                return step, final
            return step, None

    async def _finish(
        self,
        agent: Agent,
        run: TaskRun,
        status: RunStatus,
        *,
        result: str | None = None,
        reason: str | None = None,
        step: Step | None = None,
    ) -> TaskRun:
        """Record the terminal state and the run's EPISODIC result in one transaction."""
        outcome = result if status is RunStatus.COMPLETED else reason
        prepared = await self.memory.prepare(
            org_id=run.org_id,
            agent_id=agent.id,
            kind=MemoryKind.EPISODIC,
            content=f"Run '{run.goal[:200]}' {status.value.lower()}: {outcome or ''}".strip(),
            run_id=run.id,
            step_index=None,
            metadata={"run_status": status.value, "result": True},
        )
        async with self.db.transaction() as conn:
            if step is not None:
                await self.store.insert_step(conn, run.org_id, step)
            finished_at = await self.store.finish_run(
                conn, run.org_id, run.id, status, result=result, reason=reason
            )
            await self.memory.write_prepared(conn, [prepared])
        log.info("run %s %s: %s", run.id, status.value, outcome)
        return run.model_copy(
            update={
                "status": status,
                "result": result,
                "reason": reason,
                "finished_at": finished_at,
            }
        )

    # interactive --------------------------------------------------------------------------

    async def open_session(self, org_id: str, agent_ref: UUID | str, caller: Principal) -> Session:
        agent = await self.store.get_agent(org_id, agent_ref)
        if agent.mode is not AgentMode.INTERACTIVE:
            raise InvalidRequestError(
                f"agent {agent.name!r} is {agent.mode.value}; set its mode to INTERACTIVE "
                "to talk with it"
            )
        if caller.org_id != org_id:
            raise InvalidRequestError("the caller belongs to another organisation")
        await self.store.put_principal(caller)
        return await self.store.create_session(
            Session(org_id=org_id, agent_id=agent.id, caller_id=caller.id)
        )

    async def run_turn(
        self,
        session: Session,
        caller: Principal,
        message: str,
        *,
        on_event: TurnEventSink | None = None,
    ) -> TurnResult:
        """One interactive turn: tool rounds through the gate, then a reply (a dialogue action).

        ``on_event`` hears each tool call, its observation, and the reply or refusal as they
        happen (the HTTP API streams them as server-sent events)."""
        if not message.strip():
            raise InvalidRequestError("the message is empty")
        session = await self.store.get_session(session.org_id, session.id)
        if caller.id != session.caller_id or caller.org_id != session.org_id:
            raise AccessDeniedError("only the session's own caller may talk in it")
        if session.status is not SessionStatus.OPEN:
            raise ConflictError(f"session {session.id} has ended")
        emit = TurnEventRelay(on_event, f"session {session.id}")
        agent = await self.store.get_agent(session.org_id, session.agent_id)
        history = await self.store.conversation(
            session.org_id, session.id, limit=self.settings.conversation_window
        )
        user_turn = Turn(role="user", content=message)
        ctx = InvocationContext(
            agent=agent, caller=caller, mode=AgentMode.INTERACTIVE, session_id=session.id
        )
        observations: list[Observation] = []
        new_turns: list[Turn] = [user_turn]
        audits = []
        reply: str | None = None
        refused: str | None = None
        with tracer.start_as_current_span(
            "cortex.turn", attributes={"cortex.session": str(session.id)}
        ):
            for round_index in range(self.settings.max_tool_rounds + 1):
                wm = await self.assembler.assemble(  # PERCEIVE
                    agent=agent,
                    mode=AgentMode.INTERACTIVE,
                    objective=message,
                    caller=caller,
                    observations=observations,
                    conversation=[*history, user_turn],
                )
                # The last round may only reply: the bound on tool rounds.
                last = round_index == self.settings.max_tool_rounds
                decision = await self.interactive.decide(wm, allow_tools=not last)  # DECIDE
                if decision.kind is DecisionKind.ACT and decision.action is not None:
                    action = decision.action
                    await emit(
                        TurnEvent(
                            kind=TurnEventKind.TOOL_CALL,
                            round=round_index,
                            tool=action.tool,
                            args=action.args,
                        )
                    )
                    dispatch = await self.dispatcher.execute(ctx, action.tool, action.args)  # ACT
                    await emit(
                        TurnEvent(
                            kind=TurnEventKind.OBSERVATION,
                            round=round_index,
                            tool=action.tool,
                            observation=dispatch.observation,
                        )
                    )
                    observations.append(dispatch.observation)
                    audits.append(dispatch.audit)
                    new_turns.append(
                        Turn(
                            role="tool",
                            content=dispatch.observation.summary,
                            tool=action.tool,
                        )
                    )
                    continue
                if decision.failed or not decision.message:
                    refused = decision.reason
                    break
                dispatch = await self.dispatcher.execute(
                    ctx, "reply", {"message": decision.message}
                )
                audits.append(dispatch.audit)
                if dispatch.observation.status is ObservationStatus.OK:
                    reply = decision.message
                    new_turns.append(Turn(role="assistant", content=reply))
                else:
                    refused = dispatch.observation.summary
                break
            if reply is not None:
                await emit(TurnEvent(kind=TurnEventKind.REPLY, round=round_index, text=reply))
            else:
                await emit(
                    TurnEvent(
                        kind=TurnEventKind.REFUSED, round=round_index, text=refused or "no reply"
                    )
                )
        # LEARN: one EPISODIC record per turn, in the same transaction as the messages.
        tools_used = ", ".join(f"{o.tool}:{o.status.value}" for o in observations) or "none"
        prepared = await self.memory.prepare(
            org_id=session.org_id,
            agent_id=agent.id,
            kind=MemoryKind.EPISODIC,
            content=f"{caller.name or caller.id} said: {message[:1000]}\nI replied: "
            f"{(reply or refused or '')[:1000]}\nTools: {tools_used}",
            session_id=session.id,
            metadata={"turn": True, "caller": caller.id},
        )
        async with self.db.transaction() as conn:
            await self.store.append_messages(conn, session.org_id, session.id, new_turns)
            for audit in audits:
                await self.store.insert_audit(conn, audit)
            await self.memory.write_prepared(conn, [prepared])
        return TurnResult(
            session_id=session.id, reply=reply, observations=tuple(observations), refused=refused
        )

    async def end_session(self, session: Session) -> list[MemoryRecord]:
        """End a session; the extraction pass writes the semantic facts it finds."""
        session = await self.store.get_session(session.org_id, session.id)
        if session.status is SessionStatus.ENDED:
            return []
        conversation = await self.store.conversation(session.org_id, session.id)
        facts = await self.memory.extract_facts(
            org_id=session.org_id,
            agent_id=session.agent_id,
            session_id=session.id,
            conversation=conversation,
            model=self.model,
        )
        async with self.db.transaction() as conn:
            await self.store.end_session(conn, session.org_id, session.id, utcnow())
        return facts

    # direct tool calls --------------------------------------------------------------------

    async def invoke_tool(
        self,
        org_id: str,
        agent_ref: UUID | str,
        caller: Principal,
        tool: str,
        args: dict[str, Any],
    ) -> Observation:
        """A direct call (not chosen by a model), through the same gate, as ``caller``."""
        agent = await self.store.get_agent(org_id, agent_ref)
        if caller.org_id != org_id:
            raise InvalidRequestError("the caller belongs to another organisation")
        ctx = InvocationContext(agent=agent, caller=caller, mode=AgentMode.INTERACTIVE)
        return await self.dispatcher.invoke(ctx, tool, args)


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ())) or "value"
    return f"{where}: {error.get('msg', 'invalid')}"


async def _notify(callback: StepCallback | None, step: Step) -> None:
    if callback is None:
        return
    result = callback(step)
    if result is not None:
        await result


async def events_until(running: asyncio.Future[Any], events: asyncio.Queue[E]) -> AsyncIterator[E]:
    """Yield what is put on ``events`` as it arrives, until ``running`` ends, then what is
    left: how a turn's events cross from the task running it to a stream (the actor's
    generator, the API's server-sent events). ``running`` is never cancelled here."""
    while not running.done():
        waiting = asyncio.ensure_future(events.get())
        try:
            await asyncio.wait({waiting, running}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waiting.done():
                waiting.cancel()
        if waiting.done() and not waiting.cancelled():
            yield waiting.result()
    while not events.empty():
        yield events.get_nowait()


class TurnEventRelay:
    """Delivers turn events to a sink until the sink fails once (then drops them, logged):
    a caller that stopped listening never stops the turn."""

    def __init__(self, sink: TurnEventSink | None, label: str) -> None:
        self._sink = sink
        self._label = label

    async def __call__(self, event: TurnEvent) -> None:
        if self._sink is None:
            return
        try:
            result = self._sink(event)
            if result is not None:
                await result
        except Exception:
            log.warning(
                "%s: the turn-event sink failed; the turn goes on without it",
                self._label,
                exc_info=True,
            )
            self._sink = None
