"""Who may invoke what. One rule, fail closed.

- AUTONOMOUS: the agent's own grant, acting as the agent's non-admin principal.
- INTERACTIVE: the agent's grant ∩ the caller's grant. A person can never make an agent do
  what the person may not do, nor what the agent may not do.
- A missing grant (no policy) denies. Being an admin does not widen an agent's grant.
- Principals of another organisation are always denied.
- Dialogue (``reply``, ``DIALOGUE``) is part of every INTERACTIVE agent's action space in a
  conversation, whatever its tool set: replying to the person is a grounding action the
  runtime itself needs, not a tool a creator must remember. It is the conversation's, so no
  grant governs it: the session use cases already admitted the caller (only the session's
  own caller talks in it), and a grant (the agent's or the caller's) that lacks ``reply``,
  or an agent with no policy at all, still answers its caller; grants decide its tools.
  It still passes the gate (schema, hooks, audit). Outside a conversation ``reply`` is an
  ordinary tool: an AUTONOMOUS run has no person to reply to (its finish message is its
  dialogue), and a direct call of ``reply`` reaches nobody.

Use cases (``UseCase``: creating agents, submitting tasks, searching memory, ...) are
decided here too, by ``authorize``: the organisation, the capability tier, and the use
case's own rule; the runtime writes the audit row of each decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from cortex_ray._types import (
    ActionType,
    Agent,
    AgentMode,
    CapabilityTier,
    Principal,
    PrincipalKind,
)

__all__ = [
    "DIALOGUE",
    "AccessControlService",
    "AccessDecision",
    "Tier",
    "UseCase",
    "UseCaseRequest",
]


DIALOGUE = "reply"
"""The dialogue action: the reply to the person an interactive agent talks with."""


@dataclass(frozen=True, slots=True)
class AccessDecision:
    allowed: bool
    reason: str


def _converses(agent: Agent, mode: AgentMode) -> bool:
    """An INTERACTIVE agent called interactively: what a session's turn is, where the reply
    is part of the action space."""
    return mode is AgentMode.INTERACTIVE and agent.mode is AgentMode.INTERACTIVE


class AccessControlService:
    """Decides every tool call; the invocation gate asks it before anything runs."""

    def action_names(self, agent: Agent, mode: AgentMode | None = None) -> tuple[str, ...]:
        """The names of the agent's action space in ``mode`` (default: the agent's), before
        grants: its tool set, plus ``reply`` in a conversation (see the module docstring)."""
        if _converses(agent, mode or agent.mode) and DIALOGUE not in agent.tools:
            return (*agent.tools, DIALOGUE)
        return agent.tools

    def decide(
        self,
        agent: Agent,
        caller: Principal | None,
        tool: str,
        action_type: ActionType,
        *,
        mode: AgentMode | None = None,
        conversation: bool = False,
    ) -> AccessDecision:
        """Decide one call of ``tool`` (see the module docstring).

        Args:
            agent: The agent the call acts for.
            caller: Who asks (an interactive call's principal); ``None`` in a run.
            tool: The tool's name.
            action_type: The tool's CoALA category, as the classifier gives it.
            mode: The call's mode (default: the agent's).
            conversation: The call is part of a session's turn, where ``reply`` is the
                dialogue every interactive agent may hold; elsewhere (a direct call, a
                run) ``reply`` is decided like any tool.
        """
        mode = mode or agent.mode
        if tool == DIALOGUE and conversation and _converses(agent, mode):
            return self._dialogue(agent, caller)
        if tool not in agent.tools:
            return AccessDecision(
                False, f"tool {tool!r} is not in the tool set of agent {agent.name!r}"
            )
        if agent.grant is None:
            return AccessDecision(False, f"agent {agent.name!r} has no access policy (deny)")
        if not agent.grant.allows(tool, action_type):
            return AccessDecision(False, f"agent {agent.name!r} is not granted {tool!r}")
        if mode is AgentMode.AUTONOMOUS:
            return AccessDecision(True, "agent grant")
        if caller is None:
            return AccessDecision(False, "an interactive call needs a caller principal (deny)")
        if caller.org_id != agent.org_id:
            return AccessDecision(False, "caller belongs to another organisation")
        if caller.kind is PrincipalKind.AGENT and caller.id != agent.principal().id:
            return AccessDecision(False, "another agent cannot drive this agent interactively")
        if caller.grant is None:
            return AccessDecision(False, f"caller {caller.id!r} has no access policy (deny)")
        if not caller.grant.allows(tool, action_type):
            return AccessDecision(False, f"caller {caller.id!r} is not granted {tool!r}")
        return AccessDecision(True, "agent grant ∩ caller grant")

    @staticmethod
    def _dialogue(agent: Agent, caller: Principal | None) -> AccessDecision:
        """The reply in a conversation: to a person of the agent's organisation (or a
        service), never on another agent's behalf; no grant is read (module docstring)."""
        if caller is None:
            return AccessDecision(False, "a reply needs the caller it answers (deny)")
        if caller.org_id != agent.org_id:
            return AccessDecision(False, "caller belongs to another organisation")
        if caller.kind is PrincipalKind.AGENT and caller.id != agent.principal().id:
            return AccessDecision(False, "another agent cannot drive this agent interactively")
        return AccessDecision(True, "dialogue: the reply to the conversation's caller")

    def authorize(
        self, principal: Principal, use_case: UseCase, request: UseCaseRequest
    ) -> AccessDecision:
        """Decide a use case (``UseCase``) for ``principal``: see ``UseCase``'s rules."""
        return _authorize(self, principal, use_case, request)

    def principal_for(self, agent: Agent, caller: Principal | None, mode: AgentMode) -> Principal:
        """The principal a call runs as: the agent's own for autonomous runs, else the caller."""
        if mode is AgentMode.AUTONOMOUS or caller is None:
            return agent.principal()
        return caller


Tier = CapabilityTier
"""The capability a use case needs: the same tiers as a tool's (``CapabilityTier``)."""


class UseCase(Enum):
    """Every use case the core offers its callers (the HTTP API, the CLI, Python).

    Each has a name (the audit row's ``tool`` column: dotted, so it never collides with a
    tool's name), the CoALA action category the gate would give it, a tier, and whether an
    ALLOWED call is audited (refusals always are). Plain metadata reads (list agents, read
    a run) are not audited when allowed: a long poll would write a row per poll.
    """

    AGENTS_LIST = ("agents.list", ActionType.RETRIEVAL, Tier.READ, False)
    AGENTS_GET = ("agents.get", ActionType.RETRIEVAL, Tier.READ, False)
    # An agent's persona, skills and tool set are its procedural memory.
    AGENTS_CREATE = ("agents.create", ActionType.LEARNING, Tier.ADMIN, True)
    AGENTS_UPDATE = ("agents.update", ActionType.LEARNING, Tier.ADMIN, True)
    TASKS_SUBMIT = ("tasks.submit", ActionType.GROUNDING, Tier.WRITE, True)
    TASKS_RESUME = ("tasks.resume", ActionType.GROUNDING, Tier.WRITE, True)
    TASKS_CANCEL = ("tasks.cancel", ActionType.GROUNDING, Tier.WRITE, True)
    TASKS_LIST = ("tasks.list", ActionType.RETRIEVAL, Tier.READ, False)
    TASKS_GET = ("tasks.get", ActionType.RETRIEVAL, Tier.READ, False)
    SESSIONS_OPEN = ("sessions.open", ActionType.GROUNDING, Tier.WRITE, True)
    SESSIONS_READ = ("sessions.read", ActionType.RETRIEVAL, Tier.READ, False)
    SESSIONS_MESSAGE = ("sessions.message", ActionType.GROUNDING, Tier.WRITE, False)
    # Ending a session runs the extraction pass, which writes semantic memory.
    SESSIONS_END = ("sessions.end", ActionType.LEARNING, Tier.WRITE, True)
    TOOLS_LIST = ("tools.list", ActionType.RETRIEVAL, Tier.READ, False)
    MEMORY_SEARCH = ("memory.search", ActionType.RETRIEVAL, Tier.READ, True)
    KNOWLEDGE_SEARCH = ("knowledge.search", ActionType.RETRIEVAL, Tier.READ, True)
    API_KEYS_CREATE = ("api_keys.create", ActionType.GROUNDING, Tier.ADMIN, True)
    API_KEYS_REVOKE = ("api_keys.revoke", ActionType.GROUNDING, Tier.ADMIN, True)
    PROPOSALS_LIST = ("proposals.list", ActionType.RETRIEVAL, Tier.READ, False)
    PROPOSALS_DECIDE = ("proposals.decide", ActionType.LEARNING, Tier.ADMIN, True)
    # Evaluation: reading suites and results; saving a suite version (a case holds a run's
    # working memory, which a member may read anyway); running a suite (a live run calls
    # the model, never a tool: the recorded results answer).
    EVALS_READ = ("evals.read", ActionType.RETRIEVAL, Tier.READ, False)
    EVALS_WRITE = ("evals.write", ActionType.GROUNDING, Tier.WRITE, True)
    EVALS_RUN = ("evals.run", ActionType.GROUNDING, Tier.WRITE, True)
    # Governance (issue 18): connectors, grants and the governed audit log. Who may reach
    # which system is the tenant's administration; reading the audit log too.
    CONNECTORS_LIST = ("connectors.list", ActionType.RETRIEVAL, Tier.READ, False)
    CONNECTORS_INSTALL = ("connectors.install", ActionType.GROUNDING, Tier.ADMIN, True)
    CONNECTORS_CHECK = ("connectors.check", ActionType.GROUNDING, Tier.ADMIN, True)
    GRANTS_LIST = ("grants.list", ActionType.RETRIEVAL, Tier.ADMIN, False)
    GRANTS_CREATE = ("grants.create", ActionType.GROUNDING, Tier.ADMIN, True)
    GRANTS_REVOKE = ("grants.revoke", ActionType.GROUNDING, Tier.ADMIN, True)
    AUDIT_READ = ("audit.read", ActionType.RETRIEVAL, Tier.ADMIN, False)
    # MCP servers as connectors (issue 31): registering one (a stdio one only by the local
    # operator), listing its tools and pinning them, approving a changed definition.
    MCP_LIST = ("connectors.mcp.list", ActionType.RETRIEVAL, Tier.ADMIN, False)
    MCP_REGISTER = ("connectors.mcp.register", ActionType.GROUNDING, Tier.ADMIN, True)
    MCP_REFRESH = ("connectors.mcp.refresh", ActionType.GROUNDING, Tier.ADMIN, True)
    MCP_APPROVE = ("connectors.mcp.approve", ActionType.GROUNDING, Tier.ADMIN, True)
    MCP_CONFIGURE = ("connectors.mcp.configure", ActionType.GROUNDING, Tier.ADMIN, True)
    MCP_REMOVE = ("connectors.mcp.remove", ActionType.GROUNDING, Tier.ADMIN, True)
    # A person's own credential for a per-principal server: any member, for themselves.
    MCP_OWN_CREDENTIAL = ("connectors.mcp.credential", ActionType.GROUNDING, Tier.WRITE, True)
    # A person's label of a shadow run (what the acceptance report counts).
    TASKS_LABEL = ("tasks.label", ActionType.GROUNDING, Tier.WRITE, True)
    # Approval requests of paused runs: members read them; an admin person decides.
    APPROVALS_LIST = ("approvals.list", ActionType.RETRIEVAL, Tier.READ, False)
    APPROVALS_DECIDE = ("approvals.decide", ActionType.GROUNDING, Tier.ADMIN, True)
    # Secrets: admins set and delete them and see their names; nobody reads a value back.
    SECRETS_LIST = ("secrets.list", ActionType.RETRIEVAL, Tier.ADMIN, False)
    SECRETS_PUT = ("secrets.put", ActionType.GROUNDING, Tier.ADMIN, True)
    SECRETS_DELETE = ("secrets.delete", ActionType.GROUNDING, Tier.ADMIN, True)
    # Schedules fire autonomous runs: like submitting tasks; changing one is its creator's
    # or an admin's.
    SCHEDULES_LIST = ("schedules.list", ActionType.RETRIEVAL, Tier.READ, False)
    SCHEDULES_CREATE = ("schedules.create", ActionType.GROUNDING, Tier.WRITE, True)
    SCHEDULES_CHANGE = ("schedules.change", ActionType.GROUNDING, Tier.WRITE, True)
    # Workflows (issue 18, point 5): what a workflow's runs may reach is the tenant's
    # administration, like grants; members read definitions (starting a run is tasks.submit).
    WORKFLOWS_LIST = ("workflows.list", ActionType.RETRIEVAL, Tier.READ, False)
    WORKFLOWS_DEFINE = ("workflows.define", ActionType.GROUNDING, Tier.ADMIN, True)
    # The context graph (docs/graph.md): searching it, submitting triples (semantic memory
    # of the organisation), and restricting a collection's readers (whose facts it filters).
    GRAPH_SEARCH = ("graph.search", ActionType.RETRIEVAL, Tier.READ, True)
    GRAPH_SUBMIT = ("graph.submit", ActionType.LEARNING, Tier.WRITE, True)
    COLLECTION_READERS = ("knowledge.readers", ActionType.GROUNDING, Tier.ADMIN, True)
    # Source health: freshness policies and checks are the operators'; reports are readable.
    SOURCES_POLICY = ("knowledge.freshness", ActionType.GROUNDING, Tier.ADMIN, True)
    SOURCES_CHECK = ("knowledge.health_check", ActionType.GROUNDING, Tier.ADMIN, True)
    SOURCES_HEALTH = ("knowledge.health", ActionType.RETRIEVAL, Tier.READ, False)

    def __init__(self, label: str, category: ActionType, tier: Tier, audit_allowed: bool) -> None:
        self.label = label
        self.category = category
        self.tier = tier
        self.audit_allowed = audit_allowed


@dataclass(frozen=True, slots=True)
class UseCaseRequest:
    """What a use-case decision looks at besides the principal and the use case.

    Attributes:
        org_id: The organisation the call is addressed to.
        agent: The agent the call concerns, if any (memory search decides through it).
        owner_id: The principal that owns the object (a session's caller, the person a
            run acts for), if any.
        tool_category: The category of the tool a use case mirrors (``memory_search``),
            as the runtime's classifier gives it.
    """

    org_id: str
    agent: Agent | None = None
    owner_id: str | None = None
    tool_category: ActionType | None = None
    approvers: tuple[str, ...] = ()
    """Who may decide an approval request (empty: any admin person)."""


def _authorize(
    service: AccessControlService,
    principal: Principal,
    use_case: UseCase,
    request: UseCaseRequest,
) -> AccessDecision:
    """The one decision for a use case: the organisation, the tier, then the use case's own
    rule. Fail closed: a use case without a rule here is a READ that only members make."""
    if principal.org_id != request.org_id:
        return AccessDecision(False, "the principal belongs to another organisation")
    if use_case.tier is Tier.ADMIN and not principal.is_admin:
        return AccessDecision(False, f"only an admin principal may do {use_case.label}")
    if (
        use_case in (UseCase.SESSIONS_READ, UseCase.SESSIONS_END)
        and request.owner_id != principal.id
        and not principal.is_admin
    ):
        return AccessDecision(False, "this session belongs to another caller")
    if (
        use_case is UseCase.TASKS_CANCEL
        and request.owner_id != principal.id
        and not principal.is_admin
    ):
        return AccessDecision(False, "only the run's caller or an admin may cancel it")
    if (
        use_case is UseCase.SCHEDULES_CHANGE
        and request.owner_id != principal.id
        and not principal.is_admin
    ):
        return AccessDecision(False, "only the schedule's creator or an admin may change it")
    if use_case is UseCase.TASKS_LABEL and principal.kind is not PrincipalKind.USER:
        return AccessDecision(False, "only a person labels a run")
    if use_case is UseCase.APPROVALS_DECIDE:
        if principal.kind is not PrincipalKind.USER:
            return AccessDecision(False, "only a person decides an approval request")
        if request.approvers and principal.id not in request.approvers:
            return AccessDecision(False, "not one of this request's approvers")
        if request.owner_id is not None and request.owner_id == principal.id:
            return AccessDecision(False, "the run's requester may not approve its calls")
    if use_case is UseCase.SESSIONS_MESSAGE and request.owner_id != principal.id:
        return AccessDecision(False, "only the session's own caller may talk in it")
    if use_case is UseCase.MEMORY_SEARCH and not principal.is_admin:
        if request.agent is None:
            return AccessDecision(False, "memory search needs an agent (deny)")
        verdict = service.decide(
            request.agent,
            principal,
            "memory_search",
            request.tool_category or ActionType.RETRIEVAL,
            mode=AgentMode.INTERACTIVE,
        )
        if not verdict.allowed:
            return AccessDecision(False, f"memory search denied: {verdict.reason}")
    if use_case is UseCase.KNOWLEDGE_SEARCH and not principal.is_admin:
        grant = principal.grant  # a missing grant denies, as everywhere
        if grant is None or not grant.allows("knowledge_search", ActionType.RETRIEVAL):
            return AccessDecision(False, "knowledge search denied: knowledge_search is not granted")
    for graph_case, tool in ((UseCase.GRAPH_SEARCH, "graph_search"),
                             (UseCase.GRAPH_SUBMIT, "graph_submit")):  # fmt: skip
        if use_case is graph_case and not principal.is_admin:
            grant = principal.grant
            if grant is None or not grant.allows(tool, use_case.category):
                return AccessDecision(False, f"{use_case.label} denied: {tool} is not granted")
    return AccessDecision(True, f"{use_case.tier.value} use case")
