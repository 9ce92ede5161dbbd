"""The HTTP API's request and response bodies, one module per domain of the door
(``agents``, ``runs``, ``sessions``, ``tools``, ``memory``, ``knowledge``, ``graph``,
``evals``, ``governance``, ``workflows``; ``_common``: what they share).

Requests are validated here, before anything reaches the runtime; responses are built from
the core's types (``from_*`` functions, ``Body.of``). This package re-exports the bodies the
rest of ``serve`` names without a domain; each domain's routes import their own module.
"""

from __future__ import annotations

from serve.schemas._common import (
    ORG_PATTERN,
    ApiError,
    ErrorBody,
    ErrorDetail,
    GrantBody,
    Health,
    PrincipalBody,
    has_bad_text,
)
from serve.schemas._steps import ObservationBody, StepBody, from_observation
from serve.schemas._traces import DiagnosticsBody, TaskTrace, TurnTrace
from serve.schemas.agents import AgentBody, AgentCreate, AgentList, AgentUpdate, from_agent
from serve.schemas.evals import (
    EvalCaseCreate,
    EvalRunCreate,
    EvalRunList,
    EvalSuiteCreate,
    EvalSuiteList,
    from_eval_suite,
)
from serve.schemas.knowledge import KnowledgeHit, KnowledgeSearch
from serve.schemas.memory import (
    FactList,
    MemoryBody,
    MemoryHit,
    MemorySearch,
    ProposalBody,
    ProposalDecision,
    ProposalList,
)
from serve.schemas.runs import (
    TaskAccepted,
    TaskBody,
    TaskCancel,
    TaskCreate,
    TaskList,
    TaskPayload,
    TaskSummary,
    from_run,
)
from serve.schemas.sessions import (
    MessageCreate,
    MessageList,
    SessionBody,
    SessionCreate,
    SessionEnded,
    TurnBody,
    TurnDone,
    TurnError,
    TurnStarted,
    TurnStatusBody,
    from_session,
)
from serve.schemas.tools import ToolBody, ToolCall, ToolList

__all__ = [
    "ORG_PATTERN",
    "AgentBody",
    "AgentCreate",
    "AgentList",
    "AgentUpdate",
    "ApiError",
    "DiagnosticsBody",
    "ErrorBody",
    "ErrorDetail",
    "EvalCaseCreate",
    "EvalRunCreate",
    "EvalRunList",
    "EvalSuiteCreate",
    "EvalSuiteList",
    "FactList",
    "GrantBody",
    "Health",
    "KnowledgeHit",
    "KnowledgeSearch",
    "MemoryBody",
    "MemoryHit",
    "MemorySearch",
    "MessageCreate",
    "MessageList",
    "ObservationBody",
    "PrincipalBody",
    "ProposalBody",
    "ProposalDecision",
    "ProposalList",
    "SessionBody",
    "SessionCreate",
    "SessionEnded",
    "StepBody",
    "TaskAccepted",
    "TaskBody",
    "TaskCancel",
    "TaskCreate",
    "TaskList",
    "TaskPayload",
    "TaskSummary",
    "TaskTrace",
    "ToolBody",
    "ToolCall",
    "ToolList",
    "TurnBody",
    "TurnDone",
    "TurnError",
    "TurnStarted",
    "TurnStatusBody",
    "TurnTrace",
    "from_agent",
    "from_eval_suite",
    "from_observation",
    "from_run",
    "from_session",
    "has_bad_text",
]
