"""The autonomous planner: PROPOSE up to K candidates, EVALUATE each, SELECT the argmax.

- Proposals come from one structured call whose schema admits only the agent's tools with
  their own argument schemas, or a finish; where the backend constrains decoding (llama.cpp
  grammars, vLLM guided decoding) the model cannot name an unknown tool.
- Every candidate is validated again here (unconstrained backends can still produce
  anything); invalid ones are recorded, never selected. If none is valid after the bounded
  retries, the run ends safely (FAILED, recorded, nothing executed).
- A candidate that repeats a call already made in this run, with the same arguments, is
  flagged (``Candidate.repeats``, the step that made it) and selected only when no other
  valid candidate exists. When every valid candidate is a repeat, the answer is asked for
  (if no part of the objective is left); otherwise the planner is asked again, told which
  calls it repeated, with the repeated tools left out, until a new call comes or every tool
  was repeated (then the answer is asked for).
- The evaluation is a second structured call over the candidates that can be selected
  (skipped when there is one: it would not change the choice). ``evaluation="choice"`` (the
  default): a few words on each candidate, then the number of the best one (the chosen one
  scores 10, the others 0); ``"scores"``: a 0-10 score each, argmax, ties to the earlier
  proposal. Measured on the agent benchmark, small models give every candidate the same
  score or number them in order, and pick well when asked to choose (docs/benchmarks.md).
  Scores that carry no judgement (all equal, or following the proposal order in equal
  steps over three or more candidates: 1, 2, 3 or 9, 8, 7) are not used: the planner's
  order is kept, and the step log says so; so is it when the evaluation fails.
- An optional argument whose text nothing gave (not the objective, a result or a memory) is
  left out of a candidate (``Candidate.dropped``, said in the step log), so the tool's
  default applies: on BFCL Qwen 1.5B filled ``make`` "Yamaha" for "an acoustic instrument"
  and ``scale`` "high" where nobody named a scale. Required arguments, numbers and booleans
  are kept (``made_up_optionals``).
- Once the run has observations the proposal first marks the objective's parts done (or
  says what remains); when nothing does and no answer was proposed, one is asked for and
  competes with the proposed calls.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from typing import Any

import jsonschema

from cortex_ray._exceptions import ModelError
from cortex_ray._types import (
    ActionType,
    AgentAction,
    Candidate,
    Decision,
    DecisionKind,
    ToolSpec,
    WorkingMemory,
)
from cortex_ray.decide._answers import (
    collapse_lead_in,
    evidence_of,
    made_up_optionals,
    placeholder_note,
    placeholders,
    unsupported_values,
)
from cortex_ray.decide._critic import Critic
from cortex_ray.models import ModelClient, structured_call
from cortex_ray.observability import tracer
from cortex_ray.perceive import PromptComposer, is_answer_part, objective_parts, repeat_of
from cortex_ray.settings import STRUCTURED_RETRIES, DecideOptions

__all__ = ["NO_MODEL_REASON", "AutonomousDriver", "no_judgement", "nothing_left"]

log = logging.getLogger("cortex_ray.decide")

NO_MODEL_REASON = (
    "no model configured: set CORTEX_MODELS__BACKEND=local (the packaged CORTEX_MODELS__NAME) "
    "or CORTEX_MODELS__BACKEND=openai with CORTEX_MODELS__URL"
)


# A rationale is a sentence; bounding it keeps a small model from repeating itself inside
# the string until the token limit cuts the JSON off.
RATIONALE_CHARS = 200


# What the planner says is still to do, before it proposes (once it has observations):
# bounded like a rationale.
REMAINING_CHARS = 160


def proposal_schema(
    tools: tuple[ToolSpec, ...], k: int, *, remaining: bool = False, parts: int = 0
) -> dict[str, Any]:
    """``{"candidates": [...]}``; with ``remaining``, a ``"remaining"`` string comes first:
    what part of the objective is not done yet. Constrained decoding writes properties in
    the schema's order, so the model states what is left before it proposes (issue 14:
    without it, small models kept calling tools after the objective was met)."""
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
    options.append(_finish_option())
    properties: dict[str, Any] = {}
    if parts:
        # The objective's checklist: one true/false per part, in order.
        properties["done"] = {
            "type": "array",
            "items": {"type": "boolean"},
            "minItems": parts,
            "maxItems": parts,
        }
    elif remaining:
        properties["remaining"] = {"type": "string", "maxLength": REMAINING_CHARS}
    properties["candidates"] = {
        "type": "array",
        "items": {"anyOf": options},
        "minItems": 1,
        "maxItems": k,
    }
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


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


def _finish_option() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "finish": {"const": True},
            "message": {"type": "string"},
            "rationale": {"type": "string", "maxLength": RATIONALE_CHARS},
        },
        "required": ["finish", "message", "rationale"],
        "additionalProperties": False,
    }


def finish_schema() -> dict[str, Any]:
    """A finish alone: the final answer once the planner said nothing remains."""
    return _finish_option()


_NOTHING = re.compile(
    r"^(nothing(?! but)|none(?! of)|no ?thing|n/?a|-+|no (part|step|action)s?|"
    r"all (parts )?(are )?done|every(thing| part) (is )?done|"
    r"the objective is (met|done|complete))\b"
)


def nothing_left(remaining: str) -> bool:
    """Whether the planner's "remaining" says every part of the objective is done."""
    text = remaining.strip().strip(".!\"'").casefold()
    return bool(_NOTHING.match(text))


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
    seen: dict[str, int] = {}
    for i, item in enumerate(raw["candidates"][:k]):
        if isinstance(item, dict):
            # The same idea proposed twice is one candidate: scoring copies says nothing.
            key = json.dumps(
                {f: item.get(f) for f in ("tool", "args", "finish", "message")}, sort_keys=True
            )
            if key in seen:
                out.append(
                    Candidate(
                        index=i,
                        kind="finish" if item.get("finish") is True else "tool",
                        tool=item.get("tool") if isinstance(item.get("tool"), str) else None,
                        valid=False,
                        invalid_reason=f"the same as candidate {seen[key]}",
                    )
                )
                continue
            seen[key] = i
        if not isinstance(item, dict):
            out.append(Candidate(index=i, kind="tool", valid=False, invalid_reason="not an object"))
            continue
        rationale = str(item.get("rationale", ""))
        if item.get("finish") is True or ("message" in item and "tool" not in item):
            message = item.get("message")
            why: str | None = None
            if isinstance(message, str) and message.strip():
                message = collapse_lead_in(message.strip())
                if found := placeholders(message, by_name):
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
            elif held := _held_placeholders(args, by_name):
                # "remember_fact(fact='It is [current_time].')" would store the placeholder.
                key, found = held
                reason = f"invalid arguments: {key}: " + placeholder_note(found, by_name)
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


def _held_placeholders(
    args: dict[str, Any], tools: dict[str, ToolSpec]
) -> tuple[str, list[str]] | None:
    """The first argument whose text holds a placeholder, and the placeholders."""
    for key, value in args.items():
        texts = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        for text in texts:
            if isinstance(text, str) and (found := placeholders(text, tools)):
                return key, found
    return None


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


def no_judgement(scores: list[float]) -> str | None:
    """Why scores given in proposal order carry no judgement, or None when they might.

    All equal; or, over three or more candidates, equal non-zero steps in the order they
    were listed (1, 2, 3 / 9, 8, 7): what a small model does when it numbers the list
    instead of judging it (issue 14)."""
    shown = ", ".join(f"{s:g}" for s in scores)
    if len(scores) >= 2 and len(set(scores)) == 1:
        return f"every candidate scored {scores[0]:g}"
    if len(scores) >= 3:
        steps = {round(b - a, 6) for a, b in itertools.pairwise(scores)}
        if len(steps) == 1 and 0 not in steps:
            return f"scores follow the proposal order ({shown})"
    return None


def _unsupported_note(c: Candidate) -> str:
    what = "the answer's" if c.kind == "finish" else f"{c.tool}'s"
    return f"{what} {', '.join(c.unsupported)} appear in no result, memory or the goal"


def _arg_text(args: dict[str, Any]) -> str:
    """The text values of a call's arguments, one per line (what a LEARNING tool stores)."""
    texts = [v for v in args.values() if isinstance(v, str)]
    texts += [x for v in args.values() if isinstance(v, list) for x in v if isinstance(x, str)]
    return "\n".join(texts)


def _without_made_up(c: Candidate, parameters: dict[str, Any], evidence: list[str]) -> Candidate:
    """``c`` without the optional arguments whose values nothing gave (``made_up_optionals``):
    the tool's default applies, and the candidate says what was left out."""
    dropped = made_up_optionals(parameters, c.args, evidence)
    if not dropped:
        return c
    args = {k: v for k, v in c.args.items() if k not in dropped}
    return c.model_copy(update={"args": args, "dropped": {k: c.args[k] for k in dropped}})


def _repeats_in_a_row(wm: WorkingMemory) -> int:
    """How many of the latest observations, in a row, repeat a call made before them."""
    count = 0
    for i in range(len(wm.observations) - 1, -1, -1):
        o = wm.observations[i]
        if repeat_of(wm.observations[:i], o.tool, o.args) is None:
            break
        count += 1
    return count


def _stale(c: Candidate) -> bool:
    """A call that adds nothing: a repeat, or a memory write of values nothing gave."""
    return bool(c.repeats) or (c.kind == "tool" and bool(c.unsupported))


class AutonomousDriver:
    """DECIDE for autonomous agents (see the module docstring)."""

    def __init__(
        self,
        model: ModelClient | None,
        composer: PromptComposer,
        options: DecideOptions,
        *,
        structured_retries: int = STRUCTURED_RETRIES,
        critic: Critic | None = None,
    ) -> None:
        self.model = model
        self.composer = composer
        self.options = options
        """``Settings.decide``: K, the evaluation, the repeats that stop a run."""
        self.structured_retries = structured_retries
        """``Settings.models.structured_retries``."""
        self.critic = critic

    async def _propose(
        self, model: ModelClient, wm: WorkingMemory, prompt: list[Any], k: int
    ) -> tuple[list[Candidate], str]:
        """The candidates (repeats flagged) and what the planner said remains to do."""
        tools = wm.action_space
        # Tools that tool retrieval left out of the prompt are still the agent's: one named
        # anyway (an unconstrained model can) is validated like a shown one, then gated.
        held = tools + wm.hidden_tools
        remaining = bool(wm.observations)
        parts = objective_parts(wm.objective) if remaining else []

        def validate(raw: Any) -> tuple[list[Candidate], str]:
            candidates = parse_candidates(raw, held, k)
            if parts:
                done = raw.get("done") if isinstance(raw, dict) else None
                marks = done if isinstance(done, list) else []
                left = [
                    p
                    for i, p in enumerate(parts)
                    if not (i < len(marks) and marks[i] is True) and not is_answer_part(p)
                ]
                return candidates, "; ".join(left) if left else "nothing"
            said = raw.get("remaining") if remaining and isinstance(raw, dict) else None
            return candidates, said if isinstance(said, str) else ""

        candidates, left = await structured_call(
            model,
            prompt,
            schema=proposal_schema(tools, k, remaining=remaining, parts=len(parts)),
            validate=validate,
            schema_name="proposals",
            retries=self.structured_retries,
        )
        evidence = evidence_of(wm)
        learning = {t.name for t in held if t.action_type is ActionType.LEARNING}
        specs = {t.name: t for t in held}
        candidates = [
            _without_made_up(c, specs[c.tool].parameters, evidence)
            if c.valid and c.kind == "tool" and c.tool in specs
            else c
            for c in candidates
        ]
        flagged = [
            c.model_copy(
                update={
                    "repeats": repeat_of(wm.observations, c.tool, c.args),
                    "unsupported": tuple(
                        unsupported_values(_arg_text(c.args), evidence, names_anywhere=True)
                    )
                    if c.tool in learning
                    else (),
                }
            )
            if c.valid and c.kind == "tool"
            else c.model_copy(
                update={"unsupported": tuple(unsupported_values(c.message or "", evidence))}
            )
            if c.valid and c.kind == "finish"
            else c
            for c in candidates
        ]
        return flagged, left.strip()[:REMAINING_CHARS]

    async def _final_answer(
        self, model: ModelClient, wm: WorkingMemory, *, index: int
    ) -> Candidate | None:
        """A finish asked for on its own (the only shape the schema admits), or None."""
        tools = wm.action_space

        evidence = evidence_of(wm)

        def validate(raw: Any) -> Candidate:
            (c,) = parse_candidates({"candidates": [raw]}, tools, 1)
            if unsupported := unsupported_values(c.message or "", evidence):
                # Asked again, told so (the retry's note is this message).
                raise ValueError(
                    f"the answer's {', '.join(unsupported)} appear in no result above: "
                    "give the values the results show"
                )
            return c.model_copy(update={"index": index})

        try:
            return await structured_call(
                model,
                self.composer.render_final_answer(wm),
                schema=finish_schema(),
                validate=validate,
                schema_name="final_answer",
                retries=self.structured_retries,
            )
        except ModelError as exc:
            log.info("asking for the final answer failed: %s", exc)
            return None

    async def _narrowed(
        self,
        model: ModelClient,
        wm: WorkingMemory,
        k: int,
        candidates: list[Candidate],
        valid: list[Candidate],
        remaining: str,
        *,
        answer_tried: bool,
    ) -> tuple[list[Candidate], str, str]:
        """Every valid candidate is stale: the planner is asked again, told which calls it
        repeated, with those tools left out of the schema, and again without the next ones
        while tools remain (told not to, Qwen 1.5B searched an empty memory six times
        running, or went from memory_search to current_time and back, never to the
        remember_fact the objective asked for). A re-proposal counts only with a call that
        is new and, for a memory write, holds only values something gave: pushed off every
        tool it had used, Qwen 1.5B stored "veltran observatory: city: Los Angeles" with no
        result saying so. Returns the candidates, what remains, and the step note."""
        excluded: set[str | None] = set()
        shown = valid
        while True:
            excluded |= {c.tool for c in shown if c.kind == "tool" and _stale(c)}
            narrow = tuple(t for t in wm.action_space if t.name not in excluded)
            if not narrow:
                break
            asked = wm.model_copy(update={"action_space": narrow})
            try:
                again, said = await self._propose(
                    model, asked, self.composer.render_retry_repeats(asked, k, shown), k
                )
            except ModelError as exc:
                log.info("asking again after repeated calls failed: %s", exc)
                return candidates, remaining, "every candidate repeats an earlier call"
            if any(c.valid and not c.repeats and not c.unsupported for c in again):
                without = ", ".join(sorted(str(t) for t in excluded))
                note = f"every candidate repeated an earlier call; asked again without {without}"
                # A re-proposal that says nothing remains leads to the answer, not to its
                # new call: pushed off the tools it had used, Qwen 1.5B walked finished
                # tasks through every other tool (calculate had given 395; then
                # current_time, memory_search, remember_fact), saying itself that nothing
                # remained. With parts left the new call is taken: letting the answer
                # compete, the evaluation chose it over the remember_fact the checklist
                # still named (measured on the demo task).
                if nothing_left(said) and not answer_tried:
                    finish = await self._final_answer(model, wm, index=len(candidates))
                    if finish is not None and not finish.unsupported:
                        said_so = "that proposal said nothing remains: asked for the answer"
                        return [*candidates, finish], "nothing", f"{note}; {said_so}"
                return again, said or remaining, note
            shown = [c for c in again if c.valid] or shown
            if not any(c.kind == "tool" and _stale(c) and c.tool not in excluded for c in shown):
                return candidates, remaining, "every candidate repeats an earlier call"
        # Every tool it has was called again with what it already did (or would store what
        # nothing gave): there is nothing new to do, whatever its checklist says (Qwen 1.5B
        # marked parts undone that its first two steps had done): the answer.
        finish = None
        if not answer_tried:
            finish = await self._final_answer(model, wm, index=len(candidates))
        if finish is not None and not finish.unsupported:
            return (
                [*candidates, finish],
                remaining,
                "every tool's call was made already: asked for the answer",
            )
        return candidates, remaining, "every candidate repeats an earlier call"

    async def decide(self, wm: WorkingMemory) -> Decision:
        if self.model is None:
            return Decision(kind=DecisionKind.FINISH, failed=True, reason=NO_MODEL_REASON)
        model = self.model
        k = self.options.candidates
        tools = wm.action_space + wm.hidden_tools  # a chosen tool may be a held, unshown one
        notes: list[str] = []
        with tracer.start_as_current_span("propose", attributes={"cortex.k": k}):
            try:
                candidates, remaining = await self._propose(
                    model, wm, self.composer.render_proposal(wm, k), k
                )
            except ModelError as exc:
                return Decision(
                    kind=DecisionKind.FINISH,
                    failed=True,
                    reason=f"the planner produced no valid candidate: {exc}",
                )
            if nothing_left(remaining) and not any(
                c.valid and c.kind == "finish" for c in candidates
            ):
                # The planner says the objective is met but proposed no answer (small models
                # say "nothing" remains and still propose a call: the grammar's first branch
                # is a tool): ask for the answer alone, and let it compete with the calls.
                finish = await self._final_answer(model, wm, index=len(candidates))
                if finish is not None:
                    candidates.append(finish)
                    notes.append("nothing remains: asked for the answer")
            valid = [c for c in candidates if c.valid]
            answer_tried = False  # asked for once in a step at most (each try retries)
            if all(_stale(c) for c in valid) and (not remaining or nothing_left(remaining)):
                # Every idea repeats a call whose result the planner already has (or stores
                # what nothing gave), and it names nothing left to do: most often the work
                # is done (a small model calls calculate again on the same expression
                # instead of finishing), so the answer is asked for first. With parts
                # left, it is not (the demo finished with a made-up date, "remember it as a
                # fact" undone).
                finish = await self._final_answer(model, wm, index=len(candidates))
                answer_tried = True
                if finish is not None and not finish.unsupported:
                    candidates.append(finish)
                    notes.append("every candidate repeats an earlier call: asked for the answer")
                    valid.append(finish)
            if all(_stale(c) for c in valid):
                candidates, remaining, narrowed = await self._narrowed(
                    model, wm, k, candidates, valid, remaining, answer_tried=answer_tried
                )
                notes.append(narrowed)
        valid = [c for c in candidates if c.valid]
        # A repeat, or an answer with made-up numbers, is chosen only when nothing else
        # valid was proposed.
        selectable = [c for c in valid if not c.repeats and not c.unsupported] or valid
        scores: dict[int, float] = {}
        assessments: dict[int, str] = {}
        choice = self.options.evaluation == "choice"
        if len(selectable) > 1:
            with tracer.start_as_current_span(
                "evaluate", attributes={"cortex.evaluation": self.options.evaluation}
            ):
                try:
                    if choice:
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
                    notes.append("evaluation failed; kept the planner's order")
            if choice and scores:
                chosen = next(c for c in selectable if scores[c.index] == 10.0)
                notes.append(f"chosen by the evaluation among {len(selectable)}")
            elif scores and (why := no_judgement([scores[c.index] for c in selectable])):
                notes.append(f"{why}: not used, kept the planner's order")
                chosen = selectable[0]
            elif scores:
                # argmax; ties go to the earlier proposal (max keeps the first maximum).
                chosen = max(selectable, key=lambda c: scores[c.index])
            else:
                chosen = selectable[0]
        else:
            chosen = selectable[0]
            notes.append("single selectable candidate; not scored")
        candidates = [
            c.model_copy(
                update={"score": scores.get(c.index), "assessment": assessments.get(c.index)}
            )
            if c.valid
            else c
            for c in candidates
        ]
        if chosen.repeats:
            notes.append(f"repeats step {chosen.repeats}")
            limit = self.options.stop_after_repeats
            if limit and _repeats_in_a_row(wm) + 1 >= limit:
                # Nothing new for `limit` steps: the rest of the budget would go the same way
                # (Qwen 1.5B called the same failing knowledge_search five times running).
                return Decision(
                    kind=DecisionKind.FINISH,
                    failed=True,
                    candidates=tuple(candidates),
                    selected=chosen.index,
                    reason=f"no progress: {limit} steps in a row had nothing but a call already "
                    f"made, and no answer the results support ({'; '.join(notes)})",
                )
        if chosen.unsupported:
            notes.append(_unsupported_note(chosen))
        if chosen.dropped:
            left_out = ", ".join(f"{k}={v!r}" for k, v in chosen.dropped.items())
            notes.append(f"left out {left_out}: optional, and nothing gave the value")
        if not notes:
            notes.append(f"argmax score {scores[chosen.index]:g}")
        if remaining:
            notes.insert(0, f"remaining: {remaining}")
        if chosen.kind == "finish" and wm.critic and self.critic is not None:
            review = await self.critic.review(wm, chosen.message or "", None)
            instead = [c for c in selectable if c.kind == "tool"]
            if review.revise and instead:
                # Work is left (the critique says so): the step's best call, not the finish.
                chosen = max(instead, key=lambda c: scores.get(c.index, 0.0))
                notes.append(f"{review.note()}; acted instead of finishing")
            else:
                if review.revise:
                    review = await self.critic.revised(wm, review, model)
                notes.append(review.note())
                if review.revised is not None:
                    chosen = Candidate(
                        index=len(candidates),
                        kind="finish",
                        message=review.revised,
                        rationale="revised after the critique",
                    )
                    candidates.append(chosen)
        reason = "; ".join(notes)
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
