"""The portable core imports no Ray module, and its public surface is complete."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import cortex_ray

CORE = Path(cortex_ray.__file__).parent


def test_core_imports_no_ray() -> None:
    offenders = []
    for path in CORE.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path}: {n}" for n in names if n == "ray" or n.startswith("ray.")]
    assert offenders == []


def test_all_is_sorted_and_complete() -> None:
    public = {
        name
        for name, value in vars(cortex_ray).items()
        if not name.startswith("_") and not isinstance(value, type(cortex_ray))
    }
    assert set(cortex_ray.__all__) == public
    assert list(cortex_ray.__all__) == sorted(cortex_ray.__all__, key=str)


def test_every_subpackage_declares_its_all() -> None:
    for info in pkgutil.iter_modules(cortex_ray.__path__):
        if info.name.startswith("_") or not info.ispkg:
            continue
        module = importlib.import_module(f"cortex_ray.{info.name}")
        assert hasattr(module, "__all__"), info.name
        for name in module.__all__:
            assert hasattr(module, name), f"cortex_ray.{info.name}.{name}"
