"""Passage-vector backfill job: ``python -m jobs.backfill --org ORG --collection NAME``.

Passage vectors are lazy (docs/knowledge.md): queries embed what they touch, and this job
embeds the rest of a collection's published passages, most used first, with the store's
``passages_to_embed`` / ``write_passage_vectors``. The embedding runs in a Ray actor that
loads the model once (``--num-gpus 1`` places it on a GPU worker of a cluster); the driver
keeps two batches in flight, so reading and writing overlap the embedding. Submit it like
the ingestion job: ``ray job submit --working-dir . -- python -m jobs.backfill ...``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Any

import numpy as np
import typer
from numpy.typing import NDArray

from cortex_ray import CortexError, Interrupted, load_settings, stop_on_signals
from cortex_ray.knowledge import KnowledgeWriter
from cortex_ray.storage import migrate
from jobs._ray import join_or_start_ray
from jobs.ingest import _resolve_dsn, _shown_default, job_default, job_options

__all__ = ["Embedder", "backfill", "main"]


class Embedder:
    """Ray actor body: the packaged MiniLM (or ``CORTEX_EMBEDDING_MODEL``), loaded once."""

    def __init__(self, model: str | None = None) -> None:
        from cortex_ray.models import SentenceTransformerEmbedder

        self._embedder = SentenceTransformerEmbedder(model)

    def embed(self, texts: list[str]) -> NDArray[np.float32]:
        return self._embedder.embed_sync(texts)


def backfill(
    org: str,
    collection: str,
    *,
    dsn: str,
    limit: int | None = None,
    batch: int = job_default("backfill_batch"),
    num_gpus: float = job_default("backfill_num_gpus"),
    embedder: Any = None,
) -> int:
    """Embed published passages without a vector until none is left (or ``limit``).

    ``embedder`` (anything with ``embed_sync(texts)``) embeds in this process instead of in a
    Ray actor.
    """
    import ray

    actor: Any = None
    if embedder is None:
        if not ray.is_initialized():
            ray.init()
        actor = ray.remote(num_cpus=0 if num_gpus else 1, num_gpus=num_gpus)(Embedder).remote()

    def submit(texts: list[str]) -> Any:
        return actor.embed.remote(texts) if actor is not None else embedder.embed_sync(texts)

    def result(handle: Any) -> NDArray[np.float32]:
        return ray.get(handle) if actor is not None else handle  # type: ignore[no-any-return]

    done = 0
    with KnowledgeWriter(dsn) as writer:
        # ids handed to the embedder but not written yet are excluded from the next read
        pending: list[tuple[list[int], Any]] = []
        in_flight: set[int] = set()
        while True:
            want = batch if limit is None else min(batch, limit - done - len(in_flight))
            rows = []
            if want > 0:
                fresh = writer.passages_to_embed(org, collection, want + len(in_flight))
                rows = [r for r in fresh if r[0] not in in_flight][:want]
            if rows:
                ids = [r[0] for r in rows]
                pending.append((ids, submit([r[1] for r in rows])))
                in_flight.update(ids)
            if not pending:
                break
            if len(pending) >= 2 or not rows:
                ids, handle = pending.pop(0)
                done += writer.write_passage_vectors(org, ids, result(handle))
                in_flight.difference_update(ids)
    if actor is not None:
        ray.kill(actor)
    return done


def main(
    org: Annotated[str, typer.Option("--org")],
    collection: Annotated[str, typer.Option("--collection")],
    limit: Annotated[int | None, typer.Option("--limit", min=1)] = None,
    # Unset flags take Settings.ingest (CORTEX_INGEST__BACKFILL_BATCH, ..._NUM_GPUS).
    batch: Annotated[
        int | None, typer.Option("--batch", show_default=_shown_default("backfill_batch"))
    ] = None,
    num_gpus: Annotated[
        float | None,
        typer.Option("--num-gpus", show_default=_shown_default("backfill_num_gpus")),
    ] = None,
    address: Annotated[str | None, typer.Option("--address")] = None,
    database_url: Annotated[str | None, typer.Option("--database-url")] = None,
) -> None:
    """Embed a collection's published passages that have no vector yet."""
    import ray

    try:
        settings = load_settings()
        dsn, embedded = _resolve_dsn(database_url, settings)
    except CortexError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        job = job_options(
            settings,
            {"backfill_batch": "--batch", "backfill_num_gpus": "--num-gpus"},
            backfill_batch=batch,
            backfill_num_gpus=num_gpus,
        )
    except CortexError as exc:
        typer.echo(f"error: {exc}", err=True)
        if embedded is not None:
            embedded.stop()
        raise typer.Exit(2) from None
    started = time.perf_counter()
    started_ray = False
    try:
        migrate(dsn)
        started_ray = join_or_start_ray(address, settings.storage.data_dir)
        n = backfill(
            org,
            collection,
            dsn=dsn,
            limit=limit,
            batch=job.backfill_batch,
            num_gpus=job.backfill_num_gpus,
        )
    except CortexError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except Interrupted as exc:
        # Vectors written so far stay (each batch commits); a rerun embeds the rest.
        typer.echo(f"interrupted by {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None
    finally:
        if started_ray:
            ray.shutdown()
        if embedded is not None:
            embedded.stop()
    seconds = round(time.perf_counter() - started, 3)
    sys.stdout.write(json.dumps({"embedded": n, "seconds": seconds}) + "\n")


if __name__ == "__main__":
    with stop_on_signals():  # SIGINT and SIGTERM unwind to main's clean-up
        typer.run(main)
