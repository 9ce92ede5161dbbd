"""The one prompt composer. Golden files pin the exact text the model sees in each mode.

Regenerate deliberately with ``CORTEX_UPDATE_GOLDEN=1 ./dev test tests/test_composer.py``
and review the diff: any change to these files changes what every model sees.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

import pytest

from cortex_ray import (
    ActionType,
    AgentMode,
    Candidate,
    MemoryKind,
    MemoryRecord,
    MemorySnapshot,
    Observation,
    ObservationStatus,
    ScoredMemory,
    ToolSpec,
    Turn,
    WorkingMemory,
)
from cortex_ray.act import ToolRegistry, builtin_tools
from cortex_ray.models import ChatMessage
from cortex_ray.perceive import PromptComposer

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).with_name("golden")
AGENT = UUID("00000000-0000-4000-8000-000000000001")
WHEN = datetime(2026, 11, 29, 9, 30, tzinfo=UTC)


def action_space(mode: AgentMode) -> tuple:
    registry = ToolRegistry(builtin_tools())
    order = list(ActionType)
    specs = [
        registry.spec(t)
        for t in builtin_tools()
        if mode is AgentMode.INTERACTIVE or t.name != "reply"
    ]
    return tuple(sorted(specs, key=lambda s: (order.index(s.action_type), s.name)))


def recalled() -> tuple[ScoredMemory, ...]:
    facts = [
        (MemoryKind.SEMANTIC, "alice's favourite colour is green", "alice favourite colour"),
        (MemoryKind.EPISODIC, "Step 1: current_time() [GROUNDING] → OK: 09:29", None),
    ]
    return tuple(
        ScoredMemory(
            memory=MemoryRecord(
                org_id="acme",
                agent_id=AGENT,
                kind=kind,
                content=content,
                subject=subject,
                valid_from=WHEN,
                recorded_at=WHEN,
            ),
            similarity=0.8,
            recency=1.0,
            importance=0.5,
            score=2.3,
        )
        for kind, content, subject in facts
    )


def working_memory(mode: AgentMode, **overrides: object) -> WorkingMemory:
    base: dict[str, object] = dict(
        mode=mode,
        agent_name="Ada",
        persona="A careful research assistant.",
        skills=("Cite what you remember.",),
        objective="Tell me what time it is and remember it.",
        snapshot=MemorySnapshot(query="time", recalled=recalled(), taken_at=WHEN),
        action_space=action_space(mode),
    )
    base.update(overrides)
    return WorkingMemory(**base)  # type: ignore[arg-type]


def as_text(messages: list[ChatMessage]) -> str:
    return "".join(f"<<{m.role}>>\n{m.content}\n" for m in messages)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("CORTEX_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with CORTEX_UPDATE_GOLDEN=1"
    assert text == path.read_text()


OBSERVATIONS = (
    Observation(
        tool="current_time",
        action_type=ActionType.GROUNDING,
        status=ObservationStatus.OK,
        summary='{"utc": "2026-11-29T09:30:00+00:00", "weekday": "Sunday"}',
    ),
)


def test_autonomous_proposal_prompt_is_pinned() -> None:
    wm = working_memory(AgentMode.AUTONOMOUS, observations=OBSERVATIONS, step_index=1, max_steps=8)
    check_golden("autonomous_proposal.txt", as_text(PromptComposer().render_proposal(wm, 3)))


def test_autonomous_evaluation_prompt_is_pinned() -> None:
    wm = working_memory(AgentMode.AUTONOMOUS, observations=OBSERVATIONS, step_index=1, max_steps=8)
    candidates = [
        Candidate(
            index=0,
            kind="tool",
            tool="remember_fact",
            args={"subject": "time", "fact": "09:30"},
            rationale="store it",
        ),
        Candidate(index=1, kind="finish", message="It is 09:30 UTC.", rationale="done"),
    ]
    text = as_text(PromptComposer().render_evaluation(wm, candidates))
    check_golden("autonomous_evaluation.txt", text)
    choice = as_text(PromptComposer().render_evaluation(wm, candidates, mode="choice"))
    check_golden("autonomous_choice.txt", choice)


def test_interactive_prompt_is_pinned() -> None:
    wm = working_memory(
        AgentMode.INTERACTIVE,
        conversation=(
            Turn(role="user", content="Hi, I'm Alice."),
            Turn(role="assistant", content="Hello Alice!"),
            Turn(role="user", content="What time is it?"),
        ),
        observations=OBSERVATIONS,
    )
    check_golden("interactive.txt", as_text(PromptComposer().render(wm)))


@pytest.mark.parametrize("mode", list(AgentMode))
def test_new_blocks_render_empty_unless_populated(mode: AgentMode) -> None:
    composer = PromptComposer()
    bare = working_memory(
        mode, action_space=(), snapshot=MemorySnapshot(query="q", taken_at=WHEN), skills=()
    )
    assert composer.action_space_block(bare) == ""
    assert composer.progress_block(bare) == ""
    assert composer.memory_block(bare.snapshot.recalled) == ""
    text = as_text(composer.render(bare))
    assert "Action space" not in text and "Progress so far" not in text
    assert "Relevant memories" not in text and "\n\n\n" not in text


def test_an_empty_memory_is_said_when_the_agent_could_search_it() -> None:
    empty = MemorySnapshot(query="q", taken_at=WHEN)
    wm = working_memory(AgentMode.AUTONOMOUS, snapshot=empty)  # has memory_search
    assert "Relevant memories: none" in PromptComposer().system_prompt(wm)
    no_search = tuple(t for t in wm.action_space if t.name != "memory_search")
    bare = wm.model_copy(update={"action_space": no_search})
    assert "Relevant memories" not in PromptComposer().system_prompt(bare)


def test_action_space_is_grouped_and_behind_a_setting() -> None:
    wm = working_memory(AgentMode.AUTONOMOUS)
    block = PromptComposer().action_space_block(wm)
    assert block.index("RETRIEVAL") < block.index("LEARNING") < block.index("GROUNDING")
    assert "REASONING" not in block  # no built-in reasoning tool
    assert "- current_time():" in block.split("GROUNDING")[1]
    # The planner writes arguments itself: it sees each tool's parameters and types.
    assert "- remember_fact(subject: string, fact: string):" in block
    assert '- propose_procedural_edit(field: "persona"|"skills", value: string' in block
    # An optional parameter's default is shown (a required one has none to show).
    lookup = ToolSpec(
        name="lookup",
        description="Look a user up.",
        parameters={
            "type": "object",
            "properties": {
                "user": {"type": "integer", "default": 1},
                "database": {"type": "string", "default": "CustomerInfo"},
            },
            "required": ["user"],
        },
    )
    shown = PromptComposer().action_space_block(wm.model_copy(update={"action_space": (lookup,)}))
    assert '- lookup(user: integer, database?: string = "CustomerInfo"):' in shown
    hidden = PromptComposer(show_action_space=False)
    assert hidden.action_space_block(wm) == ""
    assert "Action space" not in as_text(hidden.render(wm))
