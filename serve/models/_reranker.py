"""The reranking deployment: the core's ``CrossEncoderReranker``, or an honest absence.

No package ships cross-encoder weights and these machines have no internet, so the default
configuration names no model. The deployment then starts anyway and reports itself
unavailable (``available() is False``, ``health()`` with the reason, a warning in its log);
``/v1/rerank`` answers 503 and retrieval skips the rerank stage.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_REQUEST_MODEL,
)
from pydantic import SecretStr

from cortex_ray import ModelError
from cortex_ray.models.reranking import CrossEncoderReranker, RerankHit
from cortex_ray.observability import outgoing_traceparent, server_span
from serve.models._config import RerankerConfig
from serve.models._openai import Failure
from serve.models._spans import replica_tracing

try:
    from ray import serve as ray_serve
    from ray.serve import Deployment
    from ray.serve.handle import DeploymentHandle
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("model serving needs Ray Serve: pip install 'cortex-ray[ray]'") from exc

__all__ = ["RERANKER_NAME", "HandleReranker", "RerankerDeployment", "RerankerServer"]

log = logging.getLogger("serve.models")

RERANKER_NAME = "Reranker"


class RerankerServer:
    """Scores (query, document) pairs with the core's ``CrossEncoderReranker``, best first.

    Handle methods: ``available() -> bool``, ``health() -> dict`` (with the reranker's
    ``name``), ``rerank(query, documents, top_n) -> [(index, score), ...] | Failure``.
    """

    def __init__(
        self, config: RerankerConfig | None = None, *, spans_database_url: SecretStr | None = None
    ) -> None:
        self._config = config or RerankerConfig()
        self._tracing = replica_tracing(spans_database_url)
        self._reranker = CrossEncoderReranker(
            self._config.model,
            device=self._config.device,
            max_length=self._config.max_length,
            batch_size=self._config.batch_size,
        )
        if self._reranker.available:
            log.info("reranker %s ready: %s", self._config.model_id, self._reranker.name)
        else:
            log.warning("reranker %s unavailable: %s", self._config.model_id, self._reranker.reason)

    async def available(self) -> bool:
        return self._reranker.available

    async def health(self) -> dict[str, Any]:
        return {
            "model_id": self._config.model_id,
            "name": self._reranker.name,
            "available": self._reranker.available,
            "reason": self._reranker.reason,
        }

    async def rerank(
        self,
        query: str,
        documents: list[str],
        top_n: int | None = None,
        traceparent: str | None = None,
    ) -> list[tuple[int, float]] | Failure:
        if not self._reranker.available:
            return Failure.unavailable(
                f"the reranker {self._config.model_id!r}", str(self._reranker.reason)
            )
        with server_span(
            f"rerank {self._config.model_id}",
            traceparent,
            {
                GEN_AI_OPERATION_NAME: "rerank",
                GEN_AI_REQUEST_MODEL: self._config.model_id,
                "cortex.deployment": RERANKER_NAME,
                "cortex.inputs": len(documents),
            },
        ):
            hits = await self._reranker.rerank(query, documents, top_n)
        return [(h.index, h.score) for h in hits]


RerankerDeployment: Deployment = ray_serve.deployment(name=RERANKER_NAME)(RerankerServer)
"""``RerankerDeployment.bind(RerankerConfig(...))``; options from ``config.deployment``."""


class HandleReranker:
    """Reranks through the ``Reranker`` deployment; ``available`` is read once at connect."""

    def __init__(
        self,
        handle: DeploymentHandle[Any],
        *,
        name: str,
        available: bool,
        reason: str | None,
    ) -> None:
        self._handle = handle
        self._name = name
        self._available = available
        self._reason = reason

    @classmethod
    async def connect(cls, handle: DeploymentHandle[Any]) -> HandleReranker:
        state = await handle.health.remote()
        return cls(
            handle,
            name=str(state["name"]),
            available=bool(state["available"]),
            reason=state["reason"],
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def available(self) -> bool:
        return self._available

    @property
    def reason(self) -> str | None:
        return self._reason

    async def rerank(
        self, query: str, documents: list[str], top_n: int | None = None
    ) -> list[RerankHit]:
        if not documents:
            return []
        result = await self._handle.rerank.remote(
            query, documents, top_n, traceparent=outgoing_traceparent()
        )
        if isinstance(result, Failure):
            raise ModelError(result.message)
        return [RerankHit(index=i, score=s) for i, s in result]
