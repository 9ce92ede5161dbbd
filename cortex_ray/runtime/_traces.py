"""This process's tracing, as the use cases that read traces reach it."""

from __future__ import annotations

import asyncio

from cortex_ray.observability import Tracing

__all__ = ["Traces"]


class Traces:
    """The runtime's ``Tracing`` (``None``: off, or closed): flushed before a trace is read
    from the database, closed once when the runtime closes."""

    def __init__(self, tracing: Tracing | None) -> None:
        self.tracing = tracing

    async def flush(self) -> None:
        """Write this process's finished spans before they are read back."""
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.flush)

    async def close(self) -> None:
        """Flush the spans still queued and stop tracing here."""
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.close)
            self.tracing = None
