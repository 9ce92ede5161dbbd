"""The reranking deployment: a sentence-transformers ``CrossEncoder``, or an honest absence.

No package ships cross-encoder weights and these machines have no internet, so the default
configuration names no model. The deployment then starts anyway and reports itself
unavailable (``available() is False``, ``health()`` with the reason, a warning in its log);
``/v1/rerank`` answers 503 and retrieval skips the rerank stage.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from serve.models._config import RerankerConfig
from serve.models._openai import Failure

try:
    from ray import serve as ray_serve
    from ray.serve import Deployment
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("model serving needs Ray Serve: pip install 'cortex-ray[ray]'") from exc

__all__ = ["RERANKER_NAME", "RerankerDeployment", "RerankerServer"]

log = logging.getLogger("serve.models")

RERANKER_NAME = "Reranker"

NO_MODEL = (
    "no cross-encoder model is configured (no installed package ships one; set "
    "reranker.model to a CrossEncoder path or name)"
)


class RerankerServer:
    """Scores (query, document) pairs with a CrossEncoder, best first.

    Handle methods: ``available() -> bool``, ``health() -> dict``,
    ``rerank(query, documents, top_n) -> [(index, score), ...] | Failure``.
    """

    def __init__(self, config: RerankerConfig | None = None) -> None:
        self._config = config or RerankerConfig()
        self._model: Any = None
        self._reason: str | None = None
        self._lock = threading.Lock()
        if self._config.model is None:
            self._reason = NO_MODEL
        else:
            try:
                from sentence_transformers import CrossEncoder

                self._model = CrossEncoder(
                    self._config.model,
                    device=self._config.device,
                    max_length=self._config.max_length,
                )
            except Exception as exc:  # any load failure leaves the stage unavailable
                self._reason = f"the cross-encoder {self._config.model!r} did not load: {exc}"
        if self._model is None:
            log.warning("reranker %s unavailable: %s", self._config.model_id, self._reason)
        else:
            log.info("reranker %s ready: %s", self._config.model_id, self._config.model)

    async def available(self) -> bool:
        return self._model is not None

    async def health(self) -> dict[str, Any]:
        return {
            "model_id": self._config.model_id,
            "available": self._model is not None,
            "reason": self._reason,
        }

    def _score(self, query: str, documents: list[str]) -> list[float]:
        with self._lock:
            scores = self._model.predict(
                [(query, d) for d in documents],
                batch_size=self._config.batch_size,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return [float(s) for s in scores]

    async def rerank(
        self, query: str, documents: list[str], top_n: int | None = None
    ) -> list[tuple[int, float]] | Failure:
        if self._model is None:
            return Failure.unavailable(f"the reranker {self._config.model_id!r}", str(self._reason))
        scores = await asyncio.to_thread(self._score, query, documents)
        ranked = sorted(enumerate(scores), key=lambda pair: pair[1], reverse=True)
        return ranked[:top_n] if top_n is not None else ranked


RerankerDeployment: Deployment = ray_serve.deployment(name=RERANKER_NAME)(RerankerServer)
"""``RerankerDeployment.bind(RerankerConfig(...))``; options from ``config.deployment``."""
