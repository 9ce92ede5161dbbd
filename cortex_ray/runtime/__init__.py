"""The door: every use case of the core, and where admitted work is driven.

``Runtime`` is the façade (``Runtime.open`` wires everything once, in the composition root
``_open``); the use cases live one domain per module, each a small service that takes the
one ``UseCaseGate`` (authorize + audit) and only the stores it needs: agents, runs
(started from a ``RunRequest``), sessions, tools, memory, knowledge, graph, evals, keys,
governance (``Governance``), workflows (``Workflows``) and MCP connectors
(``McpConnectors``). ``Executor`` /
``InProcessExecutor`` drive what a use case admitted through the executor seam;
``RunSupervisor`` resumes what nobody drives.
"""

from cortex_ray.cycle import StepCallback, TurnEventRelay, TurnEventSink, events_until
from cortex_ray.runtime._connectors import McpConnectors, McpServerView
from cortex_ray.runtime._executor import Executor, InProcessExecutor
from cortex_ray.runtime._gate import AccessGate, UseCaseGate
from cortex_ray.runtime._governance import Governance
from cortex_ray.runtime._keys import ApiKeyCreated, ApiKeyRevoked
from cortex_ray.runtime._mcp_config import UrlGuard, basic_url_guard
from cortex_ray.runtime._runs import MAX_CONTACT_CONTEXT_BYTES, RunRequest
from cortex_ray.runtime._runtime import Runtime
from cortex_ray.runtime._supervisor import RunSupervisor
from cortex_ray.runtime._workflows import Workflows

__all__ = [
    "MAX_CONTACT_CONTEXT_BYTES",
    "AccessGate",
    "ApiKeyCreated",
    "ApiKeyRevoked",
    "Executor",
    "Governance",
    "InProcessExecutor",
    "McpConnectors",
    "McpServerView",
    "RunRequest",
    "RunSupervisor",
    "Runtime",
    "StepCallback",
    "TurnEventRelay",
    "TurnEventSink",
    "UrlGuard",
    "UseCaseGate",
    "Workflows",
    "basic_url_guard",
    "events_until",
]
