"""The configuration of the model-serving application: one pydantic model per deployment.

A Serve config file's ``args:`` for ``serve.models:build_app`` is a ``ModelServingConfig``
as a mapping (see cluster/serve-cpu.yaml and cluster/serve-gpu.yaml). Every field has the
embedded default: the packaged MiniLM, no reranker, SmolLM2 through llama.cpp, on CPU.

A field that serves what a ``cortex_ray.Settings`` field configures in-process (the model
file, its context, max tokens, the embedding model, ...) takes that field's default, so the
two trees cannot drift: :data:`SETTINGS_MIRROR` lists them, and
``serve.models.serving_config_for(settings)`` builds a config from the same list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from cortex_ray.settings import setting_field

__all__ = [
    "SETTINGS_MIRROR",
    "DeploymentOptions",
    "EmbedderConfig",
    "IngressConfig",
    "LlmConfig",
    "ModelServingConfig",
    "RerankerConfig",
]


def _setting_default(name: str) -> Any:
    """The default of the ``Settings`` field ``name``: written once, there."""
    return setting_field(name).get_default(call_default_factory=True)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeploymentOptions(_Strict):
    """The Serve options of one deployment (``Deployment.options(**...)``).

    ``autoscaling_config`` (``{min_replicas, max_replicas, target_ongoing_requests, ...}``,
    Serve's ``AutoscalingConfig``: replicas are added while the requests in flight per
    replica stay above ``target_ongoing_requests``) and ``num_replicas`` exclude each other;
    ``max_ongoing_requests`` is what one replica is handed at a time (Serve's default: 5);
    ``max_queued_requests`` bounds what each caller (a proxy or a handle) holds back when
    every replica is full: one more is refused (HTTP 503, ``BackPressureError`` on a
    handle) instead of waiting (Serve's default -1: no bound). ``ray_actor_options`` takes
    ``num_cpus``, ``num_gpus``, ``memory``, ``accelerator_type``, ``runtime_env`` and the
    rest of Ray's actor options.
    """

    num_replicas: int | None = Field(default=None, ge=1)
    autoscaling_config: dict[str, Any] | None = None
    max_ongoing_requests: int | None = Field(default=None, ge=1)
    max_queued_requests: int | None = Field(default=None, ge=-1)
    ray_actor_options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_autoscaling(self) -> DeploymentOptions:
        if self.autoscaling_config is not None:
            from ray.serve.config import AutoscalingConfig  # Ray is there: Serve runs this

            AutoscalingConfig.model_validate(self.autoscaling_config)
        return self

    @model_validator(mode="after")
    def _one_scaling_mode(self) -> DeploymentOptions:
        if self.num_replicas is not None and self.autoscaling_config is not None:
            raise ValueError("set num_replicas or autoscaling_config, not both")
        return self

    def as_options(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v not in (None, {})}


class EmbedderConfig(_Strict):
    """A sentence-transformers model behind ``/v1/embeddings``, with dynamic batching.

    ``max_batch_size`` counts texts: concurrent requests are merged until that many texts
    (or ``batch_wait_timeout_s`` after the first) and encoded in one forward pass; a single
    request with at least that many texts skips the queue.
    """

    model_id: str = Field(default="all-MiniLM-L6-v2", description="the name clients send")
    model: str | None = Field(
        default=_setting_default("embedding_model"),
        description="sentence-transformers path or name; unset → packaged MiniLM",
    )
    device: str | None = Field(
        default=_setting_default("embedding_device"), description="cpu, cuda, ...; unset → auto"
    )
    batching: bool = Field(default=True, description="merge concurrent calls (@serve.batch)")
    max_batch_size: int = Field(default=64, ge=1)
    batch_wait_timeout_s: float = Field(default=0.005, ge=0.0)
    encode_batch_size: int = Field(default=64, ge=1, description="the model's forward batch")
    deployment: DeploymentOptions = DeploymentOptions(
        max_ongoing_requests=256, ray_actor_options={"num_cpus": 0.5}
    )


class RerankerConfig(_Strict):
    """A sentence-transformers ``CrossEncoder`` behind ``/v1/rerank``.

    With no ``model`` (the default: no package ships cross-encoder weights) or a model that
    fails to load, the deployment still starts and reports itself unavailable: ``/v1/rerank``
    answers 503, ``/health`` says why, and retrieval skips the stage.
    """

    model_id: str = Field(default="reranker", description="the name clients send")
    model: str | None = Field(default=None, description="CrossEncoder path or name")
    device: str | None = None
    max_length: int | None = Field(default=512, ge=8, description="tokens per (query, doc)")
    batch_size: int = Field(default=32, ge=1)
    # no reservation by default: without a model the replica only answers "unavailable"
    deployment: DeploymentOptions = DeploymentOptions(ray_actor_options={"num_cpus": 0})


class LlmConfig(_Strict):
    """The chat model behind ``/v1/chat/completions``.

    ``backend="llama_cpp"``: a GGUF file in this project's own deployment (CPU; the packaged
    SmolLM2 by default). ``backend="vllm"``: Ray Serve LLM's ``LLMServer`` (vLLM, GPU),
    built from ``vllm``, which is a ``ray.serve.llm.LLMConfig`` as a mapping; its
    ``model_loading_config.model_id`` is the name clients send.

    Capacity of the llama.cpp backend: a replica generates one request at a time (a
    llama.cpp context is not thread-safe); up to ``max_waiting`` more wait for it, first
    come first served. One more is refused at once with 503 ``model_overloaded``, and so is
    a request that waited ``queue_timeout_s`` for the model: a bounded wait, never an
    unbounded queue. More throughput comes from more replicas (``deployment``'s
    ``autoscaling_config``); each replica is handed up to ``max_ongoing_requests`` (unset:
    ``2 × (1 + max_waiting)``, so that what is over capacity reaches a replica and is
    refused there rather than waiting at the caller).
    """

    backend: Literal["llama_cpp", "vllm"] = "llama_cpp"
    model_id: str = Field(
        default=_setting_default("model_name"), description="the name clients send"
    )
    model_path: Path | None = Field(
        default=_setting_default("local_model_path"),
        description="GGUF file; unset → the packaged model model_id (cortex_ray.models."
        "PACKAGED_MODELS), assembled into the default data dir once",
    )
    data_dir: Path = Field(
        default=_setting_default("data_dir"),
        description="model_path unset: where the packaged model is assembled (in models/)",
    )
    n_ctx: int = Field(default=_setting_default("local_model_context"), ge=512)
    n_threads: int | None = Field(default=_setting_default("local_model_threads"), ge=1)
    default_max_tokens: int = Field(
        default=_setting_default("model_max_tokens"),
        ge=1,
        description="completion tokens when a request sets no limit",
    )
    default_temperature: float = Field(
        default=_setting_default("model_temperature"),
        ge=0.0,
        le=2.0,
        description="sampling temperature when a request sets none",
    )
    vllm: dict[str, Any] | None = Field(default=None, description="ray.serve.llm.LLMConfig")
    max_waiting: int = Field(
        default=16,
        ge=0,
        description="llama_cpp: requests a replica keeps waiting behind the one it generates; "
        "one more gets 503 model_overloaded at once",
    )
    queue_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="llama_cpp: a request that waited this long for the model gets 503 "
        "model_overloaded",
    )
    # llama.cpp picks its own threads; half a CPU keeps the defaults inside 2 CPUs
    deployment: DeploymentOptions = DeploymentOptions(ray_actor_options={"num_cpus": 0.5})

    @model_validator(mode="after")
    def _vllm_needs_config(self) -> LlmConfig:
        if self.backend == "vllm" and not self.vllm:
            raise ValueError("backend=vllm needs llm.vllm (a ray.serve.llm.LLMConfig mapping)")
        return self

    @model_validator(mode="after")
    def _over_capacity_reaches_the_replica(self) -> LlmConfig:
        given = self.deployment.max_ongoing_requests
        if self.backend == "llama_cpp" and given is not None and given <= 1 + self.max_waiting:
            raise ValueError(
                f"llm.deployment.max_ongoing_requests ({given}) must exceed 1 + llm.max_waiting "
                f"({1 + self.max_waiting}): what a replica is not handed waits at the caller, "
                "where no bound applies, instead of being refused with 503"
            )
        return self

    @property
    def max_ongoing_requests(self) -> int:
        """What Serve hands one llama.cpp replica at a time (see the class docstring)."""
        given = self.deployment.max_ongoing_requests
        return given if given is not None else 2 * (1 + self.max_waiting)

    @property
    def served_id(self) -> str:
        """The model name clients send: vLLM's model id, or ``model_id``."""
        if self.backend == "vllm" and self.vllm:
            loading = self.vllm.get("model_loading_config") or {}
            return str(loading.get("model_id", self.model_id))
        return self.model_id


class IngressConfig(_Strict):
    """Limits the OpenAI-compatible front door checks before any model runs (400 beyond),
    and its guards, checked before a body is read.

    ``require_keys``: every route but ``/health`` takes a bearer API key from the API's own
    key store (``cortex-ray api-keys create``; the ``api_keys`` table of the database that
    ``CORTEX_DATABASE_URL`` names in the replica's environment), 401 without a valid one.
    Unset (the default) it is on when Serve's HTTP proxy binds beyond loopback and off only
    on 127.0.0.1 / ::1 / localhost, the local no-key default. ``max_body_bytes`` is checked
    against ``Content-Length`` before the body is read and counted while a chunked body
    streams in (413 beyond). With keys, one key has at most ``max_concurrent_per_key``
    requests in flight at a replica (429 with ``Retry-After: retry_after_s`` beyond).
    """

    require_keys: bool | None = Field(
        default=None,
        description="bearer API keys on the model routes; unset → when Serve binds beyond loopback",
    )
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, description="413 beyond")
    max_concurrent_per_key: int = Field(
        default=8, ge=1, description="requests in flight per key and replica; 429 beyond"
    )
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After of a 429 or a 503")
    max_embedding_inputs: int = Field(default=2048, ge=1)
    max_input_chars: int = Field(default=50_000, ge=1, description="per text, message or doc")
    max_messages: int = Field(default=256, ge=1)
    max_completion_tokens: int = Field(default=4096, ge=1)
    max_rerank_documents: int = Field(default=1000, ge=1)
    deployment: DeploymentOptions = DeploymentOptions(
        max_ongoing_requests=256, ray_actor_options={"num_cpus": 0}
    )


class ModelServingConfig(_Strict):
    """Everything ``build_app`` deploys. ``None`` for a model leaves it out (its routes then
    answer 404 ``model_not_found``). The defaults reserve 1 CPU in all: the embedder 0.5,
    the LLM 0.5, the reranker and the ingress none, so that with the API replica (0.5) the
    whole local stack fits in 2 CPUs and leaves room for jobs."""

    embedder: EmbedderConfig | None = EmbedderConfig()
    reranker: RerankerConfig | None = RerankerConfig()
    llm: LlmConfig | None = LlmConfig()
    ingress: IngressConfig = IngressConfig()
    spans_database_url: SecretStr | None = Field(
        default=None,
        description="where the deployments keep their spans when spans are kept locally (no "
        "OTLP endpoint set): default CORTEX_DATABASE_URL of the replica's environment",
    )

    def model_ids(self) -> list[str]:
        return [
            m
            for m in (
                self.embedder.model_id if self.embedder else None,
                self.reranker.model_id if self.reranker else None,
                self.llm.served_id if self.llm else None,
            )
            if m is not None
        ]

    @model_validator(mode="after")
    def _distinct_ids(self) -> ModelServingConfig:
        ids = self.model_ids()
        if len(set(ids)) != len(ids):
            raise ValueError(f"model ids must be distinct: {ids}")
        return self


SETTINGS_MIRROR: dict[tuple[type[BaseModel], str], str] = {
    (EmbedderConfig, "model"): "embedding_model",
    (EmbedderConfig, "device"): "embedding_device",
    (LlmConfig, "model_id"): "model_name",
    (LlmConfig, "model_path"): "local_model_path",
    (LlmConfig, "data_dir"): "data_dir",
    (LlmConfig, "n_ctx"): "local_model_context",
    (LlmConfig, "n_threads"): "local_model_threads",
    (LlmConfig, "default_max_tokens"): "model_max_tokens",
    (LlmConfig, "default_temperature"): "model_temperature",
}
"""``(config part, field) → Settings field`` for every field that serves what a setting
configures in-process: its default is the setting's, and ``serving_config_for`` copies the
setting's value into it."""
