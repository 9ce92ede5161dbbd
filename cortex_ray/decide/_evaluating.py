"""EVALUATE: a second structured call over the candidates that can be selected.

``evaluation="choice"`` (the default): a few words on each candidate, then the number of
the best one; ``"scores"``: a 0-10 score each. Skipped by the driver when one candidate is
selectable (it would not change the choice); when it fails, the planner's order is kept.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from cortex_ray._exceptions import ModelError
from cortex_ray._types import Candidate, WorkingMemory
from cortex_ray.models import ModelClient, structured_call
from cortex_ray.observability import tracer
from cortex_ray.perceive import PromptComposer

__all__ = [
    "ASSESSMENT_CHARS",
    "Evaluator",
    "choice_schema",
    "parse_choice",
    "parse_scores",
    "score_schema",
]

log = logging.getLogger("cortex_ray.decide")

# One assessment per candidate in choice mode: a few words, bounded like a rationale.
ASSESSMENT_CHARS = 120


def choice_schema(listed: list[Candidate]) -> dict[str, Any]:
    """A few words on each listed candidate (in order), then the number of the best one.
    The assessments come first so that the choice is made after them."""
    n = len(listed)
    return {
        "type": "object",
        "properties": {
            "assessments": {
                "type": "array",
                "items": {"type": "string", "maxLength": ASSESSMENT_CHARS},
                "minItems": n,
                "maxItems": n,
            },
            "best": {"enum": [c.index for c in listed]},
        },
        "required": ["assessments", "best"],
        "additionalProperties": False,
    }


def parse_choice(raw: Any, listed: list[Candidate]) -> tuple[int, dict[int, str]]:
    """The chosen candidate's index and each listed candidate's assessment."""
    if not isinstance(raw, dict):
        raise ValueError('expected {"assessments": [...], "best": N}')
    best = raw.get("best")
    indices = [c.index for c in listed]
    if isinstance(best, bool) or best not in indices:
        raise ValueError(f"best must be one of {indices}, got {best!r}")
    said = raw.get("assessments")
    words = [str(a)[:ASSESSMENT_CHARS] for a in said] if isinstance(said, list) else []
    return int(best), dict(zip(indices, words, strict=False))


def score_schema(n: int) -> dict[str, Any]:
    """One 0-10 score per listed candidate, in the order listed (positional, so that even a
    grammar-constrained small model cannot score one candidate twice and skip another)."""
    return {
        "type": "object",
        "properties": {
            "scores": {
                "type": "array",
                "items": {"type": "number", "minimum": 0, "maximum": 10},
                "minItems": n,
                "maxItems": n,
            }
        },
        "required": ["scores"],
        "additionalProperties": False,
    }


def parse_scores(raw: Any, listed: list[Candidate]) -> dict[int, float]:
    """Candidate index → score, from scores given in the order ``listed``."""
    if not isinstance(raw, dict) or not isinstance(raw.get("scores"), list):
        raise ValueError('expected {"scores": [...]}')
    values = raw["scores"]
    if len(values) != len(listed):
        raise ValueError(f"expected {len(listed)} scores, one per candidate, got {len(values)}")
    scores: dict[int, float] = {}
    for candidate, value in zip(listed, values, strict=True):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"score for candidate {candidate.index} is not a number")
        scores[candidate.index] = max(0.0, min(10.0, float(value)))
    return scores


class Evaluator:
    """Asks the model to judge the selectable candidates (the span ``evaluate``).

    Args:
        composer: Renders the evaluation prompt.
        structured_retries: Retries of a malformed evaluation
            (``Settings.models.structured_retries``).
    """

    def __init__(self, composer: PromptComposer, structured_retries: int) -> None:
        self.composer = composer
        self.structured_retries = structured_retries

    async def evaluate(
        self,
        model: ModelClient,
        wm: WorkingMemory,
        selectable: list[Candidate],
        mode: Literal["choice", "scores"],
    ) -> tuple[dict[int, float], dict[int, str], str | None]:
        """Each candidate's score, each one's assessment (choice mode), and the step note
        when the evaluation failed (then no scores: the planner's order is kept).

        In choice mode the chosen candidate scores 10 and the others 0.
        """
        scores: dict[int, float] = {}
        assessments: dict[int, str] = {}
        failed: str | None = None
        with tracer.start_as_current_span("evaluate", attributes={"cortex.evaluation": mode}):
            try:
                if mode == "choice":
                    best, assessments = await structured_call(
                        model,
                        self.composer.render_evaluation(wm, selectable, mode="choice"),
                        schema=choice_schema(selectable),
                        validate=lambda raw: parse_choice(raw, selectable),
                        schema_name="choice",
                        retries=self.structured_retries,
                    )
                    scores = {c.index: 10.0 if c.index == best else 0.0 for c in selectable}
                else:
                    scores = await structured_call(
                        model,
                        self.composer.render_evaluation(wm, selectable),
                        schema=score_schema(len(selectable)),
                        validate=lambda raw: parse_scores(raw, selectable),
                        schema_name="scores",
                        retries=self.structured_retries,
                    )
            except ModelError as exc:
                log.warning("evaluation failed, keeping the planner's order: %s", exc)
                failed = "evaluation failed; kept the planner's order"
        return scores, assessments, failed
