"""Importance ("poignancy") scoring of a memory at write time (Park et al. 2023)."""

from __future__ import annotations

import logging
import re
from typing import Any, Protocol, runtime_checkable

from cortex_ray._exceptions import ModelError
from cortex_ray._types import MemoryKind
from cortex_ray.models import ChatMessage, ModelClient, structured_call

__all__ = ["HeuristicImportanceScorer", "ImportanceScorer", "ModelImportanceScorer"]

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
    model fails or still answers nonsense after ``retries`` retries, the ``fallback``
    scorer answers instead (and a warning is logged), so writing a memory never fails
    because of importance.

    Args:
        model: The chat model to ask.
        retries: Retries of a malformed answer (``Settings.structured_retries``).
        fallback: The scorer used when the model cannot answer.
    """

    def __init__(self, model: ModelClient, retries: int, fallback: ImportanceScorer) -> None:
        self.model = model
        self.retries = retries
        self.fallback = fallback

    async def score(self, kind: MemoryKind, content: str) -> float:
        """Return the model's rating of ``content``, or the fallback's when it has none."""
        prompt = _PROMPT.format(kind=kind.value.lower(), content=content)
        messages = [ChatMessage(role="user", content=prompt)]
        try:
            return await structured_call(
                self.model,
                messages,
                schema=IMPORTANCE_SCHEMA,
                validate=_validate_importance,
                schema_name="importance",
                retries=self.retries,
                max_tokens=16,
                temperature=0.0,
            )
        except ModelError as exc:  # StructuredOutputError included
            log.warning("importance: %s; using the heuristic score instead", exc)
            return await self.fallback.score(kind, content)
