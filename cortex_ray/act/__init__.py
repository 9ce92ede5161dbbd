"""ACT: tools, the action classifier, and the one invocation gate."""

from cortex_ray.act._dispatcher import Dispatch, InvocationContext, ToolDispatcher, ToolHook
from cortex_ray.act._tools import ActionClassifier, Tool, ToolContext, ToolHandler, ToolRegistry
from cortex_ray.act.builtins import BUILTIN_TOOL_NAMES, builtin_tools

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "ActionClassifier",
    "Dispatch",
    "InvocationContext",
    "Tool",
    "ToolContext",
    "ToolDispatcher",
    "ToolHandler",
    "ToolHook",
    "ToolRegistry",
    "builtin_tools",
]
