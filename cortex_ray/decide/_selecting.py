"""SELECT: the candidate the evaluation chose, or the argmax of its scores, or the planner's
first; and the notes on a selected candidate (a repeat, values nothing gave).
"""

from __future__ import annotations

import itertools

from cortex_ray._types import Candidate, WorkingMemory
from cortex_ray.perceive import repeat_of

__all__ = ["no_judgement", "repeats_in_a_row", "select", "unsupported_note"]


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


def unsupported_note(c: Candidate) -> str:
    """Why a selected candidate's values are suspect: nothing gave them."""
    what = "the answer's" if c.kind == "finish" else f"{c.tool}'s"
    return f"{what} {', '.join(c.unsupported)} appear in no result, memory or the goal"


def repeats_in_a_row(wm: WorkingMemory) -> int:
    """How many of the latest observations, in a row, repeat a call made before them."""
    count = 0
    for i in range(len(wm.observations) - 1, -1, -1):
        o = wm.observations[i]
        if repeat_of(wm.observations[:i], o.tool, o.args) is None:
            break
        count += 1
    return count


def select(
    selectable: list[Candidate], scores: dict[int, float], *, choice: bool
) -> tuple[Candidate, str | None]:
    """The selected candidate among two or more, and the step note that says why (None for
    a plain argmax).

    Args:
        selectable: The candidates the evaluation saw, in proposal order.
        scores: Candidate index → score; empty when the evaluation failed.
        choice: The evaluation chose one (it scores 10, the others 0).
    """
    if choice and scores:
        chosen = next(c for c in selectable if scores[c.index] == 10.0)
        return chosen, f"chosen by the evaluation among {len(selectable)}"
    if scores and (why := no_judgement([scores[c.index] for c in selectable])):
        return selectable[0], f"{why}: not used, kept the planner's order"
    if scores:
        # argmax; ties go to the earlier proposal (max keeps the first maximum).
        chosen = max(selectable, key=lambda c: scores[c.index])
        return chosen, None
    return selectable[0], None
