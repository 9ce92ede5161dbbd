"""BFCL's multi-turn cases (``multi_turn_base``) with their runnable tool classes.

A case is a conversation of user requests against stateful tools (a file system, a trading
bot, a travel API, ...), whose classes ship in the ``bfcl-eval`` wheel
(``bfcl_eval/eval_checker/multi_turn_eval/func_source_code``; standard library only for the
classes this category uses, so they import without bfcl-eval's dependencies). The possible
answer is, per turn, the calls that do it, as Python source (``cd(folder='document')``).

Checked as BFCL's multi-turn checker does, re-implemented: after each turn, the public
attributes of every tool instance the model drove must equal those of instances that ran
the possible answer's calls from the same initial state, and each result the possible answer's
calls returned in that turn must be among the results of the model's calls so far. The
possible answer's calls are parsed with ``ast`` (literal arguments only), never evaluated.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["CLASS_MODULES", "MultiTurnCase", "ToolEnv", "func_docs", "load_multi_turn"]

_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"

CLASS_MODULES = {
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": ("math_api", "math_api.json"),
    "MessageAPI": ("message_api", "message_api.json"),
    "TwitterAPI": ("posting_api", "posting_api.json"),
    "TicketAPI": ("ticket_api", "ticket_api.json"),
    "TradingBot": ("trading_bot", "trading_bot.json"),
    "TravelAPI": ("travel_booking", "travel_booking.json"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control.json"),
}
"""The classes of ``multi_turn_base``: their module and their function-doc file."""

_STATELESS = frozenset({"MathAPI"})
ERROR_PREFIX = "Error during execution: "


class MultiTurnCase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    turns: tuple[str, ...]
    initial_config: dict[str, Any]
    classes: tuple[str, ...]
    excluded: tuple[str, ...] = ()
    answers: tuple[tuple[str, ...], ...]


def _lines(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_multi_turn(data_dir: Path) -> list[MultiTurnCase]:
    name = "BFCL_v4_multi_turn_base.json"
    answers = {a["id"]: a["ground_truth"] for a in _lines(data_dir / "possible_answer" / name)}
    return [
        MultiTurnCase(
            id=raw["id"],
            turns=tuple(
                "\n".join(m["content"] for m in turn if m["role"] == "user")
                for turn in raw["question"]
            ),
            initial_config=raw.get("initial_config") or {},
            classes=tuple(raw["involved_classes"]),
            excluded=tuple(raw.get("excluded_function") or ()),
            answers=tuple(tuple(t) for t in answers[raw["id"]]),
        )
        for raw in _lines(data_dir / name)
    ]


def func_docs(data_dir: Path, case: MultiTurnCase) -> list[dict[str, Any]]:
    """The function docs the model is given: its classes' functions but the excluded ones."""
    docs = []
    for cls in case.classes:
        for doc in _lines(data_dir / "multi_turn_func_doc" / CLASS_MODULES[cls][1]):
            if doc["name"] not in case.excluded:
                docs.append({k: v for k, v in doc.items() if k != "response"})
    return docs


def _text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


class ToolEnv:
    """The tool instances of one case, loaded with its initial state."""

    def __init__(self, case: MultiTurnCase) -> None:
        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Callable[..., Any]] = {}
        for cls in case.classes:
            module = importlib.import_module(f"{_PACKAGE}.{CLASS_MODULES[cls][0]}")
            instance = getattr(module, cls)()
            if cls not in _STATELESS:
                config = copy.deepcopy(case.initial_config.get(cls, {}))
                instance._load_scenario(config, long_context=False)
            self.instances[cls] = instance
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = method

    def call(self, name: str, args: dict[str, Any], positional: Sequence[Any] = ()) -> str:
        """Run one call; a failure is its result, as BFCL records it."""
        method = self.methods.get(name)
        if method is None:
            return f"{ERROR_PREFIX}no function {name!r}"
        try:
            return _text(method(*positional, **args))
        except Exception as exc:  # a tool's failure is what the model sees
            return f"{ERROR_PREFIX}{exc}"

    def run_source(self, source: str) -> str:
        """Run a possible answer's call, written as Python source with literal arguments."""
        node = ast.parse(source.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise ValueError(f"not a plain call: {source}")
        positional = [ast.literal_eval(a) for a in node.args]
        args = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
        return self.call(node.func.id, args, positional)

    def state_difference(self, expected: ToolEnv) -> str:
        """The first public attribute whose value differs from ``expected``'s, or ""."""
        for cls, want in expected.instances.items():
            got = self.instances[cls]
            for attr, value in vars(want).items():
                if attr.startswith("_"):
                    continue
                if getattr(got, attr, None) != value:
                    return f"{cls}.{attr} differs"
        return ""


def responses_missing(expected: Sequence[str], made: Sequence[str]) -> list[str]:
    """The expected results not among the results made (each made result used once)."""
    left = Counter(made)
    missing = []
    for result in expected:
        if left[result] > 0:
            left[result] -= 1
        else:
            missing.append(result)
    return missing
