"""The fast tier: tests of use cases and pure logic through the in-memory fakes of the store
protocols (``tests/fakes/``), with no PostgreSQL, Ray or model.

Every test in this folder is marked ``unit`` (``pytest -m unit`` runs the tier: this folder,
the modules elsewhere marked ``pytestmark = pytest.mark.unit``, and the fake variant of
``tests/test_store_contract.py``), and a test here that asks for a fixture that starts
PostgreSQL, Ray or a model fails at once. A use-case service is built on the fakes with the
real gate (``gate``: the real ``AccessControlService``, auditing into ``fake_store``), as
``tests/unit/test_agent_use_cases.py`` does; a test that only needs the store takes the fakes::

    async def test_a_revoked_key_is_refused(fake_store: FakeStore) -> None:
        key, key_id = await fake_store.create_api_key(Principal(id="ci", org_id="acme"))
        ...
        assert [r["tool"] for r in fake_store.audit] == [...]
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeDatabase, FakeStore, FakeTransaction

from cortex_ray.access import AccessControlService
from cortex_ray.act import ToolRegistry, builtin_tools
from cortex_ray.runtime import AccessGate

_HERE = Path(__file__).parent

HEAVY_FIXTURES = frozenset(
    {
        "db",
        "store",
        "scratch_database",
        "scripted_runtime",
        "ray_cluster",
        "minilm",
        "smollm2",
    }
)
"""The shared fixtures that start PostgreSQL, Ray or a model (tests/conftest.py)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _nothing_heavy(request: pytest.FixtureRequest) -> None:
    heavy = sorted(HEAVY_FIXTURES.intersection(request.fixturenames))
    if heavy:
        pytest.fail(f"a unit test may not use {', '.join(heavy)}: use the fakes", pytrace=False)


@pytest.fixture
def fake_db() -> FakeDatabase:
    return FakeDatabase()


@pytest.fixture
def fake_store(fake_db: FakeDatabase) -> FakeStore:
    return FakeStore(fake_db)


@pytest.fixture
def gate(fake_store: FakeStore) -> AccessGate[FakeTransaction]:
    """The real gate (the real ``AccessControlService``), auditing into the fake store."""
    return AccessGate(fake_store, ToolRegistry(builtin_tools()), AccessControlService())
