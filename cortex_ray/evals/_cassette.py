"""Cassettes: a recorded run turned into one (``cassette_from_run``), and the player that
answers a replay's model calls from it, in order (``CassettePlayer``)."""

from __future__ import annotations

from cortex_ray._exceptions import CortexError
from cortex_ray._types import DecisionKind, ModelExchange, RunStatus, TaskRun
from cortex_ray.evals._types import Cassette, RecordedStep
from cortex_ray.models import ChatRequest, ChatResponse, ToolCall, Usage, request_digest

__all__ = ["CassettePlayer", "ReplayDivergence", "cassette_from_run"]


class ReplayDivergence(CortexError):
    """The decision asked its model for a call the recording does not have."""

    def __init__(self, recorded: str, replayed: str) -> None:
        super().__init__(f"the recording has {recorded}; the replay asked for {replayed}")
        self.recorded = recorded
        self.replayed = replayed


class CassettePlayer:
    """A ``ModelClient`` answering one step's model calls from their recording, in order."""

    def __init__(self, calls: tuple[ModelExchange, ...]) -> None:
        self._calls = calls
        self._next = 0
        self.prompt_changes = 0

    @property
    def name(self) -> str:
        return self._calls[0].model if self._calls and self._calls[0].model else "cassette"

    @property
    def supports_json_schema(self) -> bool:
        return self._calls[0].constrained if self._calls else True

    @property
    def used(self) -> tuple[ModelExchange, ...]:
        """The recorded calls given so far."""
        return self._calls[: self._next]

    async def chat(self, request: ChatRequest) -> ChatResponse:
        kind = request.schema_name if request.response_schema is not None else "text"
        if self._next >= len(self._calls):
            raise ReplayDivergence(
                f"{len(self._calls)} model call(s) in this step", f"one more ({kind})"
            )
        recorded = self._calls[self._next]
        if recorded.schema_name != kind:
            raise ReplayDivergence(
                f"call {self._next + 1} as {recorded.schema_name}", f"{kind} instead"
            )
        self._next += 1
        if request_digest(request) != recorded.request_sha256:
            self.prompt_changes += 1
        return ChatResponse(
            content=recorded.content,
            tool_calls=tuple(
                ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in recorded.tool_calls
            ),
            finish_reason=recorded.finish_reason,
            usage=Usage(
                prompt_tokens=recorded.prompt_tokens,
                completion_tokens=recorded.completion_tokens,
            ),
        )

    async def aclose(self) -> None:
        return None


def cassette_from_run(run: TaskRun) -> Cassette:
    """The cassette of a run read with its recordings (``Store.get_run(..., recordings=True)``).

    Raises ``ValueError`` for a run that cannot be one: still running, or with a step that
    has no recording (``record_decisions`` was off, or the step predates migration 0008)."""
    if not run.status.ended:
        raise ValueError(f"run {run.id} is still {run.status.value}: a case is a run that ended")
    if not run.steps:
        raise ValueError(f"run {run.id} has no steps")
    steps: list[RecordedStep] = []
    for step in run.steps:
        if step.recording is None:
            raise ValueError(
                f"run {run.id}, step {step.step_index + 1} has no recording (made with "
                "record_decisions off, or before recordings were kept)"
            )
        failed = step.decision is DecisionKind.FINISH and run.status is RunStatus.FAILED
        steps.append(
            RecordedStep(
                step_index=step.step_index,
                wm=step.recording.wm,
                model_calls=step.recording.model_calls,
                decision=step.decision,
                tool=step.action.tool if step.action is not None else None,
                args=step.action.args if step.action is not None else {},
                message=step.message,
                failed=failed,
                observation=step.observation,
                decide_ms=step.recording.decide_ms,
            )
        )
    models = [c.model for s in steps for c in s.model_calls if c.model]
    first = run.steps[0].recording
    return Cassette(
        settings=dict(first.settings) if first is not None else {},
        source_run=run.id,
        source_org=run.org_id,
        agent_name=steps[0].wm.agent_name,
        objective=run.objective(),
        max_steps=run.max_steps,
        status=run.status,
        result=run.result,
        model=models[0] if models else "",
        steps=tuple(steps),
    )
