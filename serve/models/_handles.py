"""The core's model seams over Serve deployment handles, for code running inside the cluster.

``HandleEmbedder`` is a ``cortex_ray.models.Embedder``, ``HandleModelClient`` a
``cortex_ray.models.ModelClient`` and ``HandleReranker`` a ``cortex_ray.models.Reranker``:
an actor or a replica that holds them calls the model deployments directly (one handle hop,
no HTTP). Outside the cluster, the core's ``OpenAICompatibleEmbedder`` and
``OpenAICompatibleClient`` reach the same deployments over HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, SecretStr

from cortex_ray import ConfigurationError, Runtime, Settings
from cortex_ray.memory import EMBEDDING_DIM
from cortex_ray.models import (
    ModelBackend,
    ModelParts,
    ModelSlot,
    register_backend,
)
from cortex_ray.observability import outgoing_traceparent
from cortex_ray.settings import setting_value
from serve.models._builder import DEFAULT_MODELS_APP
from serve.models._chat_client import HandleModelClient
from serve.models._chat_client import answer_within as _answer
from serve.models._config import (
    SETTINGS_MIRROR,
    EmbedderConfig,
    LlmConfig,
    ModelServingConfig,
)
from serve.models._embedder import EMBEDDER_NAME
from serve.models._ingress import INGRESS_NAME
from serve.models._llm import LLM_NAME
from serve.models._reranker import RERANKER_NAME, HandleReranker

try:
    from ray import serve as ray_serve
    from ray.serve.handle import DeploymentHandle
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("model serving needs Ray Serve: pip install 'cortex-ray[ray]'") from exc

__all__ = [
    "SERVED_BACKEND",
    "HandleEmbedder",
    "HandleModelClient",
    "HandleReranker",
    "ModelHandles",
    "open_served_runtime",
    "served_settings",
    "serving_config_for",
]

log = logging.getLogger("serve.models.handles")


class HandleEmbedder:
    """Embeds through the ``Embedder`` deployment (which batches concurrent callers).

    ``timeout_s`` bounds each call (``Settings.models.timeout_s`` when opened as the
    ``served`` backend); ``None`` waits as long as Serve does."""

    def __init__(
        self, handle: DeploymentHandle[Any], dim: int, *, timeout_s: float | None = None
    ) -> None:
        self._handle = handle
        self._dim = dim
        self._timeout_s = timeout_s

    @classmethod
    async def connect(
        cls, handle: DeploymentHandle[Any], *, timeout_s: float | None = None
    ) -> HandleEmbedder:
        info = await _answer(handle.info.remote(), timeout_s, "the embedder")
        return cls(handle, int(info["dim"]), timeout_s=timeout_s)

    @property
    def dim(self) -> int:
        return self._dim

    async def embed(self, texts: list[str]) -> NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        out: NDArray[np.float32] = await _answer(
            self._handle.embed.remote(texts, traceparent=outgoing_traceparent()),
            self._timeout_s,
            "the embedder",
        )
        return out


@dataclass
class ModelHandles:
    """Handles to a running model-serving app's deployments (``None`` for a model the app
    does not serve), and the ``ModelServingConfig`` it was built from."""

    app_name: str
    config: ModelServingConfig
    embedder: DeploymentHandle[Any] | None
    reranker: DeploymentHandle[Any] | None
    llm: DeploymentHandle[Any] | None

    @classmethod
    async def connect(cls, app_name: str = DEFAULT_MODELS_APP) -> ModelHandles:
        """Reach the app ``app_name`` on the connected Ray cluster.

        Raises:
            ConfigurationError: No such app is running (or it is not healthy).
        """
        # serve.status() blocks on the controller: off the event loop.
        apps = (await asyncio.to_thread(ray_serve.status)).applications
        state = apps.get(app_name)
        if state is None or state.status in ("DEPLOY_FAILED", "DELETING"):
            shown = "is not deployed" if state is None else f"is {state.status.value}"
            raise ConfigurationError(
                f"the model-serving app {app_name!r} {shown} on this Ray cluster; deploy it "
                "(python -m serve.models, or serve run cluster/serve-cpu.yaml) or set "
                "CORTEX_MODELS_APP to the one that runs"
            )
        ingress = ray_serve.get_deployment_handle(INGRESS_NAME, app_name=app_name)
        config: ModelServingConfig = await ingress.config.remote()

        def get(name: str, present: object) -> DeploymentHandle[Any] | None:
            if present is None:
                return None
            return ray_serve.get_deployment_handle(name, app_name=app_name)

        return cls(
            app_name,
            config,
            get(EMBEDDER_NAME, config.embedder),
            get(RERANKER_NAME, config.reranker),
            get(LLM_NAME, config.llm),
        )


async def _open_served(settings: Settings, slots: frozenset[ModelSlot]) -> ModelParts:
    """The ``served`` backend: the slots asked for reached through handles to the
    deployments of ``settings.models.app``, and its reranker (if the app has one), which
    then reranks knowledge search.

    Raises:
        ConfigurationError: The app is not running, does not serve a model the settings
            name ``served``, or its embedder's dimension is not the schema's.
    """
    handles = await ModelHandles.connect(settings.models.app)
    app = settings.models.app
    embedder: HandleEmbedder | None = None
    chat: HandleModelClient | None = None
    if "embedder" in slots:
        if handles.embedder is None:
            raise ConfigurationError(
                f"embedding_backend=served, but the app {app!r} serves no embedder"
            )
        embedder = await HandleEmbedder.connect(
            handles.embedder, timeout_s=settings.models.timeout_s
        )
        served = handles.config.embedder
        name = (served.model or served.model_id) if served is not None else "?"
        _check_embedder_dim(embedder.dim, f"{name!r} of the Serve app {app!r}")
    if "chat" in slots:
        llm = handles.config.llm
        if handles.llm is None or llm is None:
            raise ConfigurationError(f"model_backend=served, but the app {app!r} serves no LLM")
        chat = HandleModelClient(
            handles.llm,
            llm.served_id,
            backend=llm.backend,
            app_name=app,
            deployment_name=LLM_NAME,
            default_temperature=settings.models.temperature,
            default_max_tokens=settings.models.max_tokens,
            timeout_s=settings.models.timeout_s,
        )
    reranker = None
    if handles.reranker is not None:
        reranker = await HandleReranker.connect(handles.reranker)
    return ModelParts(chat=chat, embedder=embedder, reranker=reranker)


SERVED_BACKEND = ModelBackend("served", _open_served)
"""The ``served`` model backend (entry point ``cortex_ray.backends: served``)."""
register_backend(SERVED_BACKEND)


async def open_served_runtime(settings: Settings, **kwargs: Any) -> Runtime:
    """``Runtime.open(settings, **kwargs)``: kept for callers of the earlier API; the
    ``served`` backends now open through the core's backend registry."""
    return await Runtime.open(settings, **kwargs)


def serving_config_for(settings: Settings) -> ModelServingConfig | None:
    """The model-serving app that serves what the settings name ``served``, built from the
    same settings: every field of ``SETTINGS_MIRROR`` (model name and file, context,
    threads, max tokens, temperature, embedding model and device) takes the setting's value;
    ``None`` when nothing is served. The reranker deployment comes along: without a
    cross-encoder it reserves nothing and reports itself unavailable."""
    if not settings.uses_served_models:
        return None

    def mirrored(part: type[BaseModel]) -> dict[str, Any]:
        return {
            field: setting_value(settings, setting)
            for (owner, field), setting in SETTINGS_MIRROR.items()
            if owner is part
        }

    embedder = llm = None
    if settings.embeddings.backend == "served":
        embedder = EmbedderConfig(**mirrored(EmbedderConfig))
    if settings.models.backend == "served":
        llm = LlmConfig(**mirrored(LlmConfig))
    spans = SecretStr(settings.storage.database_url) if settings.storage.database_url else None
    return ModelServingConfig(embedder=embedder, llm=llm, spans_database_url=spans)


def _check_embedder_dim(dim: int, embedder: str) -> None:
    """Refuse an embedder whose vectors the schema cannot store.

    Raises:
        ConfigurationError: ``dim`` is not ``cortex_ray.memory.EMBEDDING_DIM``; the message
            names ``embedder`` and both dimensions.
    """
    if dim != EMBEDDING_DIM:
        raise ConfigurationError(
            f"the embedder {embedder} makes {dim}-d vectors, but the database stores "
            f"{EMBEDDING_DIM}-d ones (the schema's dimension, not a setting): serve a "
            f"{EMBEDDING_DIM}-dimensional model"
        )


def served_settings(settings: Settings) -> Settings:
    """The settings with each in-process (``local``) model moved to the model-serving app:
    what ``python -m serve`` and the demo run with. ``openai``, ``hash`` and ``none`` stay."""
    update: dict[str, Any] = {}
    if settings.models.backend == "local":
        update["model_backend"] = "served"
    if settings.embeddings.backend == "local":
        update["embedding_backend"] = "served"
    return settings.model_copy(update=update)
