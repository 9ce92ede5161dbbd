"""A tool: what it is called, what it does, and what its handler may use."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from cortex_ray._types import (
    ActionType,
    Agent,
    AgentMode,
    CapabilityTier,
    Principal,
    utcnow,
)

if TYPE_CHECKING:
    from cortex_ray.memory import MemoryService

__all__ = ["ProgressSink", "Tool", "ToolContext", "ToolHandler", "progress_to"]

ProgressSink = Callable[[float, "float | None", "str | None"], Awaitable[None]]
"""Hears a running call's progress (progress, total, message): an interactive turn makes
them turn events (``TurnEventKind.PROGRESS``)."""

log = logging.getLogger("cortex_ray.act")

_progress_sink: ContextVar[ProgressSink | None] = ContextVar("tool_progress", default=None)


@contextmanager
def progress_to(sink: ProgressSink | None) -> Iterator[None]:
    """Send the progress of the tool calls made inside (in this task and the tasks it
    starts) to ``sink``."""
    token = _progress_sink.set(sink)
    try:
        yield
    finally:
        _progress_sink.reset(token)


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool handler may use: who calls, for which agent and step, and the services."""

    org_id: str
    agent: Agent
    principal: Principal
    mode: AgentMode
    run_id: UUID | None = None
    session_id: UUID | None = None
    step_index: int | None = None
    memory: MemoryService | None = None
    clock: Callable[[], datetime] = utcnow
    call_key: str | None = None
    """The key the caller gave this call (a turn's round, a direct call's
    ``Idempotency-Key``); read :attr:`idempotency_key`, which falls back to the run step's."""
    secrets: Any = None
    """The organisation's secret store (``cortex_ray.governance.SecretStore``)."""
    connector: str | None = None
    """The connector of the tool called, if any: it may read that connector's secrets."""
    revealed: list[str] = field(default_factory=list)
    """The secret values this call read: the gate redacts them from what the call returns."""
    progress_sink: ProgressSink | None = field(default_factory=lambda: _progress_sink.get())
    """Who follows the call's progress: taken where the context is made (the gate, inside
    ``progress_to``), since a client may report progress from a task of its own."""

    async def secret(self, name: str) -> str:
        """A credential from the organisation's secret store (a connector's tool reads its
        connector's secrets and those bound to none). Never return or log it: the gate
        redacts it from the result and error anyway.

        Raises:
            NotFoundError: No such secret in the organisation.
            AccessDeniedError: It belongs to another connector.
            ConfigurationError: No secret store, or it does not open with the key.
        """
        if self.secrets is None:
            from cortex_ray._exceptions import ConfigurationError

            raise ConfigurationError("this runtime has no secret store")
        value: str = await self.secrets.reveal(self.org_id, name, connector=self.connector)
        self.revealed.append(value)
        return value

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Tell whoever follows the call how far it got (a turn streams it as a
        ``progress`` event; elsewhere nobody listens). A listener's failure is not the
        call's."""
        sink = self.progress_sink
        if sink is None:
            return
        try:
            await sink(progress, total, message)
        except Exception:  # a stream that went away never fails the call
            log.warning("a progress listener failed", exc_info=True)

    @property
    def idempotency_key(self) -> str | None:
        """The key a side-effecting tool uses to never act twice (docs/tools.md).

        In a run ``f"{run_id}:{step_index}"``; in a turn ``f"turn:{turn_id}:{round}"``; for a
        direct call the caller's ``Idempotency-Key`` (namespaced by caller, agent and tool);
        ``None`` when the call has none (a direct call without the header). A retry of the
        same step or round (after a crash, on resume) carries the same key.
        """
        if self.call_key is not None:
            return self.call_key
        if self.run_id is None or self.step_index is None:
            return None
        return f"{self.run_id}:{self.step_index}"


ToolHandler = Callable[[ToolContext, dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Tool:
    """A callable action. ``parameters`` is the JSON schema its arguments are validated against.

    ``action_type`` and ``tier`` declare the tool's CoALA category and capability tier; every
    built-in declares both (``cortex_ray.act.builtins``). ``None`` lets the classifier decide
    (``ActionClassifier``: a name override, else GROUNDING; tier by category). ``connector`` names
    the connector the tool belongs to: the gate then also needs a connector grant
    (``cortex_ray.governance``).
    """

    name: str
    description: str
    handler: ToolHandler
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}, "additionalProperties": False}
    )
    action_type: ActionType | None = None
    timeout_s: float | None = None
    idempotent: bool = False
    tier: CapabilityTier | None = None
    connector: str | None = None
