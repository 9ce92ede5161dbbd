"""The inner voice: an independent review of a final answer or reply before it is given.

For an agent with ``critic`` on, the drivers hand their draft (an autonomous run's finish
message, an interactive reply) to ``Critic.review``: a structured call that lists the
draft's problems against the objective and the evidence (the results observed, the memories
recalled) and gives a verdict. On "revise" the agent revises once: an autonomous run whose
step also proposed a call takes that call instead of finishing (the critique is about work
left undone more often than about wording: "the fact was not stored"), otherwise the agent
writes the answer once more, told the problems, and that revision is final (one round:
published work finds that more rounds of a model critiquing itself make answers worse,
arXiv:2310.01798). Drafts, critique and what was done go to the step log.

The critic is another model when one is configured (``Runtime.open(critic_model=...)``);
otherwise the same model with a reviewer's prompt that does not say the draft is its own,
which is the same lineage and is said so (``Review.independent`` is false, and the step
note reads "same model").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from cortex_ray._exceptions import ModelError
from cortex_ray._types import WorkingMemory
from cortex_ray.decide._answers import collapse_lead_in, placeholders
from cortex_ray.models import ChatMessage, ModelClient, structured_call
from cortex_ray.observability import tracer
from cortex_ray.perceive import PromptComposer, call_text
from cortex_ray.settings import STRUCTURED_RETRIES

__all__ = ["PROBLEMS_CHARS", "Critic", "Review", "critique_schema"]

log = logging.getLogger("cortex_ray.decide")

PROBLEMS_CHARS = 300


def critique_schema() -> dict[str, Any]:
    """The problems first (the verdict is given after them), then ok or revise."""
    return {
        "type": "object",
        "properties": {
            "problems": {"type": "string", "maxLength": PROBLEMS_CHARS},
            "verdict": {"enum": ["ok", "revise"]},
        },
        "required": ["problems", "verdict"],
        "additionalProperties": False,
    }


def revision_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"answer": {"type": "string", "minLength": 1}},
        "required": ["answer"],
        "additionalProperties": False,
    }


@dataclass(frozen=True, slots=True)
class Review:
    """What the critic said about a draft, and the revision when it asked for one."""

    draft: str
    verdict: str
    problems: str
    independent: bool
    revised: str | None = None

    @property
    def answer(self) -> str:
        return self.revised or self.draft

    @property
    def revise(self) -> bool:
        return self.verdict == "revise"

    def note(self) -> str:
        """The step log's account: who reviewed, the verdict, the problems, the first draft."""
        who = "another model" if self.independent else "same model, same lineage"
        text = f"critic ({who}): {self.verdict}"
        if self.problems and self.revise:
            text += f": {self.problems}"
        if self.revised is not None:
            text += f"; first draft: {self.draft}"
        return text


def _evidence_block(wm: WorkingMemory) -> str:
    lines = [
        f"{i}. {call_text(o.tool, o.args)} → {o.status.value}: {o.summary[:600]}"
        for i, o in enumerate(wm.observations, start=1)
    ]
    memories = [f"- {hit.memory.content[:300]}" for hit in wm.snapshot.recalled]
    blocks = []
    if wm.conversation:
        talk = "\n".join(f"{t.role}: {t.content[:600]}" for t in wm.conversation[-6:])
        blocks.append(f"Conversation:\n{talk}")
    blocks.append("Results of the agent's calls:\n" + ("\n".join(lines) or "(no calls made)"))
    if memories:
        blocks.append("The agent's recalled memories:\n" + "\n".join(memories))
    return "\n\n".join(blocks)


class Critic:
    """Reviews drafts with ``model`` (``independent`` when it is not the agent's own)."""

    def __init__(
        self,
        model: ModelClient | None,
        composer: PromptComposer,
        *,
        structured_retries: int = STRUCTURED_RETRIES,
        independent: bool,
    ) -> None:
        self.model = model
        self.composer = composer
        self.structured_retries = structured_retries
        """``Settings.models.structured_retries``."""
        self.independent = independent

    def _review_prompt(self, wm: WorkingMemory, draft: str) -> list[ChatMessage]:
        goal = wm.objective if wm.observations or not wm.conversation else wm.conversation[-1]
        objective = goal if isinstance(goal, str) else goal.content
        system = (
            "You review an assistant's answer before it is given. You did not write it. Judge "
            "it only against the objective and the evidence below: is every part of the "
            "objective done and answered, and is every value in the answer taken from the "
            "evidence rather than made up?"
        )
        user = (
            f"Objective: {objective}\n\n{_evidence_block(wm)}\n\nDraft answer: {draft}\n\n"
            'List the problems in a few words ("none" if there are none), then the verdict: '
            '"ok" if the answer can be given as it is, "revise" if it must change.'
        )
        return [ChatMessage(role="system", content=system), ChatMessage(role="user", content=user)]

    async def review(
        self, wm: WorkingMemory, draft: str, revise_with: ModelClient | None
    ) -> Review:
        """The critique of ``draft``, and on "revise" one revision by ``revise_with`` (the
        agent's own model; ``None``: the critique only, the caller acts on it). A critic that
        fails says nothing: the draft stands."""
        if self.model is None:
            return Review(draft, "ok", "no critic model", self.independent)
        with tracer.start_as_current_span(
            "critic", attributes={"cortex.critic.independent": self.independent}
        ):
            try:
                said = await structured_call(
                    self.model,
                    self._review_prompt(wm, draft),
                    schema=critique_schema(),
                    validate=_parse_critique,
                    schema_name="critique",
                    retries=self.structured_retries,
                )
            except ModelError as exc:
                log.info("the critic failed; the draft stands: %s", exc)
                return Review(draft, "ok", f"critic failed: {exc}", self.independent)
            verdict, problems = said
            review = Review(draft, verdict, problems, self.independent)
            if verdict != "revise" or revise_with is None:
                return review
            return await self.revised(wm, review, revise_with)

    async def revised(self, wm: WorkingMemory, review: Review, model: ModelClient) -> Review:
        """``review`` with the agent's one revision of its draft (or none, if that fails)."""
        text = await self._revise(wm, review.draft, review.problems, model)
        return Review(review.draft, review.verdict, review.problems, review.independent, text)

    async def _revise(
        self, wm: WorkingMemory, draft: str, problems: str, model: ModelClient
    ) -> str | None:
        tools = [t.name for t in wm.action_space]
        ask = (
            f"Your draft answer was: {draft}\nA reviewer found these problems: {problems}\n"
            "Write the answer once more, fixing them, with values only from the results "
            'above; if a value is not there, say so plainly. Reply as JSON: {"answer": ...}.'
        )

        def validate(raw: Any) -> str:
            text = raw.get("answer") if isinstance(raw, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise ValueError('expected {"answer": "..."}')
            text = collapse_lead_in(text.strip())
            if found := placeholders(text, tools):
                raise ValueError(f"the answer holds the placeholder {', '.join(found)}")
            return text

        try:
            return await structured_call(
                model,
                [*self.composer.render(wm), ChatMessage(role="user", content=ask)],
                schema=revision_schema(),
                validate=validate,
                schema_name="revision",
                retries=self.structured_retries,
            )
        except ModelError as exc:
            log.info("the revision failed; the first draft stands: %s", exc)
            return None


def _parse_critique(raw: Any) -> tuple[str, str]:
    if not isinstance(raw, dict) or raw.get("verdict") not in ("ok", "revise"):
        raise ValueError('expected {"problems": "...", "verdict": "ok" | "revise"}')
    problems = raw.get("problems")
    return str(raw["verdict"]), (problems if isinstance(problems, str) else "")[:PROBLEMS_CHARS]
