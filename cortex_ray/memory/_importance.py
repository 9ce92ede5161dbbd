"""Importance ("poignancy") scoring of a memory (Park et al. 2023): at write time, or, for
the model, after the write (``ImportanceRescorer``) so that no write waits on a model."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

from cortex_ray._exceptions import ModelError
from cortex_ray._types import MemoryKind
from cortex_ray.models import BACKGROUND_PRIORITY, ChatMessage, ModelClient, structured_call
from cortex_ray.settings import STRUCTURED_RETRIES, MemoryOptions

__all__ = [
    "HeuristicImportanceScorer",
    "ImportanceRescorer",
    "ImportanceScorer",
    "ModelImportanceScorer",
    "importance_scorer_for",
]

log = logging.getLogger("cortex_ray.memory")

MIN_IMPORTANCE = 1.0
MAX_IMPORTANCE = 10.0


@runtime_checkable
class ImportanceScorer(Protocol):
    """Rates how important a memory is, from 1 (mundane) to 10 (poignant)."""

    async def score(self, kind: MemoryKind, content: str) -> float:
        """Return the importance of ``content`` as a memory of ``kind``, in [1, 10]."""
        ...


_FAILURE = re.compile(
    r"\b(fail\w*|error\w*|refus\w*|denied|timeout|timed out|exception|could not|cannot|"
    r"can't|unable)\b",
    re.IGNORECASE,
)
_OUTCOME = re.compile(r"\b(result|completed|finished|done|goal|outcome|succeeded)\b", re.IGNORECASE)


class HeuristicImportanceScorer:
    """Fixed, deterministic importance for when no model is configured.

    The score depends only on the kind and on a few words in the content:

    ========================================================  =====
    memory                                                    score
    ========================================================  =====
    PROCEDURAL (a change of persona, skills or tools)           8
    EPISODIC mentioning a failure or refusal ("failed",
    "error", "refused", "denied", "timed out", "could not")     7
    EPISODIC mentioning an outcome ("result", "completed",
    "finished", "goal", ...): a run's result                    6
    SEMANTIC (a fact)                                           5
    any other EPISODIC (an ordinary step or turn)               3
    ========================================================  =====

    Failures rank above results because what went wrong is what an agent most needs to
    recall next time. Writers that know better pass ``importance`` explicitly.
    """

    async def score(self, kind: MemoryKind, content: str) -> float:
        """Score by kind and content markers (see the class docstring)."""
        if kind is MemoryKind.PROCEDURAL:
            return 8.0
        if kind is MemoryKind.SEMANTIC:
            return 5.0
        if _FAILURE.search(content):
            return 7.0
        if _OUTCOME.search(content):
            return 6.0
        return 3.0


IMPORTANCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"importance": {"type": "integer", "minimum": 1, "maximum": 10}},
    "required": ["importance"],
    "additionalProperties": False,
}

# Generative Agents' poignancy prompt, with examples from an agent's working life
# added next to the original everyday ones.
_PROMPT = (
    "On the scale of 1 to 10, where 1 is purely mundane (e.g., brushing teeth, making bed, "
    "reading the clock, a greeting) and 10 is extremely poignant (e.g., a break up, college "
    "acceptance, a task that failed for good, a lasting wish of the person being helped), "
    "rate the likely poignancy of the following piece of memory.\n"
    "Memory ({kind}): {content}\n"
    'Answer with JSON: {{"importance": <integer 1 to 10>}}'
)


def _validate_importance(value: Any) -> float:
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    raw = value["importance"]
    # JSON has one number type; accept 7.0 but not 7.5, booleans or strings.
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw != int(raw):
        raise ValueError(f"importance must be an integer, got {raw!r}")
    if not MIN_IMPORTANCE <= raw <= MAX_IMPORTANCE:
        raise ValueError(f"importance must be between 1 and 10, got {raw!r}")
    return float(raw)


class ModelImportanceScorer:
    """Asks the model for the memory's poignancy, as Generative Agents does.

    One structured call per memory, constrained to ``{"importance": 1..10}``. When the
    model fails, is slower than ``timeout_s`` or still answers nonsense after ``retries``
    retries, the ``fallback`` scorer answers instead (and a warning is logged), so writing
    a memory never fails because of importance.

    With ``deferred`` (what ``importance_mode="background"`` builds), the memory service
    does not wait for the model at all: it writes the memory with the fallback's score and
    hands it to an :class:`ImportanceRescorer`, which asks the model afterwards and
    updates that row's importance.

    Args:
        model: The chat model to ask.
        retries: Retries of a malformed answer (``Settings.models.structured_retries``).
        fallback: The scorer used when the model cannot answer (and, when deferred, the
            score a memory is written with).
        timeout_s: The longest one scoring waits for the model (``None``: no bound of its
            own, only the model client's).
        deferred: Score after the write, in the background (see above).
    """

    def __init__(
        self,
        model: ModelClient,
        retries: int,
        fallback: ImportanceScorer,
        *,
        timeout_s: float | None = None,
        deferred: bool = False,
    ) -> None:
        self.model = model
        self.retries = retries
        self.fallback = fallback
        self.timeout_s = timeout_s
        self.deferred = deferred

    async def rate(self, kind: MemoryKind, content: str, *, priority: int = 0) -> float:
        """The model's rating of ``content``, in [1, 10]; ``priority`` as
        ``ChatRequest.priority`` (the background rescoring asks with BACKGROUND_PRIORITY).

        Raises:
            ModelError: The model failed or answered nonsense (``StructuredOutputError``).
            TimeoutError: It took longer than ``timeout_s``.
        """
        prompt = _PROMPT.format(kind=kind.value.lower(), content=content)
        messages = [ChatMessage(role="user", content=prompt)]
        async with asyncio.timeout(self.timeout_s):
            return await structured_call(
                self.model,
                messages,
                schema=IMPORTANCE_SCHEMA,
                validate=_validate_importance,
                schema_name="importance",
                retries=self.retries,
                max_tokens=16,
                temperature=0.0,
                priority=priority,
            )

    async def score(self, kind: MemoryKind, content: str) -> float:
        """Return the model's rating of ``content``, or the fallback's when it has none."""
        try:
            return await self.rate(kind, content)
        except ModelError as exc:  # StructuredOutputError included
            log.warning("importance: %s; using the heuristic score instead", exc)
        except TimeoutError:
            log.warning(
                "importance: no answer within %gs; using the heuristic score instead",
                self.timeout_s,
            )
        return await self.fallback.score(kind, content)


def importance_scorer_for(
    options: MemoryOptions,
    model: ModelClient | None,
    *,
    structured_retries: int = STRUCTURED_RETRIES,
) -> ImportanceScorer:
    """The scorer the memory options ask for: the model's, with the heuristic as its fallback
    (``structured_retries``: ``Settings.models.structured_retries``).

    Returns the heuristic alone when no model is configured or
    ``importance_scoring == "heuristic"``. The model's scorer waits at most
    ``importance_timeout_s`` and, with ``importance_mode == "background"``, is deferred:
    memories are written with the heuristic score and rescored after the write.
    """
    heuristic = HeuristicImportanceScorer()
    if model is None or options.importance_scoring == "heuristic":
        return heuristic
    return ModelImportanceScorer(
        model,
        structured_retries,
        heuristic,
        timeout_s=options.importance_timeout_s,
        deferred=options.importance_mode == "background",
    )


ApplyImportance = Callable[[str, UUID, float], Awaitable[bool]]
"""Sets one memory's importance: ``(org_id, memory_id, importance)``; False when the row is
not there (yet: its writer's transaction has not committed)."""


@dataclass(frozen=True, slots=True)
class _Job:
    org_id: str
    memory_id: UUID
    kind: MemoryKind
    content: str


class ImportanceRescorer:
    """Asks the model for the importance of memories already written, in the background.

    A memory is written at once with its fallback score; :meth:`submit` queues it, and one
    of ``concurrency`` workers asks ``scorer.rate`` (bounded by the scorer's ``timeout_s``)
    and ``apply``-s the answer to that row only. A full queue drops the job, and a failed or
    slow rating keeps the fallback score: rescoring can only improve a score, never lose a
    memory or hold up its writer. The row may not be visible yet when the answer comes (the
    writer commits after it inserted), so ``apply`` is retried after each of
    ``retry_delays_s`` before the job is given up.

    Workers start with the first job, on its event loop. :meth:`aclose` stops them: the
    jobs still queued are dropped (their memories keep the fallback score).

    Args:
        scorer: The model scorer (its ``rate`` raises when it cannot answer).
        apply: Writes one row's importance.
        concurrency: Ratings in flight at once.
        queue_size: Jobs waiting at most; beyond it, new ones are dropped.
        retry_delays_s: Waits before re-applying to a row not visible yet.
    """

    def __init__(
        self,
        scorer: ModelImportanceScorer,
        apply: ApplyImportance,
        *,
        concurrency: int,
        queue_size: int,
        retry_delays_s: Sequence[float] = (0.05, 0.25, 1.0, 4.0),
    ) -> None:
        if concurrency < 1 or queue_size < 1:
            raise ValueError("concurrency and queue_size must be at least 1")
        self.scorer = scorer
        self.apply = apply
        self.concurrency = concurrency
        self.queue_size = queue_size
        self.retry_delays_s = tuple(retry_delays_s)
        self.dropped = 0
        self._queue: asyncio.Queue[_Job] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._pending = 0

    @property
    def pending(self) -> int:
        """Jobs queued or being rated."""
        return self._pending

    def submit(self, org_id: str, memory_id: UUID, kind: MemoryKind, content: str) -> bool:
        """Queue a memory for rating; False (and the fallback score stays) when closed or
        full. Must be called on a running event loop."""
        if self._closed:
            return False
        queue = self._started()
        try:
            queue.put_nowait(_Job(org_id, memory_id, kind, content))
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning(
                "importance: the rescoring queue is full (%d); memory %s keeps its fallback score",
                self.queue_size,
                memory_id,
            )
            return False
        self._pending += 1
        return True

    async def drain(self) -> None:
        """Wait until every queued job has ended (rated, given up or dropped)."""
        if self._queue is not None and self._loop is asyncio.get_running_loop():
            await self._queue.join()

    async def aclose(self) -> None:
        """Stop the workers; queued jobs are dropped, their memories keep the fallback."""
        self._closed = True
        workers, self._workers = self._workers, []
        left = self.pending
        for worker in workers:
            worker.cancel()
        if workers and self._loop is asyncio.get_running_loop():
            await asyncio.gather(*workers, return_exceptions=True)
        if left:
            log.info("importance: %d rescoring job(s) dropped at close", left)
        self._queue = None
        self._pending = 0

    def _started(self) -> asyncio.Queue[_Job]:
        loop = asyncio.get_running_loop()
        if self._queue is None or self._loop is not loop:
            # First job, or a new event loop (the old one's workers went with it).
            self._loop = loop
            self._pending = 0
            self._queue = asyncio.Queue(self.queue_size)
            # The workers outlive the job that starts them: none of its context (a turn's
            # model deadline, its span) goes with them.
            self._workers = [
                loop.create_task(
                    self._work(self._queue),
                    name=f"importance-rescorer-{i}",
                    context=contextvars.Context(),
                )
                for i in range(self.concurrency)
            ]
        return self._queue

    async def _work(self, queue: asyncio.Queue[_Job]) -> None:
        while True:
            job = await queue.get()
            try:
                await self._rescore(job)
            except asyncio.CancelledError:
                raise
            except Exception:  # a worker outlives any one job
                log.warning("importance: rescoring memory %s failed", job.memory_id, exc_info=True)
            finally:
                self._pending -= 1
                queue.task_done()

    async def _rescore(self, job: _Job) -> None:
        try:
            # Behind what runs and people wait for, in a model server's line.
            rated = await self.scorer.rate(job.kind, job.content, priority=BACKGROUND_PRIORITY)
        except ModelError as exc:
            log.warning("importance: %s; memory %s keeps its fallback score", exc, job.memory_id)
            return
        except TimeoutError:
            log.warning(
                "importance: no answer within %gs; memory %s keeps its fallback score",
                self.scorer.timeout_s,
                job.memory_id,
            )
            return
        importance = min(MAX_IMPORTANCE, max(MIN_IMPORTANCE, float(rated)))
        for delay in (*self.retry_delays_s, None):
            if await self.apply(job.org_id, job.memory_id, importance):
                return
            if delay is None:
                break
            await asyncio.sleep(delay)
        log.debug(
            "importance: memory %s is not there (rolled back?); rescoring dropped", job.memory_id
        )
