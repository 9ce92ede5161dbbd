"""How an actor gets its ``Runtime``: a picklable factory of the settings."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from cortex_ray import Runtime, Settings

__all__ = ["RuntimeFactory", "open_runtime"]

RuntimeFactory = Callable[[Settings], Awaitable[Runtime]]
"""Opens the ``Runtime`` an actor works with. It is pickled into each actor (and kept by Ray
to re-run the constructor after a crash), so it must be importable where the actor runs or
be registered with ``ray.cloudpickle.register_pickle_by_value``."""


async def open_runtime(settings: Settings) -> Runtime:
    """The default factory: everything from the settings (model, embedder, database)."""
    return await Runtime.open(settings)
