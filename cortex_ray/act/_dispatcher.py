"""The one invocation gate. Every tool call, chosen by a model or made directly, passes here:

unknown tool? → arguments valid against the schema? → AccessControlService → the running
workflow's allow-list (its tools and connectors) → the connector
policy (a connector's tools: installed, granted to every principal the call acts for, within
the grant's tier and argument constraints, approval) → before-hooks → run under a timeout (and
cancellation) → redact the connector's sensitive result fields → bound the output →
after-hooks → audit row (with the decision, the tier, hashes of the arguments and the result,
the result's source ids and the grants used; arguments or a result over
``payload_inline_bytes`` stored once by hash and referenced) and a log line and a span
carrying the action category.

Failures become an ``Observation`` with status REFUSED / ERROR / TIMEOUT (CANCELLED is
recorded, then re-raised): nothing a tool does escapes the decision cycle as an exception.
A call's context, outcome and audit row are built in ``cortex_ray.act._calls``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol
from uuid import UUID

import jsonschema

from cortex_ray._types import (
    ActionType,
    Agent,
    AgentAction,
    AgentMode,
    CapabilityTier,
    Observation,
    ObservationStatus,
    Principal,
    RunMode,
    ToolSpec,
)
from cortex_ray.access import AccessControlService
from cortex_ray.act._calls import (
    CallFacts,
    Dispatch,
    InvocationContext,
    access_of,
    audit_row,
    sha256_text,
    source_ids,
    source_versions,
)
from cortex_ray.act._registry import ToolRegistry
from cortex_ray.act._tools import Tool, ToolContext
from cortex_ray.governance import (
    ConnectorPolicy,
    Verdict,
    WorkflowVersion,
    redact,
    redact_values,
)
from cortex_ray.observability import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_CALL_ARGUMENTS,
    GEN_AI_TOOL_CALL_RESULT,
    GEN_AI_TOOL_NAME,
    GEN_AI_TOOL_TYPE,
    Status,
    StatusCode,
    captured,
    diagnostics,
    metrics,
    scrub,
    tracer,
)
from cortex_ray.settings import ToolOptions, TracingOptions
from cortex_ray.storage import AuditEntry, Store

__all__ = ["ToolDispatcher", "ToolHook"]

log = logging.getLogger("cortex_ray.act")

_CATEGORY_ORDER = {t: i for i, t in enumerate(ActionType)}


class ToolHook(Protocol):
    """Runs around every call. ``before`` may veto by returning a reason; ``after`` may rewrite."""

    async def before(self, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> str | None: ...

    async def after(
        self, ctx: ToolContext, tool: Tool, observation: Observation
    ) -> Observation: ...


def _text(output: Any) -> str:
    return (
        output if isinstance(output, str) else json.dumps(output, default=str, ensure_ascii=False)
    )


def _bound(output: Any, limit: int, text: str | None = None) -> tuple[Any, str, bool]:
    """JSON-safe output, its text, and whether it was cut to ``limit`` characters."""
    text = _text(output) if text is None else text
    if len(text) <= limit:
        return (output if not isinstance(output, str) else text), text, False
    cut = text[: limit - 1] + "…"
    return cut, cut, True


class ToolDispatcher:
    """The invocation gate (see the module docstring)."""

    def __init__(
        self,
        registry: ToolRegistry,
        access: AccessControlService,
        store: Store,
        options: ToolOptions,
        *,
        tracing: TracingOptions | None = None,
        memory: Any = None,
        hooks: Sequence[ToolHook] = (),
        governance: ConnectorPolicy | None = None,
        secrets: Any = None,
    ) -> None:
        self.registry = registry
        self.secrets = secrets
        """The organisation secret store tools read credentials from (``ToolContext.secret``)."""
        self.governance = governance
        """Decides the calls of connectors' tools; without it every such call is denied."""
        self.access = access
        self.store = store
        self.options = options
        """``Settings.tools``: the call timeout, the observation bound, the inline payloads."""
        self.tracing = tracing or TracingOptions()
        """``Settings.tracing``: whether tool arguments and results go into spans."""
        self.memory = memory
        self.hooks = list(hooks)
        # Compiled argument validators by tool name, with the schema each was built from
        # (building one per call cost more than validating the arguments).
        self._validators: dict[str, tuple[Any, jsonschema.Draft202012Validator]] = {}

    async def load_tools(self, org_id: str) -> None:
        """Bring the organisation's own tools (its MCP servers') up to date before
        ``action_space`` reads them."""
        await self.registry.load(org_id)

    def action_space(
        self, agent: Agent, caller: Principal | None, mode: AgentMode
    ) -> list[ToolSpec]:
        """The tools this principal may use for this agent, grouped by action type.

        An interactive caller sees only what both the caller and the agent may do, and the
        reply: the action space of a conversation (``AccessControlService.action_names``).
        """
        specs = []
        for name in self.access.action_names(agent, mode):
            tool = self.registry.get(name, agent.org_id)
            if tool is None:
                continue
            action_type = self.registry.classifier.classify(tool)
            decision = self.access.decide(
                agent, caller, name, action_type, mode=mode, conversation=True
            )
            if decision.allowed:
                specs.append(self.registry.spec(tool))
        return sorted(specs, key=lambda s: (_CATEGORY_ORDER[s.action_type], s.name))

    async def invoke(
        self, ctx: InvocationContext, tool_name: str, args: dict[str, Any]
    ) -> Observation:
        """Execute one call and write its audit row in a transaction of its own (direct calls)."""
        dispatch = await self.execute(ctx, tool_name, args)
        await self._write_audit(dispatch.audit)
        return dispatch.observation

    async def execute(
        self, ctx: InvocationContext, tool_name: str, args: dict[str, Any]
    ) -> Dispatch:
        """Run the gate; the caller persists ``Dispatch.audit`` (the cycle does so in the same
        transaction as the step's ledger and memory rows)."""
        await self.registry.load(ctx.agent.org_id)
        tool = self.registry.get(tool_name, ctx.agent.org_id)
        action_type = self.registry.classifier.classify(tool) if tool else ActionType.GROUNDING
        tier = self.registry.classifier.tier(tool) if tool else CapabilityTier.WRITE
        principal = self.access.principal_for(ctx.agent, ctx.caller, ctx.mode)
        tctx = ToolContext(
            org_id=ctx.agent.org_id,
            agent=ctx.agent,
            principal=principal,
            mode=ctx.mode,
            run_id=ctx.run_id,
            session_id=ctx.session_id,
            step_index=ctx.step_index,
            memory=self.memory,
            call_key=ctx.idempotency_key,
            secrets=self.secrets,
            connector=tool.connector if tool else None,
        )
        with tracer.start_as_current_span(
            f"execute_tool {tool_name}",
            attributes={
                GEN_AI_OPERATION_NAME: "execute_tool",
                GEN_AI_TOOL_NAME: tool_name,
                GEN_AI_TOOL_TYPE: "function",
                "cortex.action_type": action_type.value,
                "cortex.tier": tier.value,
                "cortex.mode": ctx.mode.value,
            },
        ) as span:
            started = time.perf_counter()
            facts = CallFacts()
            try:
                observation, reason = await self._run(
                    tctx,
                    tool,
                    tool_name,
                    action_type,
                    tier,
                    args,
                    facts,
                    ctx.run_mode,
                    ctx.approval_id,
                    ctx.workflow,
                )
            except asyncio.CancelledError:
                # Record the cancelled call, then let the cancellation go on.
                log.warning("dispatch tool=%s category=%s cancelled", tool_name, action_type.value)
                audit = audit_row(
                    ctx,
                    tctx,
                    tool_name,
                    action_type,
                    tier,
                    args,
                    "CANCELLED",
                    "cancelled",
                    (time.perf_counter() - started) * 1000,
                    tool.connector if tool else None,
                    facts,
                    inline_bytes=self.options.payload_inline_bytes,
                )
                await asyncio.shield(self._write_audit(audit))
                raise
            duration_ms = (time.perf_counter() - started) * 1000
            observation = observation.model_copy(
                update={
                    "duration_ms": duration_ms,
                    "step_index": ctx.step_index,
                    "args": args if isinstance(args, dict) else {},
                }
            )
            access = access_of(observation.status, reason)
            span.set_attribute("cortex.status", observation.status.value)
            span.set_attribute("cortex.access", access)
            if observation.status is not ObservationStatus.OK:
                span.set_status(Status(StatusCode.ERROR, observation.status.value))
            tracing = self.tracing
            if tracing.capture_content and span.is_recording():
                span.set_attribute(
                    GEN_AI_TOOL_CALL_ARGUMENTS, captured(args, tracing.max_content_chars)
                )
                span.set_attribute(
                    GEN_AI_TOOL_CALL_RESULT,
                    captured(observation.output, tracing.max_content_chars),
                )
        org, agent = ctx.agent.org_id, ctx.agent.name
        metrics.record(
            metrics.TOOL_CALLS,
            org=org,
            agent=agent,
            tool=tool_name,
            category=action_type.value,
            outcome=observation.status.value,
        )
        metrics.record(
            metrics.TOOL_DURATION,
            duration_ms / 1000,
            org=org,
            tool=tool_name,
            category=action_type.value,
        )
        if access == "denied":
            metrics.record(metrics.ACCESS_DENIALS, org=org, agent=agent, tool=tool_name)
        diagnostics.tool_call(
            tool_name,
            category=action_type.value,
            access=access,
            status=observation.status.value,
            seconds=duration_ms / 1000,
            args=args,
            output=observation.output,
            reason=reason,
        )
        log.info(
            "dispatch tool=%s category=%s tier=%s status=%s principal=%s run=%s step=%s %.1fms%s",
            tool_name,
            action_type.value,
            tier.value,
            observation.status.value,
            principal.id,
            ctx.run_id,
            ctx.step_index,
            duration_ms,
            f" reason={reason}" if reason else "",
            extra={"action_type": action_type.value, "tier": tier.value, "tool": tool_name},
        )
        audit = audit_row(
            ctx,
            tctx,
            tool_name,
            action_type,
            tier,
            args,
            observation.status.value,
            reason,
            duration_ms,
            tool.connector if tool else None,
            facts,
            inline_bytes=self.options.payload_inline_bytes,
        )
        return Dispatch(observation, audit)

    def audit_entry(
        self,
        ctx: InvocationContext,
        action: AgentAction,
        *,
        status: str,
        reason: str,
    ) -> AuditEntry:
        """The audit row of a call the gate did not run now (an interrupted step found on
        resume); the caller writes it in its own transaction."""
        tctx = ToolContext(
            org_id=ctx.agent.org_id,
            agent=ctx.agent,
            principal=self.access.principal_for(ctx.agent, ctx.caller, ctx.mode),
            mode=ctx.mode,
            run_id=ctx.run_id,
            session_id=ctx.session_id,
            step_index=ctx.step_index,
            call_key=ctx.idempotency_key,
        )
        tool = self.registry.get(action.tool, ctx.agent.org_id)
        tier = self.registry.classifier.tier(tool) if tool else CapabilityTier.WRITE
        return audit_row(
            ctx,
            tctx,
            action.tool,
            action.action_type,
            tier,
            action.args,
            status,
            reason,
            0.0,
            inline_bytes=self.options.payload_inline_bytes,
        )

    async def _write_audit(self, audit: AuditEntry) -> None:
        async with self.store.db.transaction() as conn:
            await self.store.insert_audit(conn, audit)

    async def _run(
        self,
        ctx: ToolContext,
        tool: Tool | None,
        name: str,
        action_type: ActionType,
        tier: CapabilityTier,
        args: dict[str, Any],
        facts: CallFacts,
        run_mode: RunMode = RunMode.EXECUTE,
        approval_id: UUID | None = None,
        workflow: WorkflowVersion | None = None,
    ) -> tuple[Observation, str | None]:
        def refuse(reason: str) -> tuple[Observation, str]:
            obs = Observation(
                tool=name,
                action_type=action_type,
                status=ObservationStatus.REFUSED,
                summary=f"refused: {reason}",
            )
            return obs, reason

        if tool is None:
            return refuse(f"unknown tool {name!r}")
        if not isinstance(args, dict):
            return refuse("invalid arguments: arguments must be a JSON object")
        cached = self._validators.get(name)
        if cached is None or cached[0] is not tool.parameters:
            cached = (tool.parameters, jsonschema.Draft202012Validator(tool.parameters))
            self._validators[name] = cached
        errors = sorted(cached[1].iter_errors(args), key=lambda e: list(e.path))
        if errors:
            where = "/".join(str(p) for p in errors[0].path) or "arguments"
            return refuse(f"invalid arguments: {where}: {errors[0].message}")
        decision = self.access.decide(
            ctx.agent,
            ctx.principal,
            name,
            action_type,
            mode=ctx.mode,
            conversation=ctx.session_id is not None,
        )
        if not decision.allowed:
            return refuse(f"access denied: {decision.reason}")
        if workflow is not None and not workflow.allows(name, tool.connector):
            # Before any grant is read: the workflow's allow-list bounds what its runs may
            # reach, whatever the principal's grants allow.
            of = "" if tool.connector is None else f" (connector {tool.connector!r})"
            return refuse(f"workflow {workflow.label} does not allow {name!r}{of}")
        verdict: Verdict | None = None
        if tool.connector is not None:
            # Fail closed: a connector's tool runs only when its policy says so.
            if self.governance is None:
                return refuse(f"access denied: no connector policy for {tool.connector!r}")
            principals = [ctx.agent.principal().id]
            if ctx.principal.id not in principals:
                principals.append(ctx.principal.id)  # a conversation: the caller's grant too
            verdict = await self.governance.check(
                org_id=ctx.org_id,
                principal_ids=principals,
                connector=tool.connector,
                tool=name,
                tier=tier,
                args=args,
            )
            facts.grant_ids = verdict.grant_ids
            if verdict.decision == "deny":
                return refuse(f"access denied: {verdict.reason}")
            if (
                verdict.decision == "approval"
                and approval_id is None
                and (run_mode is RunMode.EXECUTE or tier is CapabilityTier.READ)
            ):
                return refuse(f"approval required: {verdict.reason}")
        gated = None if workflow is None else workflow.needs_approval(name, tier)
        if (
            gated is not None
            and approval_id is None
            and (run_mode is RunMode.EXECUTE or tier is CapabilityTier.READ)
        ):
            return refuse(f"approval required: {gated}")
        if run_mode is not RunMode.EXECUTE and tier is not CapabilityTier.READ:
            # Decided like any call (schema, grants, constraints), then not run: nothing
            # with a side effect happens in a dry run or a shadow run.
            if run_mode is RunMode.DRY_RUN:
                status = ObservationStatus.SIMULATED
                summary = "dry run: allowed, not executed (would change something)"
            else:
                status = ObservationStatus.PROPOSED
                summary = "shadow run: recorded as a proposal for review, not executed"
            obs = Observation(tool=name, action_type=action_type, status=status, summary=summary)
            return obs, None
        for hook in self.hooks:
            veto = await hook.before(ctx, tool, args)
            if veto:
                return refuse(f"hook: {veto}")

        timeout = tool.timeout_s or self.options.timeout_s
        status, reason, output = ObservationStatus.OK, None, None
        try:
            async with asyncio.timeout(timeout):
                output = await tool.handler(ctx, args)
        except TimeoutError:
            status, reason = ObservationStatus.TIMEOUT, f"timed out after {timeout:g}s"
        except Exception as exc:  # a tool's failure is an observation, not a crash
            status, reason = ObservationStatus.ERROR, f"{type(exc).__name__}: {exc}"
            reason = redact_values(reason, ctx.revealed)
            log.debug("tool %s failed: %s", name, reason)
        if status is not ObservationStatus.OK:
            obs = Observation(
                tool=name,
                action_type=action_type,
                status=status,
                summary=f"{status.value.lower()}: {reason}",
            )
            return obs, reason
        if verdict is not None and verdict.sensitive_fields:
            # Before anything keeps or shows it: the step log, the audit hash, the model.
            output, facts.redacted = redact(output, verdict.sensitive_fields)
        if ctx.revealed:  # a secret the call read never leaves it
            output = redact_values(output, ctx.revealed)
        full = _text(output)
        facts.result_sha256 = sha256_text(full)
        facts.source_ids = source_ids(output)
        facts.source_versions = source_versions(output)
        if len(full) > self.options.payload_inline_bytes:
            facts.result_payload = json.dumps(scrub(output), default=str, ensure_ascii=False)
        bounded, text, truncated = _bound(output, self.options.output_chars, full)
        obs = Observation(
            tool=name,
            action_type=action_type,
            status=ObservationStatus.OK,
            summary=text,
            output=bounded,
            truncated=truncated,
        )
        for hook in self.hooks:
            obs = await hook.after(ctx, tool, obs)
        return obs, None
