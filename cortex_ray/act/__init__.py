"""ACT: tools, the action classifier, and the one invocation gate."""

from cortex_ray.act._calls import Dispatch, InvocationContext
from cortex_ray.act._dispatcher import ToolDispatcher, ToolHook
from cortex_ray.act._registry import ActionClassifier, OrgToolSource, ToolRegistry
from cortex_ray.act._tools import ProgressSink, Tool, ToolContext, ToolHandler, progress_to
from cortex_ray.act.builtins import (
    BUILTIN_TOOL_NAMES,
    GRAPH_SEARCH,
    KNOWLEDGE_SEARCH,
    builtin_declarations,
    builtin_tools,
)

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "GRAPH_SEARCH",
    "KNOWLEDGE_SEARCH",
    "ActionClassifier",
    "Dispatch",
    "InvocationContext",
    "OrgToolSource",
    "ProgressSink",
    "Tool",
    "ToolContext",
    "ToolDispatcher",
    "ToolHandler",
    "ToolHook",
    "ToolRegistry",
    "builtin_declarations",
    "builtin_tools",
    "progress_to",
]
