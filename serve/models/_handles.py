"""The core's model seams over Serve deployment handles, for code running inside the cluster.

``HandleEmbedder`` is a ``cortex_ray.models.Embedder``, ``HandleModelClient`` a
``cortex_ray.models.ModelClient`` and ``HandleReranker`` a ``cortex_ray.models.Reranker``:
an actor or a replica that holds them calls the model deployments directly (one handle hop,
no HTTP). Outside the cluster, the core's ``OpenAICompatibleEmbedder`` and
``OpenAICompatibleClient`` reach the same deployments over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, SecretStr

from cortex_ray import ConfigurationError, ModelError, Runtime, Settings
from cortex_ray.memory import EMBEDDING_DIM
from cortex_ray.models import (
    ChatRequest,
    ChatResponse,
    ModelBackend,
    ModelParts,
    ModelSlot,
    ToolCall,
    Usage,
    register_backend,
)
from cortex_ray.observability import outgoing_traceparent
from cortex_ray.settings import setting_value
from serve.models._builder import DEFAULT_MODELS_APP
from serve.models._config import (
    SETTINGS_MIRROR,
    EmbedderConfig,
    LlmConfig,
    ModelServingConfig,
)
from serve.models._embedder import EMBEDDER_NAME
from serve.models._ingress import INGRESS_NAME
from serve.models._llm import LLM_NAME, chat_backend
from serve.models._openai import ChatCompletionRequest, Failure
from serve.models._reranker import RERANKER_NAME, HandleReranker

try:
    from ray import serve as ray_serve
    from ray.exceptions import RayError
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


async def _answer(response: Any, timeout_s: float | None, what: str) -> Any:
    """The result of a handle call, waited for at most ``timeout_s`` (``None``: no bound).

    A deployment whose replicas are gone (their node died, or it cannot be placed) leaves a
    handle call waiting for a replica with no end: the bound turns that into a ``ModelError``
    (the request is cancelled), and so does a replica that died under the call, so a run
    that depends on the model ends instead of hanging."""
    try:
        if timeout_s is None:
            return await response
        return await asyncio.wait_for(_awaited(response), timeout_s)
    except TimeoutError:
        cancel = getattr(response, "cancel", None)  # a DeploymentResponse; a coroutine was
        if callable(cancel):  # cancelled by wait_for, and its handle call with it
            cancel()
        raise ModelError(f"{what}: no answer within {timeout_s:g} s (model_timeout_s)") from None
    except RayError as exc:
        raise ModelError(f"{what}: the deployment failed ({type(exc).__name__})") from exc


async def _awaited(response: Any) -> Any:
    return await response


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


class HandleModelClient:
    """Chats through the ``LLM`` deployment (llama.cpp or Ray Serve LLM) in the OpenAI
    chat-completions format; schemas go as ``response_format``, as over HTTP.

    A 503 ``model_overloaded`` (the replica's line is full, or a request waited its
    ``queue_timeout_s``) is tried again up to ``overload_retries`` times, after
    ``overload_backoff_s`` doubling, as the openai SDK does over HTTP; background work
    (``priority`` above 0) is not retried: it has a fallback and would only add to the line.
    """

    def __init__(
        self,
        handle: DeploymentHandle[Any],
        model_id: str,
        *,
        backend: Literal["llama_cpp", "vllm"] = "llama_cpp",
        default_temperature: float = 0.0,
        default_max_tokens: int = 512,
        overload_retries: int = 3,
        overload_backoff_s: float = 1.0,
        timeout_s: float | None = None,
    ) -> None:
        self._backend = chat_backend(backend, handle)
        self._timeout_s = timeout_s
        self._overload_retries = overload_retries
        self._overload_backoff_s = overload_backoff_s
        self._model = model_id
        self._temperature = default_temperature
        self._max_tokens = default_max_tokens

    @property
    def name(self) -> str:
        return self._model

    @property
    def supports_json_schema(self) -> bool:
        return True

    def _body(self, request: ChatRequest) -> ChatCompletionRequest:
        body = request.to_openai(
            self._model,
            default_temperature=self._temperature,
            default_max_tokens=self._max_tokens,
        )
        if request.priority:  # our own deployment's line honours it (to_openai leaves it out)
            body["priority"] = request.priority
        try:
            return ChatCompletionRequest.model_validate(json.loads(json.dumps(body)))
        except ValueError as exc:
            raise ModelError(f"{self._model}: the request is not valid: {exc}") from exc

    async def chat(self, request: ChatRequest) -> ChatResponse:
        body = self._body(request)
        retries = self._overload_retries if request.priority <= 0 else 0
        delay = self._overload_backoff_s
        for attempt in range(retries + 1):
            result = await _answer(self._backend.chat(body), self._timeout_s, self._model)
            if not isinstance(result, Failure):
                break
            if result.code != "model_overloaded" or attempt == retries:
                raise ModelError(f"{self._model}: {result.message}")
            log.info("%s over capacity; trying again in %.1f s", self._model, delay)
            await asyncio.sleep(delay)
            delay *= 2
        assert not isinstance(result, Failure)
        choice = result["choices"][0]
        message = choice["message"]
        calls = tuple(
            ToolCall(
                id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"] or "{}"
            )
            for c in message.get("tool_calls") or ()
            if c.get("type", "function") == "function"
        )
        usage = result.get("usage") or {}
        return ChatResponse(
            content=message.get("content"),
            tool_calls=calls,
            finish_reason=choice.get("finish_reason"),
            usage=Usage(
                prompt_tokens=int(usage.get("prompt_tokens", 0)),
                completion_tokens=int(usage.get("completion_tokens", 0)),
            ),
        )

    async def aclose(self) -> None:
        """Nothing to close: the deployment outlives its callers."""


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
