"""How an actor gets its ``Runtime``: a picklable factory of the settings."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cortex_ray import Runtime, Settings

__all__ = ["RuntimeFactory", "ServedModels", "open_runtime"]

RuntimeFactory = Callable[[Settings], Awaitable[Runtime]]
"""Opens the ``Runtime`` an actor works with. It is pickled into each actor (and kept by Ray
to re-run the constructor after a crash), so it must be importable where the actor runs or
be registered with ``ray.cloudpickle.register_pickle_by_value``."""


async def open_runtime(settings: Settings) -> Runtime:
    """The default factory: everything from the settings (``Runtime.open``). A ``served``
    model or embedder (``CORTEX_MODEL_BACKEND=served``, ``CORTEX_EMBEDDING_BACKEND=served``;
    what ``python -m serve`` and the demo set) is opened by the core's backend registry,
    which finds the Ray layer's ``served`` backend through its entry point: the actor loads
    no model weights of its own, and this package imports nothing of ``serve``. Its MCP
    calls go to the cluster's one connection actor per organisation and server
    (``RayMcpClient``), never to a connection of its own."""
    from actors._mcp import RayMcpClient

    return await Runtime.open(settings, mcp_client=RayMcpClient(settings))


@dataclass(frozen=True)
class ServedModels:
    """A factory that moves the embedder (and, with ``chat``, the chat model) to the
    deployments of the model-serving app ``app_name``, whatever the settings say: the same
    as ``open_runtime`` with ``embedding_backend`` (and ``model_backend``) ``served``."""

    app_name: str = "cortex-models"
    chat: bool = True

    async def __call__(self, settings: Settings) -> Runtime:
        update: dict[str, str] = {"embedding_backend": "served", "models_app": self.app_name}
        if self.chat:
            update["model_backend"] = "served"
        return await open_runtime(settings.model_copy(update=update))
