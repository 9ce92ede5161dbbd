"""PROPOSE: up to K candidates from one structured call, and what the first proposal calls
for (the answer asked for when nothing remains, the planner asked again when every call
repeats an earlier one). The schemas and the parsing are ``cortex_ray.decide._proposals``'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from cortex_ray._exceptions import ModelError
from cortex_ray._types import ActionType, Candidate, WorkingMemory
from cortex_ray.decide._answers import evidence_of, made_up_optionals, unsupported_values
from cortex_ray.decide._proposals import (
    REMAINING_CHARS,
    finish_schema,
    nothing_left,
    parse_candidates,
    proposal_schema,
)
from cortex_ray.models import ModelClient, structured_call
from cortex_ray.observability import tracer
from cortex_ray.perceive import PromptComposer, is_answer_part, objective_parts, repeat_of

__all__ = ["Proposal", "Proposer"]

log = logging.getLogger("cortex_ray.decide")


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


def _stale(c: Candidate) -> bool:
    """A call that adds nothing: a repeat, or a memory write of values nothing gave."""
    return bool(c.repeats) or (c.kind == "tool" and bool(c.unsupported))


@dataclass
class Proposal:
    """What the proposal stage hands the evaluation."""

    candidates: list[Candidate]
    """Every candidate, valid or not, in proposal order (an answer asked for comes last)."""
    remaining: str
    """What the planner said remains of the objective ("" before any observation)."""
    notes: list[str] = field(default_factory=list)
    """The step notes the stage wrote (an answer asked for, a re-proposal)."""
    failure: str | None = None
    """Why the planner produced no valid candidate (then the run ends, nothing executed)."""


class Proposer:
    """Proposes the candidates of one autonomous step (the span ``propose``).

    Args:
        composer: Renders the proposal, re-proposal and final-answer prompts.
        structured_retries: Retries of a malformed proposal
            (``Settings.models.structured_retries``).
    """

    def __init__(self, composer: PromptComposer, structured_retries: int) -> None:
        self.composer = composer
        self.structured_retries = structured_retries

    async def propose(self, model: ModelClient, wm: WorkingMemory, k: int) -> Proposal:
        """Up to ``k`` candidates, with the answer asked for or the planner asked again
        where the first proposal calls for it (see ``cortex_ray.decide._autonomous``)."""
        notes: list[str] = []
        with tracer.start_as_current_span("propose", attributes={"cortex.k": k}):
            try:
                candidates, remaining = await self._candidates(
                    model, wm, self.composer.render_proposal(wm, k), k
                )
            except ModelError as exc:
                return Proposal(
                    [], "", notes, failure=f"the planner produced no valid candidate: {exc}"
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
        return Proposal(candidates, remaining, notes)

    async def _candidates(
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
                again, said = await self._candidates(
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
