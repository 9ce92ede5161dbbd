"""Builders: the model-serving application from a ``ModelServingConfig``, as a Serve import
path (``serve.models:build_app``) or on this machine (``run_local``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from serve.models._config import ModelServingConfig
from serve.models._embedder import EmbedderDeployment
from serve.models._ingress import ModelIngress
from serve.models._llm import LlamaCppDeployment, build_vllm_deployment
from serve.models._reranker import RerankerDeployment

try:
    from ray import serve as ray_serve
    from ray.serve import Application
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("model serving needs Ray Serve: pip install 'cortex-ray[ray]'") from exc

__all__ = ["DEFAULT_MODELS_APP", "LocalModels", "build_app", "build_models_app", "run_local"]

log = logging.getLogger("serve.models")

DEFAULT_MODELS_APP = "cortex-models"


def build_models_app(config: ModelServingConfig | None = None) -> Application:
    """The ingress bound to the embedder, reranker and LLM deployments ``config`` names."""
    cfg = config or ModelServingConfig()
    spans = cfg.spans_database_url
    embedder = reranker = llm = None
    if cfg.embedder is not None:
        embedder = EmbedderDeployment.options(**cfg.embedder.deployment.as_options()).bind(
            cfg.embedder, spans_database_url=spans
        )
    if cfg.reranker is not None:
        reranker = RerankerDeployment.options(**cfg.reranker.deployment.as_options()).bind(
            cfg.reranker, spans_database_url=spans
        )
    if cfg.llm is not None:
        if cfg.llm.backend == "vllm":
            llm = build_vllm_deployment(cfg.llm)
        else:
            options = cfg.llm.deployment.as_options()
            options["max_ongoing_requests"] = cfg.llm.max_ongoing_requests
            llm = LlamaCppDeployment.options(**options).bind(cfg.llm, spans_database_url=spans)
    ingress = ModelIngress.options(**cfg.ingress.deployment.as_options())
    return ingress.bind(cfg, embedder=embedder, reranker=reranker, llm=llm)


def build_app(args: dict[str, Any]) -> Application:
    """For Serve config files and ``serve run serve.models:build_app``: ``args`` is a
    ``ModelServingConfig`` as a mapping (empty: the CPU defaults)."""
    try:
        config = ModelServingConfig.model_validate(args or {})
    except ValidationError as exc:
        raise ValueError(f"invalid model-serving args: {exc}") from exc
    return build_models_app(config)


@dataclass
class LocalModels:
    """The model-serving app on this machine's Ray: its base URL, and how to stop it."""

    url: str
    name: str

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    def stop(self) -> None:
        ray_serve.delete(self.name)


def run_local(
    config: ModelServingConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str = DEFAULT_MODELS_APP,
    route_prefix: str = "/",
) -> LocalModels:
    """Start Serve's HTTP proxy on ``host:port`` (if Serve is not running yet) and deploy the
    model-serving app at ``route_prefix``; returns once it is ready."""
    ray_serve.start(http_options={"host": host, "port": port})
    ray_serve.run(build_models_app(config), name=name, route_prefix=route_prefix)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    prefix = "" if route_prefix == "/" else route_prefix
    return LocalModels(f"http://{shown}:{port}{prefix}", name)
