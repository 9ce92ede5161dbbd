"""The agent benchmark (bench/agent_eval.py): BFCL's checker rules, the schema conversion, and
one real run of ``single`` through the planner and the baseline on the fast test model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from bench_modules import load_bench

from cortex_ray.models import TEST_MODEL_NAME

ROOT = Path(__file__).resolve().parents[1]


bfcl = load_bench("_bfcl")

TRIANGLE: dict[str, Any] = {
    "name": "geometry.triangle_area",
    "description": "Area of a triangle.",
    "parameters": {
        "type": "dict",
        "properties": {
            "base": {"type": "integer", "description": "base"},
            "height": {"type": "float", "description": "height"},
            "unit": {"type": "string", "description": "unit", "optional": True},
            "corners": {"type": "tuple", "items": {"type": "string"}},
            "meta": {"type": "dict", "properties": {"who": {"type": "string"}}},
            "anything": {"type": "any"},
        },
        "required": ["base", "height"],
    },
}
TRIANGLE_ANSWER: dict[str, Any] = {
    "geometry.triangle_area": {
        "base": [10],
        "height": [5.0],
        "unit": ["units", ""],
        "corners": [["A", "B", "C"], ""],
        "meta": [{"who": ["Ada Lovelace"]}, ""],
    }
}
WEATHER: dict[str, Any] = {
    "name": "weather.get",
    "description": "The weather in a city.",
    "parameters": {
        "type": "dict",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}


def case(category: str, functions: list[dict[str, Any]], answers: list[dict[str, Any]]) -> Any:
    return bfcl.Case(
        id=f"{category}_0",
        category=category,
        question="?",
        functions=tuple(functions),
        answers=tuple(answers),
    )


def call(name: str, **args: Any) -> Any:
    return bfcl.Call(name=name, args=args)


# --- schema conversion and names ----------------------------------------------------------


def test_bfcl_types_become_json_schema() -> None:
    doc = {**TRIANGLE["parameters"], "required": ["base", "height", "not_declared"]}
    schema = bfcl.to_json_schema(doc)
    assert schema["type"] == "object"
    props = schema["properties"]
    assert props["base"]["type"] == "integer"
    assert props["height"]["type"] == "number"
    assert props["corners"] == {"type": "array", "items": {"type": "string"}}
    assert props["meta"]["type"] == "object" and props["meta"]["properties"]["who"] == {
        "type": "string"
    }
    assert "type" not in props["anything"]  # any: every JSON value
    assert "optional" not in props["unit"]  # BFCL's own key, not JSON schema
    assert schema["required"] == ["base", "height"]  # only declared properties
    assert schema["additionalProperties"] is False
    validator = jsonschema.Draft202012Validator(schema)
    validator.check_schema(schema)
    assert validator.is_valid({"base": 10, "height": 5, "anything": [1, {"x": None}]})
    assert not validator.is_valid({"base": 10, "height": "5"})
    assert not validator.is_valid({"base": 10, "height": 5, "colour": "red"})


def test_dotted_names_map_to_valid_tool_names_and_back() -> None:
    names = bfcl.ToolNames(["math.factorial", "math_factorial", "a b/c"])
    tools = [names.tool("math.factorial"), names.tool("math_factorial"), names.tool("a b/c")]
    assert tools[0] == "math_factorial"
    assert len(set(tools)) == 3  # a collision gets a suffix
    for tool in tools:
        assert all(ch.isalnum() or ch in "_-" for ch in tool)
    assert [names.bfcl(t) for t in tools] == ["math.factorial", "math_factorial", "a b/c"]


# --- the checker --------------------------------------------------------------------------


def simple(*calls: Any) -> Any:
    return bfcl.check_case(case("simple_python", [TRIANGLE], [TRIANGLE_ANSWER]), calls)


def test_right_call_is_right_with_bfcl_normalisations() -> None:
    verdict = simple(
        call(
            "geometry.triangle_area",
            base=10,
            height=5,  # int accepted for float
            unit="Units",  # strings: case-insensitive
            corners=["a", "b", "c"],
            meta={"who": "ada lovelace"},
        )
    )
    assert verdict.correct and verdict.right_function, verdict.error
    # optional parameters ("" allowed) may be left out
    assert simple(call("geometry.triangle_area", base=10, height=5.0)).correct


def test_wrong_function_is_wrong() -> None:
    verdict = simple(call("geometry.square_area", base=10, height=5.0))
    assert not verdict.correct and not verdict.right_function
    assert "expected 'geometry.triangle_area'" in verdict.error


def test_missing_required_argument_is_wrong() -> None:
    verdict = simple(call("geometry.triangle_area", base=10))
    assert not verdict.correct and verdict.right_function
    assert "missing required parameter 'height'" in verdict.error


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({"base": 11, "height": 5.0}, "base"),
        ({"base": 10.0, "height": 5.0}, "type float"),  # a float is not an integer
        ({"base": 10, "height": 5.0, "unit": "cm"}, "unit"),
        ({"base": 10, "height": 5.0, "corners": ["A", "C", "B"]}, "corners"),
        ({"base": 10, "height": 5.0, "meta": {"who": "Babbage"}}, "meta"),
        ({"base": 10, "height": 5.0, "colour": "red"}, "unexpected parameter 'colour'"),
    ],
)
def test_value_not_allowed_is_wrong(args: dict[str, Any], why: str) -> None:
    verdict = simple(bfcl.Call(name="geometry.triangle_area", args=args))
    assert not verdict.correct and verdict.right_function
    assert why in verdict.error


def test_leaving_out_a_parameter_that_is_not_optional_is_wrong() -> None:
    answer = {"weather.get": {"city": ["Paris"], "days": [3]}}
    verdict = bfcl.check_case(
        case("simple_python", [WEATHER], [answer]), [call("weather.get", city="Paris")]
    )
    assert not verdict.correct and "'days' left out" in verdict.error


def test_multiple_needs_one_call_of_the_expected_function() -> None:
    answer = {"weather.get": {"city": ["Paris", "Paris, France"], "days": ["", 1]}}
    multiple = case("multiple", [TRIANGLE, WEATHER], [answer])
    assert bfcl.check_case(multiple, [call("weather.get", city="paris, france")]).correct
    assert not bfcl.check_case(multiple, [call("geometry.triangle_area", base=1, height=2)]).correct
    two = [call("weather.get", city="Paris"), call("weather.get", city="Paris")]
    assert not bfcl.check_case(multiple, two).correct
    assert not bfcl.check_case(multiple, []).correct


def parallel_case() -> Any:
    answers: list[dict[str, Any]] = [
        {"weather.get": {"city": ["Paris"], "days": [""]}},
        {"weather.get": {"city": ["Rome"], "days": [2]}},
        {"geometry.triangle_area": {"base": [1], "height": [2.0]}},
    ]
    return case("parallel_multiple", [WEATHER, TRIANGLE], answers)


def test_parallel_calls_in_any_order_are_right() -> None:
    calls = [
        call("geometry.triangle_area", base=1, height=2),
        call("weather.get", city="Rome", days=2),
        call("weather.get", city="Paris"),
    ]
    assert bfcl.check_case(parallel_case(), calls).correct
    assert bfcl.check_case(parallel_case(), list(reversed(calls))).correct


def test_parallel_matching_is_not_greedy() -> None:
    # the first expected call fits both outputs; only one assignment fits both expected calls
    answers = [
        {"weather.get": {"city": ["Paris"], "days": ["", 2]}},
        {"weather.get": {"city": ["Paris"], "days": [2]}},
    ]
    calls = [call("weather.get", city="Paris", days=2), call("weather.get", city="Paris")]
    assert bfcl.check_case(case("parallel", [WEATHER], answers), calls).correct


def test_parallel_with_a_call_missing_or_wrong_is_wrong() -> None:
    paris, rome = call("weather.get", city="Paris"), call("weather.get", city="Rome", days=2)
    triangle = call("geometry.triangle_area", base=1, height=2)
    missing = bfcl.check_case(parallel_case(), [paris, rome])
    assert not missing.correct and not missing.right_function
    assert "2 calls, expected 3" in missing.error
    repeated = bfcl.check_case(parallel_case(), [paris, paris, triangle])
    assert not repeated.correct and repeated.right_function  # right names, one value wrong


def test_sample_is_fixed_by_the_seed() -> None:
    cases = [case("parallel", [WEATHER], [{"weather.get": {"city": [str(i)]}}]) for i in range(50)]
    cases = [c.model_copy(update={"id": f"parallel_{i}"}) for i, c in enumerate(cases)]
    first = [c.id for c in bfcl.sample_cases(cases, 5, seed=1)]
    assert first == [c.id for c in bfcl.sample_cases(cases, 5, seed=1)]
    assert first != [c.id for c in bfcl.sample_cases(cases, 5, seed=2)]
    assert first == sorted(first, key=lambda i: int(i.split("_")[1]))  # file order
    assert len(bfcl.sample_cases(cases, 500, seed=1)) == 50


# --- the real data and the real path ------------------------------------------------------

DATA = bfcl.bfcl_data_dir()
needs_data = pytest.mark.skipif(
    DATA is None,
    reason="no BFCL data: pip install --no-deps bfcl-eval==2026.3.23 (./dev setup does)",
)


UNREACHABLE = {"simple_python_307", "parallel_152", "parallel_multiple_21", "parallel_multiple_94"}


def _given(allowed: list[Any]) -> bool:
    return any(v != "" for v in allowed)


def _first(allowed: list[Any]) -> Any:
    """A value from an allowed-values list; a dict's (or a list of dicts') own values are
    allowed-values lists too."""
    value = next(v for v in allowed if v != "")
    if isinstance(value, dict):
        return {k: _first(v) for k, v in value.items() if _given(v)}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [{k: _first(x) for k, x in v.items() if _given(x)} for v in value]
    return value


@needs_data
def test_every_non_live_case_converts_and_its_answer_checks_right() -> None:
    """The checker accepts a call built from each case's possible answer (its first allowed
    value, optional parameters left out), and the converted schemas are valid JSON schema
    that admit that call (but for four cases): the conversion and the checker agree with
    BFCL's data."""
    assert DATA is not None
    refused: list[str] = []
    for category in bfcl.CATEGORIES:
        cases = bfcl.load_cases(DATA, category)
        assert cases, category
        for c in cases:
            calls = []
            for answer in c.answers:
                (name, params), *_ = answer.items()
                doc = next(f for f in c.functions if f["name"] == name)
                declared = doc["parameters"]["properties"]
                # (a few answers list an optional parameter the function does not have)
                args = {p: _first(v) for p, v in params.items() if _given(v) and p in declared}
                calls.append(bfcl.Call(name=name, args=args))
                schema = bfcl.to_json_schema(doc["parameters"])
                jsonschema.Draft202012Validator.check_schema(schema)
                if not jsonschema.Draft202012Validator(schema).is_valid(args):
                    refused.append(c.id)
            verdict = bfcl.check_case(c, calls)
            assert verdict.correct, (c.id, verdict.error)
    # BFCL answers whose type is not the declared one (venue: string, answer True): BFCL
    # accepts such a value as a "variable"; a call checked against the schema cannot make it
    assert set(refused) == UNREACHABLE


@needs_data
@pytest.mark.integration
@pytest.mark.timeout(1200)  # 3 cases, about 30 s on 2 idle cores; several times that when busy
def test_single_runs_the_planner_and_the_baseline_on_real_cases(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORTEX_")}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "agent_eval.py"),
            "single",
            "--model",
            TEST_MODEL_NAME,
            # one case per category: each category's path runs (a second proves nothing more)
            "--n",
            "1",
            "--categories",
            "simple_python,multiple,parallel",
            "--max-tokens",
            "128",
            "--json",
            str(out),
        ],
        env={**env, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["model"] == TEST_MODEL_NAME
    assert len(report["cases"]) == 3
    assert {c["category"] for c in report["cases"]} == {"simple_python", "multiple", "parallel"}
    for c in report["cases"]:
        assert c["steps"], c["id"]  # the planner decided at least once
        steps = len(c["steps"])
        assert (
            steps == 1 if c["category"] != "parallel" else 1 <= steps <= 1 + len(c["ours"]["calls"])
        )
        for side in ("ours", "baseline"):
            assert c[side]["seconds"] > 0
            assert c[side]["no_call"] == (not c[side]["calls"])
    for category in ("simple_python", "multiple", "parallel", "all"):
        row = report["summary"][category]
        assert row["cases"] == (3 if category == "all" else 1)
        for side in ("ours", "baseline"):
            for key in ("right_function_pct", "fully_right_pct", "no_call_pct"):
                assert 0 <= row[side][key] <= 100
        assert row["planner"]["decisions"] >= row["cases"]
    assert "| simple_python | 1 | ours |" in proc.stdout


# --- multi-turn: the tool classes and the state check -------------------------------------


@needs_data
def test_multi_turn_answers_replay_to_the_same_state_and_a_wrong_run_differs() -> None:
    assert DATA is not None
    mt = load_bench("_multiturn")
    cases = {c.id: c for c in mt.load_multi_turn(DATA)}
    assert len(cases) == 200
    case = cases["multi_turn_base_0"]
    assert "cp" not in {d["name"] for d in mt.func_docs(DATA, case)}  # excluded_function
    first, second, idle = mt.ToolEnv(case), mt.ToolEnv(case), mt.ToolEnv(case)
    for turn in case.answers:
        results = [first.run_source(src) for src in turn]
        again = [second.run_source(src) for src in turn]
        assert results == again
        assert not second.state_difference(first)
        assert mt.responses_missing(results, again) == []
    assert idle.state_difference(first)  # doing nothing is not the same end state
    # a failing call is a result the model sees, never an exception
    wrong = mt.ToolEnv(case)
    assert "No such file or directory" in wrong.call("cd", {"folder": "no such folder"})
    assert wrong.call("cd", {"nope": 1}).startswith(mt.ERROR_PREFIX)
    assert wrong.call("rm_rf_everything", {}).startswith(mt.ERROR_PREFIX)


def test_possible_answer_calls_are_parsed_not_evaluated() -> None:
    mt = load_bench("_multiturn")
    env = mt.ToolEnv(mt.MultiTurnCase(id="x", turns=(), initial_config={}, classes=(), answers=()))
    for source in ("__import__('os').system('true')", "cd(folder=open('/etc/passwd'))", "x.y()"):
        with pytest.raises(ValueError):
            env.run_source(source)
    assert mt.responses_missing(["a", "b", "b"], ["b", "a", "c"]) == ["b"]
