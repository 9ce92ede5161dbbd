"""The one prompt composer: WorkingMemory → chat messages.

Every block renders to an empty string unless it has content, and blocks are joined with
one blank line, so adding a block cannot change the text of a prompt that does not use it.
Golden-file tests (tests/golden/) pin the exact text for each mode.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from cortex_ray._types import ActionType, AgentMode, Candidate, ScoredMemory, WorkingMemory
from cortex_ray.models import ChatMessage

__all__ = ["PromptComposer"]

_CATEGORY_BLURB = {
    ActionType.REASONING: "think; no side effect",
    ActionType.RETRIEVAL: "read memory or knowledge",
    ActionType.LEARNING: "write durable memory",
    ActionType.GROUNDING: "act on the world, including dialogue",
}

_MODE_INSTRUCTIONS = {
    AgentMode.AUTONOMOUS: (
        "You work alone toward an objective, one action per step. Use the tools in your "
        "action space, and finish as soon as the objective is met."
    ),
    AgentMode.INTERACTIVE: (
        "You are talking with a person. Use a tool when it helps; otherwise answer the "
        "person directly."
    ),
}


def _join(*blocks: str) -> str:
    return "\n\n".join(b for b in blocks if b)


class PromptComposer:
    """Renders working memory; ``show_action_space`` is the setting of the same name."""

    def __init__(self, *, show_action_space: bool = True) -> None:
        self.show_action_space = show_action_space

    # blocks -------------------------------------------------------------------------------

    @staticmethod
    def identity_block(wm: WorkingMemory) -> str:
        head = f"You are {wm.agent_name}." + (
            f" {wm.persona.strip()}" if wm.persona.strip() else ""
        )
        skills = "\n".join(f"- {s}" for s in wm.skills)
        return _join(head, f"Skills:\n{skills}" if skills else "")

    def action_space_block(self, wm: WorkingMemory) -> str:
        if not self.show_action_space or not wm.action_space:
            return ""
        groups = []
        for category in ActionType:
            # In a conversation the answer itself is the reply: listed as a tool beside the
            # tool grammar's {"reply": ...}, it drew SmolLM2 to reply (with placeholders such
            # as "{{current_time}}") instead of calling the tool the question needed.
            tools = [
                t
                for t in wm.action_space
                if t.action_type is category
                and not (wm.mode is AgentMode.INTERACTIVE and t.name == "reply")
            ]
            if not tools:
                continue
            lines = "\n".join(f"- {t.name}: {t.description}" for t in tools)
            groups.append(f"{category.value} ({_CATEGORY_BLURB[category]}):\n{lines}")
        return "Action space:\n" + "\n".join(groups)

    @staticmethod
    def memory_block(recalled: Sequence[ScoredMemory]) -> str:
        if not recalled:
            return ""
        lines = []
        for hit in recalled:
            m = hit.memory
            when = m.valid_from.strftime("%Y-%m-%d %H:%M")
            about = f" ({m.subject})" if m.subject else ""
            lines.append(f"- [{m.kind.value.lower()} {when}]{about} {m.content}")
        return "Relevant memories:\n" + "\n".join(lines)

    @staticmethod
    def progress_block(wm: WorkingMemory) -> str:
        if not wm.observations:
            return ""
        lines = []
        for i, obs in enumerate(wm.observations, start=1):
            lines.append(
                f"{i}. {obs.tool} [{obs.action_type.value}] {obs.status.value}: {obs.summary}"
            )
        return "Progress so far:\n" + "\n".join(lines)

    # prompts ------------------------------------------------------------------------------

    def system_prompt(self, wm: WorkingMemory) -> str:
        return _join(
            self.identity_block(wm),
            _MODE_INSTRUCTIONS[wm.mode],
            self.action_space_block(wm),
            self.memory_block(wm.snapshot.recalled),
        )

    def render(self, wm: WorkingMemory) -> list[ChatMessage]:
        """The base conversation for either mode."""
        messages = [ChatMessage(role="system", content=self.system_prompt(wm))]
        if wm.mode is AgentMode.AUTONOMOUS:
            budget = f"Step {wm.step_index + 1} of {wm.max_steps}." if wm.max_steps else ""
            messages.append(
                ChatMessage(
                    role="user",
                    content=_join(f"Objective: {wm.objective}", budget, self.progress_block(wm)),
                )
            )
            return messages
        for turn in wm.conversation:
            if turn.role == "tool":
                messages.append(
                    ChatMessage(role="user", content=f"[{turn.tool} result] {turn.content}")
                )
            else:
                messages.append(ChatMessage(role=turn.role, content=turn.content))
        progress = self.progress_block(wm)
        if progress:
            messages.append(ChatMessage(role="user", content=progress))
        return messages

    def render_proposal(self, wm: WorkingMemory, k: int) -> list[ChatMessage]:
        """The planner's PROPOSE call: up to ``k`` candidate next actions."""
        ask = (
            f"Propose up to {k} different candidate next actions. Each is either a tool call "
            '{"tool": name, "args": {...}, "rationale": why} or, if the objective is met, '
            '{"finish": true, "message": the final answer, "rationale": why}.'
        )
        return [*self.render(wm), ChatMessage(role="user", content=ask)]

    def render_evaluation(
        self, wm: WorkingMemory, candidates: Sequence[Candidate]
    ) -> list[ChatMessage]:
        """The planner's EVALUATE call: score each candidate against the objective."""
        lines = []
        for c in candidates:
            if c.kind == "finish":
                what = f"finish with: {c.message}"
            else:
                what = f"{c.tool} {json.dumps(c.args, sort_keys=True, ensure_ascii=False)}"
            lines.append(f"{c.index}. {what} (rationale: {c.rationale})")
        ask = (
            "Score each candidate from 0 (useless or harmful) to 10 (best next step toward "
            "the objective), one score per candidate in the order listed.\nCandidates:\n"
            + "\n".join(lines)
        )
        return [*self.render(wm), ChatMessage(role="user", content=ask)]
