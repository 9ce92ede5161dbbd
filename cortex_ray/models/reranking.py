"""The reranking seam: a cross-encoder that scores (query, document) pairs, or none.

A ``Reranker`` says whether it can rerank at all (``available``, with a ``reason`` when it
cannot): retrieval checks it and skips the stage visibly instead of failing, because no
package ships cross-encoder weights and the embedded default has none.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

__all__ = ["RerankHit", "Reranker"]


class RerankHit(BaseModel):
    """One document's position in the input and its relevance score (higher is better)."""

    model_config = ConfigDict(frozen=True)

    index: int
    score: float


@runtime_checkable
class Reranker(Protocol):
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
