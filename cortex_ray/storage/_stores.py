"""Rows in and out of PostgreSQL for everything but memory (see ``cortex_ray.memory``).

Every statement is scoped by organisation; functions that take a connection run inside the
caller's transaction, so one cycle step can write its ledger row, audit row and memory rows
atomically.

``Store`` is composed of one mixin per domain, each in its own module: principals and
organisations (``_principals``), agents (``_agents``), runs with their ledger and cost
(``_runs``), sessions and their messages (``_sessions``), API keys (``_keys``), step
intents (``_intents``), audit and payloads (``_audit``), diagnostics (``_diagnostics``)
and trace spans (``_traces``). Mixins rather than a façade over per-domain stores: every
method stays a method of ``Store`` itself, with its signature and, for the static ones
that run in a caller's transaction (``Store.insert_step``, ``Store.finish_run``, ...),
callable on the class, so callers, the store protocols (``_protocols``) and tests are
unchanged, and mypy checks each method once, where it is written, with no forwarding
method to keep in step. A mixin that uses another domain's rows inherits that mixin
(agents and keys create their principal; runs write audit rows), so each module is
type-checked on its own.
"""

from __future__ import annotations

from cortex_ray.storage._agents import AgentRows
from cortex_ray.storage._audit import AuditEntry, AuditRows
from cortex_ray.storage._diagnostics import DiagnosticRows
from cortex_ray.storage._intents import IntentRows
from cortex_ray.storage._keys import KeyRows
from cortex_ray.storage._principals import PrincipalRows
from cortex_ray.storage._runs import RunRows
from cortex_ray.storage._sessions import SessionRows
from cortex_ray.storage._traces import TraceRows

__all__ = ["AuditEntry", "Store"]


class Store(
    AgentRows,
    KeyRows,
    PrincipalRows,
    RunRows,
    AuditRows,
    SessionRows,
    IntentRows,
    DiagnosticRows,
    TraceRows,
):
    """Typed reads and writes of organisations, principals, agents, runs, sessions and audit."""
