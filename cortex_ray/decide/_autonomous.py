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

One module per stage: ``_proposals`` (the proposal's schemas and parsing), ``_proposing``
(the ``propose`` span: the proposal and what it calls for), ``_evaluating`` (the
``evaluate`` span), ``_selecting`` (the choice, the argmax); this driver runs them in
order, then applies the repeat limit and the critic.
"""

from __future__ import annotations

from cortex_ray._types import AgentAction, Candidate, Decision, DecisionKind, WorkingMemory
from cortex_ray.decide._critic import Critic
from cortex_ray.decide._evaluating import Evaluator
from cortex_ray.decide._proposing import Proposer
from cortex_ray.decide._selecting import repeats_in_a_row, select, unsupported_note
from cortex_ray.models import ModelClient
from cortex_ray.perceive import PromptComposer
from cortex_ray.settings import STRUCTURED_RETRIES, DecideOptions

__all__ = ["NO_MODEL_REASON", "AutonomousDriver"]

NO_MODEL_REASON = (
    "no model configured: set CORTEX_MODELS__BACKEND=local (the packaged CORTEX_MODELS__NAME) "
    "or CORTEX_MODELS__BACKEND=openai with CORTEX_MODELS__URL"
)


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
        self.proposer = Proposer(composer, structured_retries)
        self.evaluator = Evaluator(composer, structured_retries)

    async def decide(self, wm: WorkingMemory) -> Decision:
        if self.model is None:
            return Decision(kind=DecisionKind.FINISH, failed=True, reason=NO_MODEL_REASON)
        model = self.model
        k = self.options.candidates
        tools = wm.action_space + wm.hidden_tools  # a chosen tool may be a held, unshown one
        proposal = await self.proposer.propose(model, wm, k)
        if proposal.failure is not None:
            return Decision(kind=DecisionKind.FINISH, failed=True, reason=proposal.failure)
        candidates, remaining, notes = proposal.candidates, proposal.remaining, proposal.notes
        valid = [c for c in candidates if c.valid]
        # A repeat, or an answer with made-up numbers, is chosen only when nothing else
        # valid was proposed.
        selectable = [c for c in valid if not c.repeats and not c.unsupported] or valid
        scores: dict[int, float] = {}
        assessments: dict[int, str] = {}
        if len(selectable) > 1:
            scores, assessments, failed = await self.evaluator.evaluate(
                model, wm, selectable, self.options.evaluation
            )
            if failed is not None:
                notes.append(failed)
            chosen, why = select(selectable, scores, choice=self.options.evaluation == "choice")
            if why is not None:
                notes.append(why)
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
            if limit and repeats_in_a_row(wm) + 1 >= limit:
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
            notes.append(unsupported_note(chosen))
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
