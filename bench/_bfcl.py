"""BFCL's single-turn function-calling cases: loading, schema conversion, sampling, checking.

The data ships in the ``bfcl-eval`` wheel (``bfcl_eval/data``): one JSON object a line per
category file (``BFCL_v4_<category>.json``: ``id``, ``question`` (turns of chat messages),
``function`` (the function docs)), and the allowed answers under ``possible_answer/`` (same
``id``; ``ground_truth`` is a list of ``{function name: {parameter: [allowed values]}}``, one
entry per expected call). The package is found with ``importlib.util.find_spec`` and never
imported (its ``__init__`` pulls in its own heavy dependencies).

The checker follows BFCL's AST checker (``bfcl_eval/eval_checker/ast_eval/ast_checker.py``)
in what it accepts, written afresh here:

- the call names the expected function;
- every required parameter is present, no parameter outside the function's doc and the
  possible answer is given, and every parameter of the possible answer that is left out has
  ``""`` (optional) among its allowed values;
- each value has its declared type (``int`` accepted for ``float``, also inside arrays, where
  BFCL's nested check is stricter) or the type of the allowed values, and is among the allowed
  values: strings compared after BFCL's standardisation (lower case; spaces and ``,./-_*^``
  removed; ``'`` read as ``"``), lists element by element (strings standardised), dicts key
  by key (a key may be left out when ``""`` is among its values), lists of dicts in order;
- simple and multiple cases: exactly one call; parallel cases: as many calls as expected,
  matched to the expected calls irrespective of order. BFCL matches greedily (each expected
  call takes the first output that fits); here the matching is a maximum bipartite one, which
  accepts the same answers except where greedy matching would steal an output another
  expected call needed.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CATEGORIES",
    "Call",
    "Case",
    "ToolNames",
    "Verdict",
    "bfcl_data_dir",
    "check_call",
    "check_case",
    "load_cases",
    "sample_cases",
    "to_json_schema",
]

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
"""The non-live single-turn Python categories (live_* are held out: never used here)."""

# BFCL's type names → JSON schema types ("any" has none: every JSON value).
_TYPES = {
    "dict": "object",
    "object": "object",
    "float": "number",
    "number": "number",
    "integer": "integer",
    "int": "integer",
    "string": "string",
    "str": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "tuple": "array",
}
# JSON schema keywords kept from a BFCL doc; the rest ("optional", "format", ...) is BFCL's
# own vocabulary or would constrain one side's grammar beyond what the checker asks.
_KEEP = ("description", "enum", "default", "minimum", "maximum")

# BFCL's Python type of each declared type, for the type check ("any" is a string to BFCL).
_PY_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Case(_Model):
    """One BFCL case with its possible answer."""

    id: str
    category: str
    question: str
    functions: tuple[dict[str, Any], ...]
    answers: tuple[dict[str, dict[str, list[Any]]], ...] = Field(
        description="one {function: {parameter: allowed values}} per expected call"
    )


class Call(_Model):
    """One function call as a model made it, under BFCL's function name."""

    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class Verdict(_Model):
    """The checker's answer for one case."""

    right_function: bool
    correct: bool
    error: str = ""


# --- loading ------------------------------------------------------------------------------


def bfcl_data_dir() -> Path | None:
    """The ``data`` folder of the installed ``bfcl-eval`` package (found, not imported)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "data"
    return path if path.is_dir() else None


def _lines(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def single_turn_cases(
    data_dir: Path, category: str
) -> Iterator[tuple[dict[str, Any], str, list[Any]]]:
    """Each case of the file ``BFCL_v4_<category>.json`` (no category check: the caller
    decides which may be read) as (the raw case, its question: the user messages joined,
    its possible answer), in file order."""
    name = f"BFCL_v4_{category}.json"
    answers = {a["id"]: a["ground_truth"] for a in _lines(data_dir / "possible_answer" / name)}
    for raw in _lines(data_dir / name):
        turns = raw["question"]
        if len(turns) != 1:
            raise ValueError(f"{raw['id']}: expected one turn, got {len(turns)}")
        question = "\n".join(m["content"] for m in turns[0] if m["role"] == "user")
        yield raw, question, answers[raw["id"]]


def load_cases(data_dir: Path, category: str) -> list[Case]:
    """Every case of ``category`` (one of ``CATEGORIES``), in file order."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown or held-out category {category!r} (known: {CATEGORIES})")
    return [
        Case(
            id=raw["id"],
            category=category,
            question=question,
            functions=tuple(raw["function"]),
            answers=tuple(answers),
        )
        for raw, question, answers in single_turn_cases(data_dir, category)
    ]


def sample_cases(cases: Sequence[Case], n: int, seed: int) -> list[Case]:
    """A fixed sample: ``n`` cases drawn with a generator seeded by ``seed`` and the
    category, kept in file order (the same ``seed`` and ``n`` always give the same cases)."""
    if n >= len(cases):
        return list(cases)
    category = cases[0].category if cases else ""
    rng = random.Random(f"{seed}:{category}")
    picked = set(rng.sample(range(len(cases)), n))
    return [c for i, c in enumerate(cases) if i in picked]


# --- schemas and names --------------------------------------------------------------------


def to_json_schema(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL parameter doc as JSON schema: BFCL's types mapped (dict→object, float→number,
    tuple→array, any→no type), objects closed (``additionalProperties: false``, as BFCL
    refuses unexpected parameters), ``required`` kept to declared properties."""
    out: dict[str, Any] = {k: doc[k] for k in _KEEP if k in doc}
    bfcl_type = doc.get("type")
    json_type = _TYPES.get(str(bfcl_type).lower()) if bfcl_type is not None else None
    if json_type is not None:
        out["type"] = json_type
    if json_type == "object" or "properties" in doc:
        props = doc.get("properties") or {}
        out["type"] = "object"
        out["properties"] = {name: to_json_schema(p) for name, p in props.items()}
        required = [r for r in doc.get("required") or [] if r in props]
        if required:
            out["required"] = required
        if props:
            out["additionalProperties"] = False
    if json_type == "array":
        items = doc.get("items")
        if isinstance(items, Mapping):
            out["items"] = to_json_schema(items)
    return out


_INVALID = re.compile(r"[^A-Za-z0-9_-]")


class ToolNames:
    """BFCL function names ↔ tool names that OpenAI's rule ``^[a-zA-Z0-9_-]{1,64}$`` admits:
    other characters (BFCL's dots: ``math.factorial``) become ``_``, and a name that would
    then collide gets a numeric suffix."""

    def __init__(self, bfcl_names: Sequence[str]) -> None:
        self._to_tool: dict[str, str] = {}
        self._to_bfcl: dict[str, str] = {}
        for name in bfcl_names:
            base = _INVALID.sub("_", name)[:60] or "fn"
            tool, n = base, 2
            while tool in self._to_bfcl:
                tool, n = f"{base}_{n}", n + 1
            self._to_tool[name] = tool
            self._to_bfcl[tool] = name

    def tool(self, bfcl_name: str) -> str:
        return self._to_tool[bfcl_name]

    def bfcl(self, tool_name: str) -> str:
        """The BFCL name of ``tool_name``; an unknown name comes back as it is."""
        return self._to_bfcl.get(tool_name, tool_name)


# --- the checker --------------------------------------------------------------------------


def _standard(text: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _std(value: Any) -> Any:
    return _standard(value) if isinstance(value, str) else value


def _answer_type(allowed: Sequence[Any]) -> type | None:
    return next((type(a) for a in allowed if a != ""), None)


def _dict_ok(value: Mapping[str, Any], allowed: Sequence[Any]) -> bool:
    for option in allowed:
        if not isinstance(option, Mapping):
            continue
        if all(
            k in option and _std(v) in [_std(a) for a in option[k]] for k, v in value.items()
        ) and all(k in value or "" in vals for k, vals in option.items()):
            return True
    return False


def _list_dicts_ok(value: Sequence[Any], allowed: Sequence[Any]) -> bool:
    return any(
        isinstance(option, list)
        and len(option) == len(value)
        and all(
            isinstance(v, Mapping) and _dict_ok(v, [o]) for v, o in zip(value, option, strict=True)
        )
        for option in allowed
    )


def _type_ok(value: Any, declared: type, allowed: Sequence[Any]) -> bool:
    return type(value) is declared or type(value) is _answer_type(allowed)


def _value_error(param: str, spec: Mapping[str, Any], value: Any, allowed: list[Any]) -> str:
    """Why ``value`` is not an allowed value of ``param``, or "" when it is."""
    declared_name = str(spec.get("type", "any"))
    declared = _PY_TYPES.get(declared_name, str)
    if declared is float and type(value) is int:
        value = float(value)
    if not _type_ok(value, declared, allowed):
        return f"{param}: type {type(value).__name__}, expected {declared_name}"
    # a value of the answers' type but not the declared one: BFCL's "variable", compared as is
    if type(value) is not declared:
        return "" if value in allowed else f"{param}: {value!r} not in {allowed}"
    if isinstance(value, dict):
        return "" if _dict_ok(value, allowed) else f"{param}: {value!r} not in {allowed}"
    if isinstance(value, list):
        item_name = str((spec.get("items") or {}).get("type", ""))
        if item_name == "dict":
            ok = _list_dicts_ok(value, allowed)
            return "" if ok else f"{param}: {value!r} not in {allowed}"
        item_type = _PY_TYPES.get(item_name)
        if item_type is float:
            value = [float(v) if type(v) is int else v for v in value]
        if item_type is not None and item_name not in ("array", "tuple"):
            for v in value:
                if type(v) is not item_type and not any(
                    isinstance(opt, list) and any(type(v) is type(o) for o in opt)
                    for opt in allowed
                ):
                    return f"{param}: item {v!r} is not {item_name}"
        options = [[_std(o) for o in opt] for opt in allowed if isinstance(opt, list)]
        ok = [_std(v) for v in value] in options
        return "" if ok else f"{param}: {value!r} not in {allowed}"
    if isinstance(value, str):
        ok = _standard(value) in [_standard(a) for a in allowed if isinstance(a, str)]
        return "" if ok else f"{param}: {value!r} not in {allowed} (case-insensitive)"
    return "" if value in allowed else f"{param}: {value!r} not in {allowed}"


def check_call(
    doc: Mapping[str, Any], call: Call, expected: Mapping[str, Mapping[str, Any]]
) -> str:
    """Why ``call`` is not the expected call ``{name: {param: allowed}}`` of the function
    ``doc``, or "" when it is."""
    (name, answer), *_ = expected.items()
    if call.name != name:
        return f"function {call.name!r}, expected {name!r}"
    params = doc.get("parameters", {})
    props: Mapping[str, Any] = params.get("properties") or {}
    for required in params.get("required") or []:
        if required not in call.args:
            return f"missing required parameter {required!r}"
    for param, value in call.args.items():
        if param not in props or param not in answer:
            return f"unexpected parameter {param!r}"
        why = _value_error(param, props[param], value, list(answer[param]))
        if why:
            return why
    for param, allowed in answer.items():
        if param not in call.args and "" not in allowed:
            return f"parameter {param!r} left out but not optional"
    return ""


def _doc(case: Case, name: str) -> Mapping[str, Any]:
    return next((f for f in case.functions if f["name"] == name), {})


def _matching(fits: list[list[bool]]) -> int:
    """The size of a maximum matching of expected calls (rows) to outputs (columns)."""
    owner: dict[int, int] = {}

    def place(row: int, seen: set[int]) -> bool:
        for col, ok in enumerate(fits[row]):
            if ok and col not in seen:
                seen.add(col)
                if col not in owner or place(owner[col], seen):
                    owner[col] = row
                    return True
        return False

    return sum(place(row, set()) for row in range(len(fits)))


def check_case(case: Case, calls: Sequence[Call]) -> Verdict:
    """Score the calls a model made for ``case`` (see the module docstring)."""
    expected_names = sorted(next(iter(a)) for a in case.answers)
    right_function = sorted(c.name for c in calls) == expected_names
    if len(calls) != len(case.answers):
        return Verdict(
            right_function=False,
            correct=False,
            error=f"{len(calls)} calls, expected {len(case.answers)}",
        )
    errors = [
        [check_call(_doc(case, next(iter(answer))), call, answer) for call in calls]
        for answer in case.answers
    ]
    if _matching([[not e for e in row] for row in errors]) == len(case.answers):
        return Verdict(right_function=right_function, correct=True)
    first = next((e for row in errors for e in row if e), "no match")
    return Verdict(right_function=right_function, correct=False, error=first)
