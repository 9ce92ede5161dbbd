"""Each organisation's MCP tools, kept in memory for the tool registry (an
``OrgToolSource``): the approved definitions of its enabled servers, rebuilt from the store
when what this process holds is older than ``cache_s`` or was invalidated by a change made
here (another process's change counts within ``cache_s``, like grants)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence

import jsonschema
from pydantic import ValidationError

from cortex_ray.act import Tool
from cortex_ray.governance import McpConnectorStore, McpRegistration, PinnedTool
from cortex_ray.mcp._tools import DEFAULT_CALL_TIMEOUT_S, mcp_tools
from cortex_ray.mcp._types import (
    McpClient,
    McpServerConfig,
    McpToolDefinition,
)

__all__ = ["McpToolOverlay", "offered_definitions"]

log = logging.getLogger("cortex_ray.mcp")


def offered_definitions(
    registration: McpRegistration, pins: Sequence[PinnedTool]
) -> list[McpToolDefinition]:
    """The approved definitions a registration offers (its enabled subset, if it has one)."""
    wanted = None if registration.enabled_tools is None else set(registration.enabled_tools)
    found = []
    for pin in pins:
        if wanted is not None and pin.tool not in wanted:
            continue
        try:
            definition = McpToolDefinition.model_validate(pin.definition)
            # The gate validates every call's arguments against it: a schema that is not
            # one would fail each call of the tool, so the tool is not offered at all.
            jsonschema.Draft202012Validator.check_schema(definition.input_schema)
        except (ValidationError, jsonschema.SchemaError) as exc:  # not offered, said so
            log.warning("MCP tool %s of %s is unusable: %s", pin.tool, pin.connector, exc)
            continue
        found.append(definition)
    return found


class McpToolOverlay:
    """The registry's ``OrgToolSource`` of MCP tools (see the module docstring)."""

    def __init__(
        self,
        store: McpConnectorStore,
        client: McpClient,
        *,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        cache_s: float = 1.0,
    ) -> None:
        self.store = store
        self.client = client
        self.call_timeout_s = call_timeout_s
        self.cache_s = cache_s
        self._tools: dict[str, dict[str, Tool]] = {}
        self._loaded: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def tools(self, org_id: str) -> Mapping[str, Tool]:
        return self._tools.get(org_id, {})

    def invalidate(self, org_id: str) -> None:
        """Forget the organisation's tools: the next ``load`` reads them again."""
        self._loaded.pop(org_id, None)

    async def load(self, org_id: str) -> None:
        if self._fresh(org_id):
            return
        lock = self._locks.setdefault(org_id, asyncio.Lock())
        async with lock:
            if self._fresh(org_id):
                return
            started = time.monotonic()
            tools: dict[str, Tool] = {}
            for registration, pins in await self.store.offered(org_id):
                try:
                    config = McpServerConfig.model_validate(registration.config)
                except ValidationError as exc:
                    log.warning("MCP server %s is unreadable: %s", registration.name, exc)
                    continue
                for tool in mcp_tools(
                    registration.name,
                    config,
                    offered_definitions(registration, pins),
                    self.client,
                    tier_overrides=registration.tier_overrides,
                    call_timeout_s=self.call_timeout_s,
                ):
                    tools[tool.name] = tool
            self._tools[org_id] = tools
            self._loaded[org_id] = started

    def _fresh(self, org_id: str) -> bool:
        loaded = self._loaded.get(org_id)
        return loaded is not None and time.monotonic() - loaded < self.cache_s
