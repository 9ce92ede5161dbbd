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


# --- the whole import graph ----------------------------------------------------------------

ROOT = CORE.parent
LAYERS = ("cortex_ray", "actors", "serve", "jobs")
ALLOWED = {
    "cortex_ray": set(),
    "actors": {"cortex_ray"},
    "serve": {"cortex_ray", "actors"},
    "jobs": {"cortex_ray", "actors"},
}
"""Which folder may import which: the core none; the Ray layer the core (serve also the
actors it drives, jobs the Ray metrics sink in actors); jobs never serve."""


def _imports(package: str) -> list[tuple[Path, str]]:
    """Every absolute module a package's files import (also inside functions)."""
    found = []
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(path, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((path, node.module))
    return found


def test_folders_import_only_downwards() -> None:
    offenders = []
    for package in LAYERS:
        for path, module in _imports(package):
            top = module.split(".")[0]
            if top in LAYERS and top != package and top not in ALLOWED[package]:
                offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert offenders == []


def test_the_folder_graph_has_no_cycle() -> None:
    edges = {package: set() for package in LAYERS}
    for package in LAYERS:
        for _, module in _imports(package):
            top = module.split(".")[0]
            if top in LAYERS and top != package:
                edges[package].add(top)

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
            for nxt in edges[start]
        )

    assert [p for p in LAYERS if reaches(p, p)] == []


def test_no_private_module_of_the_core_is_imported_from_outside() -> None:
    offenders = []
    for package in ("actors", "serve", "jobs"):
        for path, module in _imports(package):
            parts = module.split(".")
            if parts[0] == "cortex_ray" and any(p.startswith("_") for p in parts[1:]):
                offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert offenders == []


def test_the_served_backend_is_registered_by_entry_point_not_by_import() -> None:
    """The core opens ``model_backend=served`` without importing the Ray layer: the
    installed distribution advertises it in the ``cortex_ray.backends`` group."""
    from importlib.metadata import entry_points

    from cortex_ray.models import ENTRY_POINT_GROUP

    served = [e for e in entry_points(group=ENTRY_POINT_GROUP) if e.name == "served"]
    assert [e.value for e in served] == ["serve.models._handles:SERVED_BACKEND"]
