"""How an actor gets its ``Runtime``: a picklable factory of the settings."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from cortex_ray import ConfigurationError, Runtime, Settings

__all__ = ["RuntimeFactory", "ServedModels", "open_runtime"]

RuntimeFactory = Callable[[Settings], Awaitable[Runtime]]
"""Opens the ``Runtime`` an actor works with. It is pickled into each actor (and kept by Ray
to re-run the constructor after a crash), so it must be importable where the actor runs or
be registered with ``ray.cloudpickle.register_pickle_by_value``."""


async def open_runtime(settings: Settings) -> Runtime:
    """The default factory: everything from the settings (model, embedder, database)."""
    return await Runtime.open(settings)


@dataclass(frozen=True)
class ServedModels:
    """A factory whose runtime reaches the model deployments of a running model-serving app
    (``serve.models``) through Serve deployment handles: no HTTP hop inside the cluster.

    ``chat=False`` keeps the chat model the settings name; the embedder always comes from
    the app's ``Embedder`` deployment (whose dimension must match ``embedding_dim``).
    """

    app_name: str = "cortex-models"
    chat: bool = True
    llm_backend: Literal["llama_cpp", "vllm"] = "llama_cpp"

    async def __call__(self, settings: Settings) -> Runtime:
        from serve.models import HandleEmbedder, HandleModelClient, ModelHandles

        handles = ModelHandles.of_app(self.app_name)
        embedder = await HandleEmbedder.connect(handles.embedder)
        if embedder.dim != settings.embedding_dim:
            raise ConfigurationError(
                f"the served embedder has {embedder.dim} dimensions; "
                f"embedding_dim is {settings.embedding_dim}"
            )
        if not self.chat:
            return await Runtime.open(settings, embedder=embedder)
        model = HandleModelClient(
            handles.llm,
            settings.model_name,
            backend=self.llm_backend,
            default_temperature=settings.model_temperature,
            default_max_tokens=settings.model_max_tokens,
        )
        return await Runtime.open(settings, model=model, embedder=embedder)
