"""The embedding deployment: a sentence-transformers model with dynamic batching.

Concurrent calls are merged by ``@serve.batch`` (``batch_size_fn`` counts texts, so
``max_batch_size`` is a number of texts) and encoded in one forward pass in a worker
thread, so the replica keeps collecting the next batch meanwhile. A call that alone fills a
batch skips the queue.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_REQUEST_MODEL,
)
from pydantic import SecretStr

from cortex_ray.models.embeddings import packaged_minilm_path
from cortex_ray.observability import server_span
from serve.models._config import EmbedderConfig
from serve.models._spans import replica_tracing

try:
    from ray import serve as ray_serve
    from ray.serve import Deployment
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("model serving needs Ray Serve: pip install 'cortex-ray[ray]'") from exc

__all__ = ["EMBEDDER_NAME", "EmbedderDeployment", "EmbedderServer"]

log = logging.getLogger("serve.models")

EMBEDDER_NAME = "Embedder"

Vectors = NDArray[np.float32]


def _count_texts(items: list[list[str]]) -> int:
    return sum(len(texts) for texts in items)


class EmbedderServer:
    """One sentence-transformers model per replica (on the replica's GPU when it has one).

    Handle methods: ``embed(texts) -> float32 array`` (unit-length rows),
    ``embed_with_usage(texts) -> (array, prompt tokens)``, ``info() -> dict``; the embedding
    calls take the caller's ``traceparent`` (see ``serve.models._spans``).
    """

    def __init__(
        self, config: EmbedderConfig | None = None, *, spans_database_url: SecretStr | None = None
    ) -> None:
        from sentence_transformers import SentenceTransformer

        self._config = config or EmbedderConfig()
        self._tracing = replica_tracing(spans_database_url)
        source = self._config.model or str(packaged_minilm_path())
        self._model = SentenceTransformer(source, device=self._config.device)
        get_dim = getattr(self._model, "get_embedding_dimension", None) or (
            self._model.get_sentence_embedding_dimension
        )
        self._dim = int(get_dim() or 0)
        self._lock = threading.Lock()  # one forward pass at a time: they share the cores
        self._passes = 0  # forward passes run (one per merged batch or direct call)
        self._calls = 0
        self._encode_s = 0.0  # wall seconds inside forward passes
        batcher: Any = self._batched  # @serve.batch adds these setters
        batcher.set_max_batch_size(self._config.max_batch_size)
        batcher.set_batch_wait_timeout_s(self._config.batch_wait_timeout_s)
        log.info(
            "embedder %s ready: %s on %s, dim %d, batching %s (max %d texts, wait %.3f s)",
            self._config.model_id,
            source,
            self._model.device,
            self._dim,
            self._config.batching,
            self._config.max_batch_size,
            self._config.batch_wait_timeout_s,
        )

    def info(self) -> dict[str, Any]:
        return {
            "model_id": self._config.model_id,
            "dim": self._dim,
            "device": str(self._model.device),
            "max_seq_length": self._model.max_seq_length,
            "batching": self._config.batching,
        }

    def stats(self) -> dict[str, float]:
        """Calls served, forward passes run (fewer than calls when batching merges them) and
        seconds spent in forward passes."""
        return {"calls": self._calls, "passes": self._passes, "encode_s": self._encode_s}

    def _encode(self, texts: list[str], count_tokens: bool) -> tuple[Vectors, int]:
        with self._lock:
            self._passes += 1
            start = time.perf_counter()
            out = self._model.encode(
                texts,
                batch_size=self._config.encode_batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
            )
            self._encode_s += time.perf_counter() - start
        tokens = self._count(texts) if count_tokens else 0
        return np.asarray(out, dtype=np.float32), tokens

    @ray_serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005, batch_size_fn=_count_texts)
    async def _batched(self, requests: list[list[str]]) -> list[tuple[Vectors, int]]:
        flat = [text for texts in requests for text in texts]
        vectors, _ = await asyncio.to_thread(self._encode, flat, False)
        out: list[tuple[Vectors, int]] = []
        start = 0
        for texts in requests:
            out.append((vectors[start : start + len(texts)], 0))
            start += len(texts)
        return out

    async def _run(self, texts: list[str], count_tokens: bool) -> tuple[Vectors, int]:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32), 0
        self._calls += 1
        if self._config.batching and len(texts) < self._config.max_batch_size:
            vectors, _ = await self._batched(texts)
            tokens = await asyncio.to_thread(self._count, texts) if count_tokens else 0
            return vectors, tokens
        return await asyncio.to_thread(self._encode, texts, count_tokens)

    def _count(self, texts: list[str]) -> int:
        """Prompt tokens for the usage report (the tokenizer, truncated as the model reads)."""
        ids = self._model.tokenizer(texts, truncation=True, max_length=self._model.max_seq_length)
        return sum(len(i) for i in ids["input_ids"])

    def _span(self, texts: list[str], traceparent: str | None) -> Any:
        return server_span(
            f"embeddings {self._config.model_id}",
            traceparent,
            {
                GEN_AI_OPERATION_NAME: "embeddings",
                GEN_AI_REQUEST_MODEL: self._config.model_id,
                "cortex.deployment": EMBEDDER_NAME,
                "cortex.inputs": len(texts),
            },
        )

    async def embed(self, texts: list[str], traceparent: str | None = None) -> Vectors:
        with self._span(texts, traceparent):
            return (await self._run(texts, False))[0]

    async def embed_with_usage(
        self, texts: list[str], traceparent: str | None = None
    ) -> tuple[Vectors, int]:
        with self._span(texts, traceparent):
            return await self._run(texts, True)

    async def health(self) -> dict[str, Any]:
        return {"model_id": self._config.model_id, "available": True, "reason": None}


EmbedderDeployment: Deployment = ray_serve.deployment(name=EMBEDDER_NAME)(EmbedderServer)
"""``EmbedderDeployment.bind(EmbedderConfig(...))``; options from ``config.deployment``."""
