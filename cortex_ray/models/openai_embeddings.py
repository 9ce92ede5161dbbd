"""An embedder for any OpenAI-compatible ``/v1/embeddings`` server (the cortex-ray model
deployments, vLLM, hosted APIs), built on the official ``openai`` SDK."""

from __future__ import annotations

import httpx2 as httpx
import numpy as np
import openai
from numpy.typing import NDArray

from cortex_ray._exceptions import ConfigurationError, ModelError
from cortex_ray._types import EMBEDDING_DIM
from cortex_ray.models._guard import check_model_request
from cortex_ray.settings import EmbeddingOptions, ModelOptions

__all__ = ["OpenAICompatibleEmbedder"]


class OpenAICompatibleEmbedder:
    """Embeds through ``base_url``'s ``/embeddings``; rows are re-normalised to unit length.

    ``dim`` is the dimension the caller expects (the database's vector column); a server
    answering with another one is an error, not a silent mismatch.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        dim: int,
        api_key: str = "not-needed",
        timeout_s: float = 60.0,
        max_retries: int = 2,
        max_batch: int = 256,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout_s,
            # the SDK retries connection errors, 408/409/429 and 5xx with exponential backoff
            max_retries=max_retries,
            http_client=http_client,
        )
        self._model = model
        self._dim = dim
        self._max_batch = max_batch

    @classmethod
    def from_options(
        cls, options: EmbeddingOptions, models: ModelOptions
    ) -> OpenAICompatibleEmbedder:
        """``Settings.embeddings.backend == "openai"``: ``options.url``, ``options.model``
        (default the packaged model's served name ``all-MiniLM-L6-v2``), ``options.max_batch``,
        and the openai backends' shared ``models.api_key``, ``models.timeout_s`` and
        ``models.max_retries``; the dimension is the schema's
        (``cortex_ray.memory.EMBEDDING_DIM``), which the server's vectors must have."""
        if not options.url:
            raise ConfigurationError(
                "embeddings.backend=openai needs embeddings.url (CORTEX_EMBEDDINGS__URL)"
            )
        return cls(
            options.url,
            options.model or "all-MiniLM-L6-v2",
            dim=EMBEDDING_DIM,
            api_key=models.api_key,
            timeout_s=models.timeout_s,
            max_retries=models.max_retries,
            max_batch=options.max_batch,
        )

    @property
    def dim(self) -> int:
        return self._dim

    async def embed(self, texts: list[str]) -> NDArray[np.float32]:
        # Before the SDK sees the request, so a blocked one never opens a connection.
        check_model_request(str(self._client.base_url), model=self._model)
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for start in range(0, len(texts), self._max_batch):
            chunk = texts[start : start + self._max_batch]
            try:
                # No encoding_format: the SDK then asks for base64 and decodes it itself.
                response = await self._client.embeddings.create(model=self._model, input=chunk)
            except openai.OpenAIError as exc:
                raise ModelError(f"{self._model}: {exc}") from exc
            for item in response.data:
                row = np.asarray(item.embedding, dtype=np.float32)
                if row.shape != (self._dim,):
                    raise ModelError(
                        f"{self._model}: got {row.shape[0]} dimensions, expected {self._dim}"
                    )
                out[start + item.index] = row
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out

    async def aclose(self) -> None:
        await self._client.close()
