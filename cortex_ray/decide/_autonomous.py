"""The autonomous planner: PROPOSE up to K candidates, EVALUATE each, SELECT the argmax.

- Proposals come from one structured call whose schema admits only the agent's tools with
  their own argument schemas, or a finish; where the backend constrains decoding (llama.cpp
  grammars, vLLM guided decoding) the model cannot name an unknown tool.
- Every candidate is validated again here (unconstrained backends can still produce
  anything); invalid ones are recorded, never selected. If none is valid after the bounded
  retries, the run ends safely (FAILED, recorded, nothing executed).
- Scores come from a second structured call. With one valid candidate the scoring call is
  skipped (its score would not change the choice). If scoring fails after its retries, the
  planner's own order is kept. Ties go to the earlier proposal.
"""

from __future__ import annotations

import logging
from typing import Any

import jsonschema

from cortex_ray._exceptions import ModelError
from cortex_ray._settings import Settings
from cortex_ray._tracing import tracer
from cortex_ray._types import (
    AgentAction,
    Candidate,
    Decision,
    DecisionKind,
    ToolSpec,
    WorkingMemory,
)
from cortex_ray.decide._answers import collapse_lead_in, placeholder_note, placeholders
from cortex_ray.models import ModelClient, structured_call
from cortex_ray.perceive import PromptComposer

__all__ = ["NO_MODEL_REASON", "AutonomousDriver"]

log = logging.getLogger("cortex_ray.decide")

NO_MODEL_REASON = (
    "no model configured: set CORTEX_MODEL_BACKEND=local (packaged SmolLM2) or "
    "CORTEX_MODEL_BACKEND=openai with CORTEX_MODEL_URL"
)


# A rationale is a sentence; bounding it keeps a small model from repeating itself inside
# the string until the token limit cuts the JSON off.
RATIONALE_CHARS = 200


def proposal_schema(tools: tuple[ToolSpec, ...], k: int) -> dict[str, Any]:
    options: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {
                "tool": {"const": t.name},
                "args": t.parameters,
                "rationale": {"type": "string", "maxLength": RATIONALE_CHARS},
            },
            "required": ["tool", "args", "rationale"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    options.append(
        {
            "type": "object",
            "properties": {
                "finish": {"const": True},
                "message": {"type": "string"},
                "rationale": {"type": "string", "maxLength": RATIONALE_CHARS},
            },
            "required": ["finish", "message", "rationale"],
            "additionalProperties": False,
        }
    )
    return {
        "type": "object",
        "properties": {
            "candidates": {
                "type": "array",
                "items": {"anyOf": options},
                "minItems": 1,
                "maxItems": k,
            }
        },
        "required": ["candidates"],
        "additionalProperties": False,
    }


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


# Compiled argument validators by the id of the schema they were built from (kept with it,
# so a reused id never answers for another schema). The registry hands out one ToolSpec per
# tool, so this holds one per tool; bounded in case specs are built elsewhere.
_VALIDATORS: dict[int, tuple[dict[str, Any], jsonschema.Draft202012Validator]] = {}


def _validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    cached = _VALIDATORS.get(id(schema))
    if cached is None or cached[0] is not schema:
        if len(_VALIDATORS) >= 256:
            _VALIDATORS.clear()
        cached = (schema, jsonschema.Draft202012Validator(schema))
        _VALIDATORS[id(schema)] = cached
    return cached[1]


def parse_candidates(raw: Any, tools: tuple[ToolSpec, ...], k: int) -> list[Candidate]:
    """Shape-check the proposal and validate each candidate; raise if none is usable."""
    if not isinstance(raw, dict) or not isinstance(raw.get("candidates"), list):
        raise ValueError('expected {"candidates": [...]}')
    by_name = {t.name: t for t in tools}
    out: list[Candidate] = []
    for i, item in enumerate(raw["candidates"][:k]):
        if not isinstance(item, dict):
            out.append(Candidate(index=i, kind="tool", valid=False, invalid_reason="not an object"))
            continue
        rationale = str(item.get("rationale", ""))
        if item.get("finish") is True or ("message" in item and "tool" not in item):
            message = item.get("message")
            why: str | None = None
            if isinstance(message, str) and message.strip():
                message = collapse_lead_in(message.strip())
                if found := placeholders(message):
                    why = placeholder_note(found, by_name)
            else:
                why = "finish without a message"
            out.append(
                Candidate(
                    index=i,
                    kind="finish",
                    message=message if isinstance(message, str) else None,
                    rationale=rationale,
                    valid=why is None,
                    invalid_reason=why,
                )
            )
            continue
        name = item.get("tool")
        args = item.get("args", {})
        reason = None
        if not isinstance(name, str) or name not in by_name:
            reason = f"unknown tool {name!r}"
        elif not isinstance(args, dict):
            reason = "invalid arguments: not an object"
        else:
            error = next(iter(_validator(by_name[name].parameters).iter_errors(args)), None)
            if error is not None:
                reason = f"invalid arguments: {error.message}"
        out.append(
            Candidate(
                index=i,
                kind="tool",
                tool=name if isinstance(name, str) else None,
                args=args if isinstance(args, dict) else {},
                rationale=rationale,
                valid=reason is None,
                invalid_reason=reason,
            )
        )
    if not any(c.valid for c in out):
        reasons = "; ".join(c.invalid_reason or "" for c in out) or "no candidates"
        raise ValueError(f"no valid candidate ({reasons})")
    return out


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


class AutonomousDriver:
    """DECIDE for autonomous agents (see the module docstring)."""

    def __init__(
        self, model: ModelClient | None, composer: PromptComposer, settings: Settings
    ) -> None:
        self.model = model
        self.composer = composer
        self.settings = settings

    async def decide(self, wm: WorkingMemory) -> Decision:
        if self.model is None:
            return Decision(kind=DecisionKind.FINISH, failed=True, reason=NO_MODEL_REASON)
        k = self.settings.candidates
        tools = wm.action_space
        with tracer.start_as_current_span("cortex.decide.propose", attributes={"cortex.k": k}):
            try:
                candidates = await structured_call(
                    self.model,
                    self.composer.render_proposal(wm, k),
                    schema=proposal_schema(tools, k),
                    validate=lambda raw: parse_candidates(raw, tools, k),
                    schema_name="proposals",
                    retries=self.settings.structured_retries,
                )
            except ModelError as exc:
                return Decision(
                    kind=DecisionKind.FINISH,
                    failed=True,
                    reason=f"the planner produced no valid candidate: {exc}",
                )
        valid = [c for c in candidates if c.valid]
        note = ""
        if len(valid) > 1:
            with tracer.start_as_current_span("cortex.decide.evaluate"):
                try:
                    scores = await structured_call(
                        self.model,
                        self.composer.render_evaluation(wm, valid),
                        schema=score_schema(len(valid)),
                        validate=lambda raw: parse_scores(raw, valid),
                        schema_name="scores",
                        retries=self.settings.structured_retries,
                    )
                except ModelError as exc:
                    log.warning("evaluation failed, keeping the planner's order: %s", exc)
                    scores = {c.index: float(len(valid) - n) for n, c in enumerate(valid)}
                    note = "evaluation failed; kept the planner's order"
        else:
            scores = {valid[0].index: 10.0}
            note = "single valid candidate; not scored"
        candidates = [
            c.model_copy(update={"score": scores.get(c.index)}) if c.valid else c
            for c in candidates
        ]
        # argmax; ties go to the earlier proposal (max keeps the first maximum).
        chosen = max((c for c in candidates if c.valid), key=lambda c: c.score or 0.0)
        reason = note or f"argmax score {chosen.score:g}"
        if chosen.kind == "finish":
            return Decision(
                kind=DecisionKind.FINISH,
                message=chosen.message,
                candidates=tuple(candidates),
                selected=chosen.index,
                reason=reason,
            )
        assert chosen.tool is not None
        action_type = next(t.action_type for t in tools if t.name == chosen.tool)
        return Decision(
            kind=DecisionKind.ACT,
            action=AgentAction(
                tool=chosen.tool,
                args=chosen.args,
                action_type=action_type,
                rationale=chosen.rationale,
            ),
            candidates=tuple(candidates),
            selected=chosen.index,
            reason=reason,
        )
