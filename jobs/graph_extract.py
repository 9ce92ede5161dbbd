"""The model-based graph extractor: ``python -m jobs.graph_extract --org ORG [--collection C]``.

Optional and off by default: nothing runs it unless it is submitted (no ingestion, route or
schedule starts it). It reads the passages of published source versions (of a collection,
of ``--source`` ids, numbered ``--since-version`` or later), asks the chat model the
settings name (``CORTEX_MODEL_BACKEND``: ``served`` is the Ray Serve deployment, ``local``
the packaged GGUF in each actor, ``openai`` an endpoint) for entities and relationships
under a JSON schema, batches of passages per call, and writes the facts whose evidence is
verbatim in their passage (``cortex_ray.graph``'s model extractor) through the graph
writer, method ``model``, one transaction per source version.

On Ray: the versions are a Ray Data dataset; ``map_batches`` hands them to a pool of
``ModelExtractor`` actors (``--actors``), each opening the model once (from the driver's
settings, shipped to it: a joined cluster's workers do not have the job's environment) and
keeping ``--in-flight`` calls going. Submit it like the other jobs:
``ray job submit --working-dir . -- python -m jobs.graph_extract --org acme --collection
handbook``. Idempotent per (source version, extractor version): a version already in the
ledger (``graph_extracted_versions``) is skipped, so a rerun asks nothing and writes nothing
twice; a run that fails leaves the versions it finished recorded, and a rerun does the rest.

Prints one JSON report on stdout. Exit codes: 0 done, 1 a configuration, model or storage
error, 2 invalid arguments.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import pyarrow as pa
import typer

from cortex_ray import (
    CortexError,
    InvalidRequestError,
    Settings,
    load_settings,
    stop_on_signals,
)
from cortex_ray.graph import (
    MODEL,
    BatchOutcome,
    ExtractActors,
    ExtractAddress,
    ExtractBatch,
    ExtractCollection,
    ExtractDatabaseUrl,
    ExtractInFlight,
    ExtractModelVersion,
    ExtractNumGpus,
    ExtractOrg,
    ExtractRequest,
    ExtractSinceVersion,
    ExtractSources,
    GraphWriter,
    PublishedVersion,
    extract_batch,
    model_method_version,
    plan_batches,
)
from cortex_ray.models import BACKGROUND_PRIORITY, ModelClient, open_models, waiting_until
from jobs._entry import EXIT_INVALID, fail, job_default, job_options, job_settings, run_job

__all__ = ["ExtractOptions", "ModelExtractReport", "ModelExtractor", "main", "run_model_extraction"]

log = logging.getLogger("cortex_ray.jobs.graph_extract")

_COUNTS = ("passages", "calls", "invalid_outputs", "invalid_facts", "unsupported", "found")


@dataclass(frozen=True)
class ExtractOptions:
    """How the extractor asks (picklable: shipped to every actor)."""

    batch_passages: int = job_default("graph_model_batch")
    batch_chars: int = job_default("graph_model_batch_chars")
    in_flight: int = job_default("graph_model_in_flight")
    confidence: float = job_default("graph_model_confidence")
    retries: int = job_default("graph_model_retries")
    max_tokens: int = job_default("graph_model_max_tokens")
    wait_s: float = job_default("graph_model_wait_s")


@dataclass
class ModelExtractReport:
    """One run: its id, the extraction version, and what it did (summed over versions)."""

    org: str
    run: int
    method_version: str
    versions: int = 0  # source versions extracted (and recorded in the ledger)
    passages: int = 0
    calls: int = 0  # model calls (batches), retries not counted
    invalid_outputs: int = 0  # answers that did not parse or validate: dropped
    invalid_facts: int = 0  # facts that did not validate: dropped
    unsupported: int = 0  # facts whose evidence is not verbatim in the passage: dropped
    found: int = 0  # facts kept
    assertions: int = 0  # new assertions written (a fact already recorded is not new)
    model_backend: str = ""  # how the model was opened: the settings' model_backend, or "given"
    models: list[str] = field(default_factory=list)  # the names of the models that answered
    seconds: float = 0.0
    failed: list[tuple[str, str]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("versions", *_COUNTS, "assertions")}

    def detail(self) -> str:
        """What the extraction run records: the counts, and which model answered how."""
        return json.dumps(
            {**self.counts(), "model_backend": self.model_backend, "models": self.models}
        )


class ModelExtractor:
    """Extracts source versions with one model client: a Ray actor's body (it opens the
    model ``settings`` name, once) or an in-process helper (given ``client``)."""

    def __init__(
        self,
        dsn: str,
        org_id: str,
        run_id: int,
        method_version: str,
        options: ExtractOptions,
        client: ModelClient | None = None,
        settings: Settings | None = None,
    ) -> None:
        self._org = org_id
        self._run = run_id
        self._method_version = method_version
        self._options = options
        self._writer = GraphWriter(dsn)
        self._loop = asyncio.new_event_loop() if client is None else None
        if client is None:
            assert self._loop is not None
            opened = open_models(settings or load_settings(), ("chat",))
            parts = self._loop.run_until_complete(opened)
            if parts.chat is None:
                raise CortexError("no chat model: set CORTEX_MODEL_BACKEND (docs/graph.md)")
            client = parts.chat
        self._client = client

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Ray Data: one row per source version in, one row of counts per version out."""
        assert self._loop is not None
        run = self._loop.run_until_complete
        return pa.Table.from_pylist([run(self.extract(_version(r))) for r in batch.to_pylist()])

    async def extract(self, version: PublishedVersion) -> dict[str, Any]:
        """Ask for the version's passages' facts (``in_flight`` batches at a time), then
        write them and the ledger row in one transaction; the version's counts."""
        o = self._options
        passages = self._writer.passages(self._org, version.source_id, version.version)
        batches = plan_batches(passages, batch_passages=o.batch_passages, batch_chars=o.batch_chars)
        total = BatchOutcome()
        for i in range(0, len(batches), o.in_flight):
            # Behind what people wait for, in the model's line: a busy model makes the job
            # wait (each round of calls at most wait_s), never fail on the first full line.
            with waiting_until(time.monotonic() + o.wait_s, "the graph extraction's wait"):
                got_all = await asyncio.gather(
                    *(
                        extract_batch(
                            self._client,
                            b,
                            confidence=o.confidence,
                            retries=o.retries,
                            max_tokens=o.max_tokens,
                            priority=BACKGROUND_PRIORITY,
                        )
                        for b in batches[i : i + o.in_flight]
                    )
                )
            for got in got_all:
                total.add(got)
        written = self._writer.write_version(
            self._org,
            self._run,
            version,
            total.rows,
            method=MODEL,
            method_version=self._method_version,
            passages=len(passages),
        )
        return {
            "source_id": version.source_id,
            "version": version.version,
            "key": version.key,
            "passages": total.passages,
            "calls": total.calls,
            "invalid_outputs": total.invalid_outputs,
            "invalid_facts": total.invalid_facts,
            "unsupported": total.unsupported,
            "found": len(total.rows),
            "assertions": written["assertions"],
            "model": self._client.name,
        }

    def close(self) -> None:
        self._writer.close()
        if self._loop is not None:
            self._loop.run_until_complete(self._client.aclose())
            self._loop.close()


def _version(row: dict[str, Any]) -> PublishedVersion:
    return PublishedVersion(
        row["source_id"],
        int(row["version"]),
        row["key"],
        row["collection"],
        datetime.fromisoformat(row["created_at"]),
    )


def run_model_extraction(
    org: str,
    *,
    dsn: str,
    collection: str | None = None,
    source_ids: Sequence[UUID | str] = (),
    since_version: int | None = None,
    model_version: str,
    options: ExtractOptions | None = None,
    actors: int = job_default("graph_model_actors"),
    num_gpus: float = job_default("graph_model_num_gpus"),
    client: ModelClient | None = None,
    settings: Settings | None = None,
) -> ModelExtractReport:
    """Extract the published versions not yet extracted at ``model_version``'s extraction
    version (``model_method_version``), recording one extraction run (DONE with the
    counts in its ``detail``, or FAILED with the reason).

    With ``client`` the versions are extracted in this process (the scripted model in
    tests); otherwise by ``actors`` Ray actors on the Ray that is initialised (or a local one),
    each opening the chat model ``settings`` name (default: ``load_settings()`` here). The
    settings go to the actors from this driver because a joined cluster's workers do not
    have its environment: ``CORTEX_MODEL_BACKEND=served`` set for the job reaches them only
    this way.
    """
    options = options or ExtractOptions()
    if client is None and settings is None:
        settings = load_settings()
    method_version = model_method_version(model_version)
    started = time.perf_counter()
    with GraphWriter(dsn) as writer:
        todo = writer.published_versions(
            org,
            collection=collection,
            source_ids=source_ids,
            since_version=since_version,
            method=MODEL,
            method_version=method_version,
        )
        run = writer.begin_run(
            org, method=MODEL, method_version=method_version, collection=collection
        )
        backend = "given" if client is not None or settings is None else settings.models.backend
        report = ModelExtractReport(org, run, method_version, model_backend=backend)
        try:
            for row in _extract(todo, dsn, org, run, method_version, options, actors, num_gpus,
                                client, settings):  # fmt: skip
                report.versions += 1
                for key in (*_COUNTS, "assertions"):
                    setattr(report, key, getattr(report, key) + int(row[key]))
                if row["model"] not in report.models:
                    report.models.append(row["model"])
        except BaseException as exc:
            writer.finish_run(org, run, failed=repr(exc)[:500], detail=report.detail())
            raise
        writer.finish_run(org, run, detail=report.detail())
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _extract(
    todo: list[PublishedVersion],
    dsn: str,
    org: str,
    run: int,
    method_version: str,
    options: ExtractOptions,
    actors: int,
    num_gpus: float,
    client: ModelClient | None,
    settings: Settings | None,
) -> Any:
    if not todo:
        return
    if client is not None:
        extractor = ModelExtractor(dsn, org, run, method_version, options, client=client)
        try:
            for version in todo:
                # The caller may run a loop of its own (a test): each version on a fresh one.
                yield _run_async(extractor.extract(version))
        finally:
            extractor.close()
        return
    import ray

    if not ray.is_initialized():
        ray.init()
    items = [
        {
            "source_id": v.source_id,
            "version": v.version,
            "key": v.key,
            "collection": v.collection,
            "created_at": v.created_at.isoformat(),
        }
        for v in todo
    ]
    ds = ray.data.from_items(items, override_num_blocks=min(len(items), 200)).map_batches(
        ModelExtractor,
        fn_constructor_kwargs={
            "dsn": dsn,
            "org_id": org,
            "run_id": run,
            "method_version": method_version,
            "options": options,
            "settings": settings,
        },
        batch_size=1,
        batch_format="pyarrow",
        concurrency=min(actors, len(items)),
        num_cpus=0 if num_gpus else 1,
        num_gpus=num_gpus,
    )
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        assert isinstance(batch, pa.Table)
        yield from batch.to_pylist()


def _run_async(coro: Any) -> Any:
    """Run ``coro`` to the end on a loop of its own, in a thread when this one runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


# command line ----------------------------------------------------------------------------


def main(
    org: ExtractOrg,
    collection: ExtractCollection = None,
    source: ExtractSources = None,
    since_version: ExtractSinceVersion = None,
    model_version: ExtractModelVersion = None,
    batch: ExtractBatch = None,
    actors: ExtractActors = None,
    in_flight: ExtractInFlight = None,
    num_gpus: ExtractNumGpus = None,
    address: ExtractAddress = None,
    database_url: ExtractDatabaseUrl = None,
) -> None:
    """Extract entities and relationships from published passages with the chat model."""
    request = ExtractRequest(
        org=org, collection=collection, source=tuple(source or ()),
        since_version=since_version, model_version=model_version, batch=batch, actors=actors,
        in_flight=in_flight, num_gpus=num_gpus, address=address, database_url=database_url,
    )  # fmt: skip
    settings = job_settings()
    try:
        sources = request.source_ids()
        job = job_options(
            settings,
            {
                "graph_model_batch": "--batch",
                "graph_model_actors": "--actors",
                "graph_model_in_flight": "--in-flight",
                "graph_model_num_gpus": "--num-gpus",
            },
            graph_model_batch=batch,
            graph_model_actors=actors,
            graph_model_in_flight=in_flight,
            graph_model_num_gpus=num_gpus,
        )
    except InvalidRequestError as exc:
        fail(str(exc), EXIT_INVALID)
    options = ExtractOptions(
        batch_passages=job.graph_model_batch,
        batch_chars=job.graph_model_batch_chars,
        in_flight=job.graph_model_in_flight,
        confidence=job.graph_model_confidence,
        retries=job.graph_model_retries,
        max_tokens=job.graph_model_max_tokens,
        wait_s=job.graph_model_wait_s,
    )

    def work(dsn: str | None) -> str:
        assert dsn is not None
        report = run_model_extraction(
            org,
            dsn=dsn,
            collection=collection,
            source_ids=sources,
            since_version=since_version,
            model_version=model_version or settings.models.name,
            options=options,
            actors=job.graph_model_actors,
            num_gpus=job.graph_model_num_gpus,
            settings=settings,
        )
        return json.dumps(asdict(report))

    # Versions finished when interrupted are recorded; a rerun extracts the rest.
    run_job(
        work,
        settings=settings,
        database_url=database_url,
        address=address,
        num_cpus=job.num_cpus,
    )


if __name__ == "__main__":
    with stop_on_signals():  # SIGINT and SIGTERM unwind to main's clean-up
        typer.run(main)
