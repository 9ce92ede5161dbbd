"""MCP definitions kept live: a server's tool list is listed again and pinned through the
same rule as an admin's refresh (``McpConnectors.refresh_as_system``) without a person
asking, in two ways (docs/connectors.md, "Pinned definitions"):

- **on a change a server announces**: the ``SdkMcpClient`` of this process hears
  ``notifications/tools/list_changed`` (or the 2026-07-28 change stream) and calls
  ``McpListRefresher.changed(key)``, which schedules one refresh of that (organisation,
  connector) after ``debounce_s`` (a burst of notifications is one listing; one arriving
  while it runs makes one more);
- **periodically**: where the API runs (``serve.create_app``'s lifespan starts it, like the
  source health sweeper), every ``connectors.mcp_list_refresh_s`` each organisation's
  registered servers are refreshed; one that fails (its health says why) never stops the
  others.

Several API replicas sweeping the same servers do not double-audit: a listing is pinned
under a row lock of the registration (``McpConnectorStore.apply_listing``) and only changes
are audited, so the second replica's listing finds the first's pins and is a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from cortex_ray.governance import McpConnectorStore, PinChange
from cortex_ray.runtime._connectors import McpConnectors

__all__ = ["McpListRefresher", "ToolsChangedRelay"]

log = logging.getLogger("cortex_ray.mcp")


class ToolsChangedRelay:
    """The client's ``on_tools_changed`` hook, made before what it tells exists (the client
    is built before the use cases): forwards to ``target`` once it is set."""

    def __init__(self) -> None:
        self.target: Callable[[str], Awaitable[None]] | None = None

    async def __call__(self, key: str) -> None:
        if self.target is not None:
            await self.target(key)


class McpListRefresher:
    """Refreshes registered MCP servers' pins on announced changes and periodically (see
    the module docstring)."""

    def __init__(
        self,
        connectors: McpConnectors,
        store: McpConnectorStore,
        *,
        every_s: float,
        debounce_s: float = 0.5,
    ) -> None:
        self.connectors = connectors
        self.store = store
        self.every_s = every_s
        self.debounce_s = debounce_s
        self._pending: dict[tuple[str, str, str | None], asyncio.Task[None]] = {}
        self._again: set[tuple[str, str, str | None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False

    # --- announced changes ---------------------------------------------------------------

    async def changed(self, key: str) -> None:
        """A server's tool list changed (``key`` is the client's connection key,
        ``<org>/<connector>[/<principal>]``): refresh that server soon. Never waits for the
        refresh (it is called from the session's message handler)."""
        org_id, _, rest = key.partition("/")
        connector, _, principal = rest.partition("/")
        if self._closed or not org_id or not connector:
            return
        target = (org_id, connector, principal or None)
        task = self._pending.get(target)
        if task is not None and not task.done():
            self._again.add(target)
            return
        self._pending[target] = asyncio.create_task(
            self._debounced(target), name=f"MCP refresh {org_id}/{connector}"
        )

    async def _debounced(self, target: tuple[str, str, str | None]) -> None:
        org_id, connector, principal = target
        try:
            while True:
                await asyncio.sleep(self.debounce_s)
                self._again.discard(target)
                await self._refresh_one(org_id, connector, principal)
                if target not in self._again:
                    return
        finally:
            if self._pending.get(target) is asyncio.current_task():
                del self._pending[target]

    async def _refresh_one(
        self, org_id: str, connector: str, principal: str | None = None
    ) -> list[PinChange] | None:
        try:
            changes = await self.connectors.refresh_as_system(org_id, connector, principal)
        except Exception as exc:  # recorded as the server's health; the others go on
            log.warning("refreshing MCP server %s/%s failed: %s", org_id, connector, exc)
            return None
        if changes:
            log.info(
                "MCP server %s/%s changed: %s",
                org_id,
                connector,
                ", ".join(f"{c.tool} {c.change} ({c.status.value})" for c in changes),
            )
        return changes

    # --- periodically --------------------------------------------------------------------

    async def sweep(self) -> dict[tuple[str, str], list[PinChange] | None]:
        """One pass over every organisation's registered servers (``None``: that server
        could not be refreshed; per-principal servers are skipped: a listing needs a
        principal's own credentials, and a principal's session refreshes on its server's
        announcements)."""
        done: dict[tuple[str, str], list[PinChange] | None] = {}
        for registration in await self.store.all_registrations():
            if registration.config.get("per_principal"):
                continue
            key = (registration.org_id, registration.name)
            done[key] = await self._refresh_one(*key)
        return done

    async def start(self) -> None:
        """Sweep every ``every_s`` in the background (the first pass after one interval:
        registering a server already listed it)."""
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._loop(), name="MCP list refresher")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.sweep()
            except Exception as exc:  # the database away for a moment: the next pass
                log.warning("the MCP list sweep failed: %s", exc)

    async def stop(self) -> None:
        """Stop the periodic sweep (announced changes are still heard)."""
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def aclose(self) -> None:
        """Stop sweeping and drop the refreshes not done yet."""
        self._closed = True
        await self.stop()
        tasks = list(self._pending.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pending.clear()
