"""The planner's parsing rules, without a database or a model."""

from __future__ import annotations

import jsonschema
import pytest

from cortex_ray import ActionType, Candidate, ToolSpec
from cortex_ray.decide._evaluating import parse_scores, score_schema
from cortex_ray.decide._proposals import RATIONALE_CHARS, parse_candidates, proposal_schema

pytestmark = pytest.mark.unit

SEARCH = ToolSpec(
    name="memory_search",
    description="search",
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string", "minLength": 1}},
        "required": ["query"],
        "additionalProperties": False,
    },
    action_type=ActionType.RETRIEVAL,
)


def test_proposal_schema_admits_only_known_tools_their_args_or_a_finish() -> None:
    schema = proposal_schema((SEARCH,), 2)
    ok = {
        "candidates": [
            {"tool": "memory_search", "args": {"query": "x"}, "rationale": "r"},
            {"finish": True, "message": "done", "rationale": "r"},
        ]
    }
    jsonschema.validate(ok, schema)
    for bad in (
        {"candidates": [{"tool": "rm", "args": {}, "rationale": "r"}]},
        {"candidates": [{"tool": "memory_search", "args": {}, "rationale": "r"}]},
        {
            "candidates": [
                {"finish": True, "message": "m", "rationale": "r" * (RATIONALE_CHARS + 1)}
            ]
        },
        {"candidates": []},
        {"candidates": [ok["candidates"][0]] * 3},  # more than k
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_parse_candidates_marks_invalid_ones_and_rejects_all_invalid() -> None:
    parsed = parse_candidates(
        {
            "candidates": [
                {"tool": "nope", "args": {}},
                {"tool": "memory_search", "args": {"query": "q"}},
            ]
        },
        (SEARCH,),
        3,
    )
    assert [c.valid for c in parsed] == [False, True]
    with pytest.raises(ValueError, match="no valid candidate"):
        parse_candidates({"candidates": [{"finish": True, "message": " "}]}, (SEARCH,), 3)
    with pytest.raises(ValueError, match="expected"):
        parse_candidates(["not", "an", "object"], (SEARCH,), 3)


def test_scores_are_positional_one_per_listed_candidate() -> None:
    listed = [
        Candidate(index=0, kind="finish", message="a"),
        Candidate(index=2, kind="finish", message="b"),
    ]
    assert parse_scores({"scores": [3, 11]}, listed) == {0: 3.0, 2: 10.0}  # clamped to 0..10
    with pytest.raises(ValueError, match="expected 2 scores"):
        parse_scores({"scores": [3]}, listed)
    with pytest.raises(ValueError, match="not a number"):
        parse_scores({"scores": [3, True]}, listed)
    jsonschema.validate({"scores": [1, 2]}, score_schema(2))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"scores": [1, 2, 3]}, score_schema(2))
