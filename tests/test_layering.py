"""The import graph keeps its contracts (import-linter: layers, no circle, no reach into
another package's private module, the core imports no Ray), and the public surface is
complete."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import grimp

import cortex_ray
from scripts.import_contracts import PrivateModulesContract, owner_of

CORE = Path(cortex_ray.__file__).parent


def test_all_is_sorted_and_complete() -> None:
    public = {
        name
        for name, value in vars(cortex_ray).items()
        if not name.startswith("_") and not isinstance(value, type(cortex_ray))
    }
    assert set(cortex_ray.__all__) == public

    # ruff's RUF022 order: constants, then classes, then functions, each alphabetical
    def kind(name: str) -> int:
        return 0 if name.isupper() else 1 if name[0].isupper() else 2

    assert list(cortex_ray.__all__) == sorted(cortex_ray.__all__, key=lambda n: (kind(n), n))


def test_every_subpackage_declares_its_all() -> None:
    for info in pkgutil.iter_modules(cortex_ray.__path__):
        if info.name.startswith("_") or not info.ispkg:
            continue
        module = importlib.import_module(f"cortex_ray.{info.name}")
        assert hasattr(module, "__all__"), info.name
        for name in module.__all__:
            assert hasattr(module, name), f"cortex_ray.{info.name}.{name}"


# --- the import graph: import-linter's contracts (pyproject.toml) --------------------------

ROOT = CORE.parent
CONTRACTS = {
    "The core imports no Ray",
    "The core imports none of the layers built on it",
    "Session actors import neither the API nor the jobs",
    "Jobs never import the API",
    "The Ray layer: the API and the jobs above the session actors, above the core",
    "The core's layers",
    "The API's routers share one dependencies module and never import the app",
    "No import circle anywhere (between the children of any package, at any depth)",
    "No package imports another package's private module",
}


def test_the_import_contracts_are_kept() -> None:
    """The layers, the absence of circles and private-module privacy are import-linter
    contracts (``./dev check`` runs them too); this runs the same check with the tests."""
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    kept = {line.removesuffix(" KEPT") for line in result.stdout.splitlines()}
    assert kept >= CONTRACTS, "a contract is missing from pyproject.toml"


def test_the_private_module_contract_names_the_owner() -> None:
    assert owner_of("cortex_ray.memory._service") == "cortex_ray.memory"
    assert owner_of("serve._deps") == "serve"
    assert owner_of("cortex_ray._types") == "cortex_ray"
    assert owner_of("cortex_ray.memory") is None
    assert owner_of("cortex_ray.__main__") is None


def test_the_private_module_contract_breaks_on_a_reach_into_another_package() -> None:
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.a._impl", "pkg.b", "pkg.a.inner"):
        graph.add_module(module)
    graph.add_import(
        importer="pkg.a.inner", imported="pkg.a._impl", line_number=1, line_contents=""
    )
    contract = PrivateModulesContract("t", {}, {"root_packages": ["pkg"]})
    assert contract.check(graph, verbose=False).kept
    graph.add_import(importer="pkg.b", imported="pkg.a._impl", line_number=3, line_contents="")
    check = contract.check(graph, verbose=False)
    assert not check.kept
    assert check.metadata["offences"] == [
        {"importer": "pkg.b", "imported": "pkg.a._impl", "lines": [3]}
    ]


def test_the_served_backend_is_registered_by_entry_point_not_by_import() -> None:
    """The core opens ``model_backend=served`` without importing the Ray layer: the
    installed distribution advertises it in the ``cortex_ray.backends`` group."""
    from importlib.metadata import entry_points

    from cortex_ray.models import ENTRY_POINT_GROUP

    served = [e for e in entry_points(group=ENTRY_POINT_GROUP) if e.name == "served"]
    assert [e.value for e in served] == ["serve.models._handles:SERVED_BACKEND"]
