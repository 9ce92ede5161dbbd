"""The reranking seam: a model that scores (query, document) pairs, or an honest absence.

A ``Reranker`` has a ``name`` (which reranker it is: search results and ``/v1/rerank`` say
which one ran) and says whether it can rerank at all (``available``, with a ``reason`` when
it cannot): retrieval checks it and skips the stage visibly instead of failing.

``CrossEncoderReranker`` is the one implementation that scores: a sentence-transformers
``CrossEncoder`` run in this process. The Serve deployment (``serve.models``) wraps the same
class, so the embedded runtime, the core over deployment handles and the served
``/v1/rerank`` route all rerank through this interface. No package reachable here ships
trained cross-encoder weights, and the packaged chat model measured as a pointwise reranker
lowered nDCG@10 on both development sets (docs/benchmarks.md, "LLM as reranker"), so no
reranker is configured by default.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

__all__ = ["NO_RERANKER_MODEL", "CrossEncoderReranker", "RerankHit", "Reranker"]

NO_RERANKER_MODEL = (
    "no cross-encoder model is configured (no installed package ships one; set "
    "reranker.model to a CrossEncoder path or name)"
)


class RerankHit(BaseModel):
    """One document's position in the input and its relevance score (higher is better)."""

    model_config = ConfigDict(frozen=True)

    index: int
    score: float


@runtime_checkable
class Reranker(Protocol):
    @property
    def name(self) -> str:
        """Which reranker this is (kind and model), as results report it."""
        ...

    @property
    def available(self) -> bool: ...

    @property
    def reason(self) -> str | None:
        """Why the reranker is unavailable (``None`` when it is available)."""
        ...

    async def rerank(
        self, query: str, documents: list[str], top_n: int | None = None
    ) -> list[RerankHit]:
        """The documents' hits, best first (at most ``top_n``)."""
        ...


class CrossEncoderReranker:
    """A sentence-transformers ``CrossEncoder``, loaded at construction, run off the loop.

    With no ``model``, or one that fails to load, the reranker exists but is unavailable and
    says why (``reason``); ``rerank`` then raises ``RuntimeError``. One prediction runs at a
    time (the model is not safe to share between threads).
    """

    def __init__(
        self,
        model: str | Path | None,
        *,
        device: str | None = None,
        max_length: int | None = 512,
        batch_size: int = 32,
    ) -> None:
        self._source = str(model) if model is not None else None
        self._batch_size = batch_size
        self._model: Any = None
        self._reason: str | None = None
        self._lock = threading.Lock()
        if self._source is None:
            self._reason = NO_RERANKER_MODEL
            return
        try:
            from sentence_transformers import CrossEncoder

            self._model = CrossEncoder(self._source, device=device, max_length=max_length)
        except Exception as exc:  # any load failure leaves the stage unavailable, said why
            self._reason = f"the cross-encoder {self._source!r} did not load: {exc}"

    @property
    def name(self) -> str:
        return f"cross-encoder:{self._source}" if self._source else "cross-encoder:none"

    @property
    def available(self) -> bool:
        return self._model is not None

    @property
    def reason(self) -> str | None:
        return self._reason

    def rerank_sync(
        self, query: str, documents: list[str], top_n: int | None = None
    ) -> list[RerankHit]:
        if self._model is None:
            raise RuntimeError(f"reranker {self.name} is unavailable: {self._reason}")
        if not documents:
            return []
        with self._lock:
            scores = self._model.predict(
                [(query, d) for d in documents],
                batch_size=self._batch_size,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        hits = sorted(
            (RerankHit(index=i, score=float(s)) for i, s in enumerate(scores)),
            key=lambda h: (-h.score, h.index),
        )
        return hits[:top_n] if top_n is not None else hits

    async def rerank(
        self, query: str, documents: list[str], top_n: int | None = None
    ) -> list[RerankHit]:
        return await asyncio.to_thread(self.rerank_sync, query, documents, top_n)
