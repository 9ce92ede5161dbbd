"""The one prompt composer: WorkingMemory → chat messages.

Every block renders to an empty string unless it has content, and blocks are joined with
one blank line, so adding a block cannot change the text of a prompt that does not use it.
Golden-file tests (tests/golden/) pin the exact text for each mode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from cortex_ray._types import (
    ActionType,
    AgentMode,
    Candidate,
    Observation,
    ScoredMemory,
    WorkingMemory,
)
from cortex_ray.models import ChatMessage

__all__ = [
    "MEMORY_CHARS",
    "PromptComposer",
    "call_text",
    "is_answer_part",
    "objective_parts",
    "repeat_of",
]

MEMORY_CHARS = 300
"""A recalled memory is shown up to this many characters: a step's memory quotes its
result, and a whole search result recalled into every prompt crowds out the task."""

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


PARAMETER_CHARS = 160
"""A parameter's description in the action space is cut to this many characters."""


def _type_text(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "|".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"][:8])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = "|".join(str(k) for k in kind)
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"array of {_type_text(schema['items'])}"
    return str(kind)


def _tier_note(tool: Any) -> str:
    """`` (tier: read)``: what the call may change, so the model (and whoever reads the
    prompt) knows which calls a dry run or a shadow run would not make."""
    tier = getattr(tool, "tier", None)
    return f" (tier: {tier.value})" if tier is not None else ""


def _signature(tool: Any) -> str:
    """``- name(a: string, b?: integer): description`` and a line per described parameter."""
    props = tool.parameters.get("properties", {}) if isinstance(tool.parameters, dict) else {}
    required = (
        set(tool.parameters.get("required", ())) if isinstance(tool.parameters, dict) else set()
    )
    params = []
    notes = []
    for name, schema in props.items():
        schema = schema if isinstance(schema, dict) else {}
        mark = "" if name in required else "?"
        # An optional parameter's default, as the schema gives it: without it, Qwen 1.5B
        # filled optional arguments with values nobody gave (docs/benchmarks.md, BFCL).
        default = (
            f" = {json.dumps(schema['default'], ensure_ascii=False)}"
            if "default" in schema and name not in required
            else ""
        )
        params.append(f"{name}{mark}: {_type_text(schema)}{default}")
        about = str(schema.get("description", "")).strip()
        if about:
            if len(about) > PARAMETER_CHARS:
                about = about[: PARAMETER_CHARS - 1] + "…"
            notes.append(f"    {name}: {about}")
    head = f"- {tool.name}({', '.join(params)}): {tool.description}{_tier_note(tool)}"
    return "\n".join([head, *notes])


_PART_SPLIT = re.compile(
    r"\s*(?:\n+|;\s*|,\s*(?:and\s+|then\s+)?|[.?!]\s+(?=[A-Z])|\s+then\s+"
    r"|\s+and\s+(?=(?:finish|answer|reply|respond|report|say|tell|give)\b))"
)
# Done by the finish itself: "finish with the answer", or a question the answer answers.
_ANSWER_PART = re.compile(
    r"^(?:and\s+)?(?:finish|answer|reply|respond|report|say|tell|give"
    r"|what|which|who|whom|when|where|why|how)\b",
    re.I,
)
MAX_PARTS = 6


def objective_parts(objective: str) -> list[str]:
    """The objective's parts, when it lists several ("Find out X, remember it as a fact,
    and finish with Y" → three), else []: what the planner checks off, one by one."""
    text = re.sub(r"^\s*\d+[.)]\s*", "", objective.strip(), flags=re.M)
    parts = [p.strip(" .") for p in _PART_SPLIT.split(text)]
    parts = [re.sub(r"^\d+[.)]\s*", "", p) for p in parts if len(p.strip(" .")) > 2]
    return parts[:MAX_PARTS] if 2 <= len(parts) <= MAX_PARTS else []


def is_answer_part(part: str) -> bool:
    """A part that the finish itself does ("finish with a one-sentence answer", "What is
    Alice's favourite colour")."""
    return bool(_ANSWER_PART.match(part.strip()))


def call_text(tool: str | None, args: dict[str, Any]) -> str:
    """A call as the planner reads it: ``remember_fact(subject="x", fact="y")``."""
    inner = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
    return f"{tool}({inner})"


def _call_key(tool: str | None, args: dict[str, Any]) -> str:
    return f"{tool}\x00{json.dumps(args, sort_keys=True, ensure_ascii=False)}"


# A call that ended so is settled: made again with the same arguments it gives the same
# (an error such as "no published collection 'science'" too); a timeout may not.
_SETTLED = frozenset({"OK", "ERROR", "REFUSED", "SIMULATED", "PROPOSED"})


def _settled(obs: Observation) -> bool:
    # An interrupted step (the process died while it ran) may be retried with its key.
    return obs.status.value in _SETTLED and not obs.summary.startswith("interrupted:")


def repeated_calls(observations: Sequence[Observation]) -> dict[str, int]:
    """Each call settled so far (done, failed or refused, not timed out or interrupted) →
    the step number (1-based) that first made it."""
    first: dict[str, int] = {}
    for n, obs in enumerate(observations, start=1):
        if _settled(obs):
            first.setdefault(_call_key(obs.tool, obs.args), n)
    return first


def repeat_of(
    observations: Sequence[Observation], tool: str | None, args: dict[str, Any]
) -> int | None:
    """The step (1-based) that already made this call successfully, or None."""
    return repeated_calls(observations).get(_call_key(tool, args))


class PromptComposer:
    """Renders working memory; ``show_action_space`` and ``earlier_chars``
    (``progress_earlier_chars``) are the settings of those names."""

    def __init__(self, *, show_action_space: bool = True, earlier_chars: int = 500) -> None:
        self.show_action_space = show_action_space
        self.earlier_chars = earlier_chars

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
            if wm.mode is AgentMode.AUTONOMOUS:
                # The planner writes the arguments itself: it needs their names, types and
                # meanings (a chat model gets them with the tools it is given).
                lines = "\n".join(_signature(t) for t in tools)
            else:
                lines = "\n".join(f"- {t.name}: {t.description}{_tier_note(t)}" for t in tools)
            groups.append(f"{category.value} ({_CATEGORY_BLURB[category]}):\n{lines}")
        return "Action space:\n" + "\n".join(groups)

    @staticmethod
    def memory_block(recalled: Sequence[ScoredMemory], *, searchable: bool = False) -> str:
        """Recalled memories; with none and ``searchable`` (the agent has ``memory_search``)
        a line saying so: recall ranks every visible memory, so nothing recalled means a
        search would find nothing either, and small models searched an empty memory first."""
        if not recalled:
            if not searchable:
                return ""
            return (
                "Relevant memories: none (your long-term memory holds nothing from earlier "
                "runs or conversations yet)."
            )
        lines = []
        for hit in recalled:
            m = hit.memory
            when = m.valid_from.strftime("%Y-%m-%d %H:%M")
            about = f" ({m.subject})" if m.subject else ""
            content = m.content
            if len(content) > MEMORY_CHARS:
                content = content[: MEMORY_CHARS - 1] + "…"
            lines.append(f"- [{m.kind.value.lower()} {when}]{about} {content}")
        return "Relevant memories:\n" + "\n".join(lines)

    def progress_block(self, wm: WorkingMemory) -> str:
        if not wm.observations:
            return ""
        lines = []
        seen: dict[str, int] = {}
        last = len(wm.observations)
        for i, obs in enumerate(wm.observations, start=1):
            key = _call_key(obs.tool, obs.args)
            summary = obs.summary
            if i < last and len(summary) > self.earlier_chars:
                summary = summary[: self.earlier_chars - 1] + "…"
            again = f" (the same call as step {seen[key]})" if key in seen else ""
            if _settled(obs):
                seen.setdefault(key, i)
            lines.append(
                f"{i}. {call_text(obs.tool, obs.args)} [{obs.action_type.value}] "
                f"{obs.status.value}: {summary}{again}"
            )
        return "Progress so far (calls already made, with their results):\n" + "\n".join(lines)

    # prompts ------------------------------------------------------------------------------

    def system_prompt(self, wm: WorkingMemory) -> str:
        return _join(
            self.identity_block(wm),
            _MODE_INSTRUCTIONS[wm.mode],
            self.action_space_block(wm),
            self.memory_block(
                wm.snapshot.recalled,
                searchable=any(t.name == "memory_search" for t in wm.action_space),
            ),
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
        # "Propose up to 1 different candidate" made Qwen 1.5B take a neighbour of the right
        # function (BFCL `multiple`: 1 of 6 lost cases right, against 5 of 6 asked for "the
        # next action"): asked for *different* ideas, it avoids the obvious one.
        shape = (
            '{"tool": name, "args": {...}, "rationale": why} or, if the objective is met, '
            '{"finish": true, "message": the final answer, "rationale": why}.'
        )
        if k == 1:
            ask = f"Propose the next action: a tool call {shape}"
        else:
            ask = (
                f"Propose up to {k} different candidate next actions. Each is either a tool "
                f"call {shape}"
            )
        parts = objective_parts(wm.objective)
        if wm.observations and parts:
            # A checklist the model marks part by part: measured more reliable than asking
            # what remains (Qwen 1.5B said "nothing" with a part plainly undone).
            listed = "\n".join(f"{i}. {p}" for i, p in enumerate(parts, start=1))
            ask += (
                f'\nThe objective\'s parts:\n{listed}\nFirst write "done": for each part, in '
                "order, true if the progress above shows it done, else false. Then propose "
                "the next actions for the first part not done; once every part but the answer "
                "is done, propose a finish whose message gives the answer from the results above."
            )
        elif wm.observations:
            # Small models keep calling tools after the objective is met, or call the same
            # tool again: make them check the progress first (issue 14, point 3).
            ask += (
                ' First write "remaining": check the progress above against each part of the '
                'objective and say which part is not done yet ("nothing" when every part is '
                "done). If nothing remains, propose a finish whose message gives the answer "
                "from the results above."
            )
        return [*self.render(wm), ChatMessage(role="user", content=ask)]

    def render_final_answer(self, wm: WorkingMemory) -> list[ChatMessage]:
        """The planner said nothing remains: ask for the final answer alone."""
        ask = (
            "Every part of the objective is done. Answer the objective now, in one or two "
            "sentences, using the values in the results above.\n"
            f"Objective: {wm.objective}\n"
            'Reply as JSON: {"finish": true, "message": your answer, "rationale": why}.'
        )
        return [*self.render(wm), ChatMessage(role="user", content=ask)]

    def render_retry_repeats(
        self, wm: WorkingMemory, k: int, repeated: Sequence[Candidate]
    ) -> list[ChatMessage]:
        """PROPOSE again when every candidate repeated a call already made, or would store
        values that nothing gave."""
        calls = "; ".join(
            f"{call_text(c.tool, c.args)} (step {c.repeats})" for c in repeated if c.repeats
        )
        made_up = "; ".join(
            f"{call_text(c.tool, c.args)} ({', '.join(c.unsupported)})"
            for c in repeated
            if c.kind == "tool" and c.unsupported and not c.repeats
        )
        said = []
        if calls:
            said.append(
                f"Every candidate you proposed repeats a call already made: {calls}. Its "
                "result is in the progress above and will not change."
            )
        if made_up:
            said.append(
                f"These would store values that no result, memory or the goal gave: {made_up}."
            )
        note = " ".join(
            [
                *said,
                "Propose different next actions, or finish with the answer from the results above.",
            ]
        )
        return [*self.render_proposal(wm, k), ChatMessage(role="user", content=note)]

    def render_evaluation(
        self, wm: WorkingMemory, candidates: Sequence[Candidate], *, mode: str = "scores"
    ) -> list[ChatMessage]:
        """The planner's EVALUATE call: score each candidate against the objective, or
        (``mode="choice"``) assess each in a few words and pick the best."""
        lines = []
        for c in candidates:
            if c.kind == "finish":
                what = f"finish with: {c.message}"
                if c.unsupported:
                    what += f" [{', '.join(c.unsupported)}: in no result above]"
            else:
                what = call_text(c.tool, c.args)
                if c.repeats:
                    what += f" [repeats step {c.repeats}]"
                if c.unsupported:
                    what += f" [{', '.join(c.unsupported)}: in no result above]"
            lines.append(f"{c.index}. {what} (rationale: {c.rationale})")
        if mode == "choice":
            ask = (
                "Which candidate is the best next step toward the objective, given the "
                "progress so far? For each candidate, in the order listed, say in a few words "
                "what it gives toward the objective, then give the number of the best one. "
                "A finish is best only once the progress answers every part of the objective."
            )
        else:
            ask = (
                "Score each candidate from 0 (useless or harmful) to 10 (best next step toward "
                "the objective, given the progress so far), one score per candidate in the "
                "order listed. A call that repeats one already made is useless; a finish is "
                "best once the progress answers every part of the objective, and useless "
                "before."
            )
        ask += "\nCandidates:\n" + "\n".join(lines)
        return [*self.render(wm), ChatMessage(role="user", content=ask)]
