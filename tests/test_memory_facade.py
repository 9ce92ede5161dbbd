"""MemoryService is a façade over its parts: each delegation keeps its part's signature."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from cortex_ray.memory import MemoryService
from cortex_ray.memory._facts import SemanticFacts
from cortex_ray.memory._prepare import MemoryPreparer
from cortex_ray.memory._procedural import ProceduralEdits
from cortex_ray.memory._snapshot import MemoryRecall
from cortex_ray.memory._writes import MemoryWriter

pytestmark = pytest.mark.unit

PARTS: dict[str, type] = {
    "prepare": MemoryPreparer,
    "prepare_many": MemoryPreparer,
    "write_prepared": MemoryWriter,
    "insert_prepared": MemoryWriter,
    "write": MemoryWriter,
    "recall": MemoryRecall,
    "snapshot": MemoryRecall,
    "history": SemanticFacts,
    "facts": SemanticFacts,
    "extract_facts": SemanticFacts,
    "propose_edit": ProceduralEdits,
    "decide_proposal": ProceduralEdits,
    "proposals": ProceduralEdits,
}


def public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    return {n: f for n, f in vars(cls).items() if callable(f) and not n.startswith("_")}


def test_every_public_method_is_a_part_or_the_lifecycle() -> None:
    assert set(public_methods(MemoryService)) == {*PARTS, "aclose", "rescored"}


@pytest.mark.parametrize("name", sorted(PARTS))
def test_a_delegation_has_its_parts_signature(name: str) -> None:
    facade = inspect.signature(getattr(MemoryService, name))
    part = inspect.signature(getattr(PARTS[name], name))
    assert facade == part
    assert inspect.iscoroutinefunction(getattr(MemoryService, name))
