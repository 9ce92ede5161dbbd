"""The connector policy the invocation gate asks before a connector's tool runs.

Fail closed: a tool of a connector that is not registered, not installed in the
organisation, disabled, or not covered by a live grant of every principal the call acts for
(the agent's own, and in a conversation the caller's too: the same ∩ as tool grants) is
denied. A grant covers a call when it names the tool (or names none), its ``max_tier`` is at
least the tool's tier, it has not expired, and every constrained argument is present and
satisfies its constraint. Of the grants that cover a principal's call the least demanding
approval policy is that principal's; the call needs approval when any principal's does.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

import jsonschema
from jsonschema.protocols import Validator

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray._types import CapabilityTier, utcnow
from cortex_ray.governance._patterns import (
    BoundedValidator,
    InputLimits,
    PatternTimeout,
    check_patterns,
    pattern_budget,
)
from cortex_ray.governance._pins import is_mcp_instance
from cortex_ray.governance._store import GovernanceStore
from cortex_ray.governance._types import (
    APPROVAL_RANK,
    TIER_RANK,
    ApprovalPolicy,
    Connector,
    ConnectorGrant,
    ConnectorInstance,
    Verdict,
)

__all__ = ["REDACTED", "ConnectorPolicy", "check_constraints", "redact", "redact_values"]

REDACTED = "[REDACTED]"
_CACHE_ENTRIES = 10_000

_CONSTRAINT_KEYWORDS = frozenset(
    {
        "enum",
        "const",
        "type",
        "pattern",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "maxItems",
        "items",
    }
)


def check_constraints(
    constraints: Mapping[str, Any], max_pattern_chars: int = InputLimits.max_pattern_chars
) -> None:
    """Refuse constraints outside the supported JSON-schema subset (``InvalidRequestError``
    naming the argument and keyword), so a grant never holds a rule the gate cannot apply;
    and a pattern longer than ``max_pattern_chars`` or that does not compile."""

    def walk(arg: str, schema: Any) -> None:
        if not isinstance(schema, dict) or not schema:
            raise InvalidRequestError(f"constraint of {arg!r} must be a non-empty JSON object")
        for key, value in schema.items():
            if key not in _CONSTRAINT_KEYWORDS:
                raise InvalidRequestError(
                    f"constraint of {arg!r}: {key!r} is not supported "
                    f"(use {', '.join(sorted(_CONSTRAINT_KEYWORDS))})"
                )
            if key == "items":
                walk(arg, value)

    for arg, schema in constraints.items():
        if not isinstance(arg, str) or not arg:
            raise InvalidRequestError("constraints are keyed by argument name")
        walk(arg, schema)
    try:
        jsonschema.Draft202012Validator.check_schema(
            {"type": "object", "properties": dict(constraints)}
        )
    except jsonschema.SchemaError as exc:
        raise InvalidRequestError(f"invalid constraint: {exc.message}") from exc
    check_patterns(dict(constraints), max_pattern_chars, where="constraints")


def redact(value: Any, fields: frozenset[str]) -> tuple[Any, int]:
    """``value`` with every dict entry whose key (lowercased) is in ``fields`` replaced by
    ``[REDACTED]``, at any depth; and how many were replaced."""
    if not fields:
        return value, 0
    count = 0

    def walk(v: Any) -> Any:
        nonlocal count
        if isinstance(v, dict):
            out = {}
            for k, item in v.items():
                if isinstance(k, str) and k.lower() in fields:
                    out[k] = REDACTED
                    count += 1
                else:
                    out[k] = walk(item)
            return out
        if isinstance(v, list | tuple):
            return [walk(item) for item in v]
        return v

    return walk(value), count


def redact_values(value: Any, secrets: Sequence[str]) -> Any:
    """``value`` with every occurrence of each secret (in any string, at any depth, keys
    too) replaced by ``[REDACTED]``."""
    needles = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not needles:
        return value

    def text(s: str) -> str:
        for needle in needles:
            s = s.replace(needle, REDACTED)
        return s

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return text(v)
        if isinstance(v, dict):
            return {text(k) if isinstance(k, str) else k: walk(i) for k, i in v.items()}
        if isinstance(v, list | tuple):
            return [walk(i) for i in v]
        return v

    return walk(value)


class ConnectorPolicy:
    """Connector definitions (registered in code) and the decision on each call."""

    def __init__(
        self,
        store: GovernanceStore,
        connectors: Iterable[Connector] = (),
        *,
        cache_s: float = 0.0,
        pattern_budget_s: float = InputLimits.pattern_budget_s,
    ) -> None:
        self.store = store
        self.cache_s = cache_s
        self.pattern_budget_s = pattern_budget_s
        """All of a grant's pattern matches for one call together, at most (see
        ``_patterns``: a catastrophic pattern denies the call instead of hanging it)."""
        """How long the instance and grants read for a call are reused (0: never)."""
        self._cache: dict[
            tuple[str, str, tuple[str, ...]],
            tuple[float, ConnectorInstance | None, list[ConnectorGrant]],
        ] = {}
        self.connectors: dict[str, Connector] = {}
        self._validators: dict[tuple[UUID, str], Validator] = {}
        for connector in connectors:
            self.register(connector)

    def invalidate(self, org_id: str) -> None:
        """Forget what was read for ``org_id`` (its grants or instances changed)."""
        for key in [k for k in self._cache if k[0] == org_id]:
            self._cache.pop(key, None)

    async def _for_call(
        self, org_id: str, connector: str, principal_ids: Sequence[str]
    ) -> tuple[ConnectorInstance | None, list[ConnectorGrant]]:
        if self.cache_s <= 0:
            return await self.store.for_call(org_id, connector, principal_ids)
        key = (org_id, connector, tuple(principal_ids))
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1], hit[2]
        instance, grants = await self.store.for_call(org_id, connector, principal_ids)
        if len(self._cache) >= _CACHE_ENTRIES:
            self._cache.clear()
        self._cache[key] = (now + self.cache_s, instance, grants)
        return instance, grants

    def register(self, connector: Connector) -> None:
        if not connector.name.isidentifier():
            raise ValueError(f"connector names must be identifiers: {connector.name!r}")
        self.connectors[connector.name] = connector

    async def check(
        self,
        *,
        org_id: str,
        principal_ids: Sequence[str],
        connector: str,
        tool: str,
        tier: CapabilityTier,
        args: Mapping[str, Any],
    ) -> Verdict:
        """Decide one call (see the module docstring)."""
        definition = self.connectors.get(connector)
        instance, grants = await self._for_call(org_id, connector, principal_ids)
        if definition is None and (instance is None or not is_mcp_instance(instance)):
            # A code connector is registered here; an MCP server's registration is its row.
            return Verdict("deny", f"connector {connector!r} is not registered")
        if instance is None:
            return Verdict("deny", f"connector {connector!r} is not installed in this organisation")
        if not instance.enabled:
            return Verdict("deny", f"connector {connector!r} is disabled in this organisation")
        now = utcnow()
        used: list[UUID] = []
        approval = ApprovalPolicy.NEVER
        for principal in principal_ids:
            mine = [g for g in grants if g.principal_id in (principal, "*")]
            if not mine:
                return Verdict("deny", f"{principal} has no grant of connector {connector!r}")
            best: ConnectorGrant | None = None
            why = ""
            for grant in mine:
                why = self._why_not(grant, tool, tier, args, now) or ""
                if not why and (
                    best is None or APPROVAL_RANK[grant.approval] < APPROVAL_RANK[best.approval]
                ):
                    best = grant
            if best is None:
                return Verdict(
                    "deny", f"no grant of {connector!r} allows this call for {principal}: {why}"
                )
            used.append(best.id)
            if APPROVAL_RANK[best.approval] > APPROVAL_RANK[approval]:
                approval = best.approval
        fields = frozenset(
            f.lower()
            for f in (
                *(definition.sensitive_fields if definition is not None else ()),
                *instance.config.get("redact_fields", ()),
            )
            if isinstance(f, str)
        )
        needs = approval is ApprovalPolicy.ALWAYS or (
            approval is ApprovalPolicy.WRITES and tier is not CapabilityTier.READ
        )
        if needs:
            return Verdict(
                "approval",
                f"the grant of {connector!r} requires approval ({approval.value}, {tier.value})",
                tuple(used),
                fields,
            )
        return Verdict("allow", f"connector grant {connector!r}", tuple(used), fields)

    def _why_not(
        self,
        grant: ConnectorGrant,
        tool: str,
        tier: CapabilityTier,
        args: Mapping[str, Any],
        now: Any,
    ) -> str | None:
        if grant.expires_at is not None and grant.expires_at <= now:
            return f"grant {grant.id} expired at {grant.expires_at.isoformat()}"
        if grant.tools and tool not in grant.tools:
            return f"grant {grant.id} does not cover tool {tool!r}"
        if TIER_RANK[tier] > TIER_RANK[grant.max_tier]:
            return f"tool {tool!r} is {tier.value}, above grant {grant.id}'s {grant.max_tier.value}"
        for arg, schema in grant.constraints.items():
            if arg not in args:
                return f"argument {arg!r} is constrained by grant {grant.id} and missing"
            key = (grant.id, arg)
            validator = self._validators.get(key)
            if validator is None:
                validator = BoundedValidator(schema)
                self._validators[key] = validator
            try:
                with pattern_budget(self.pattern_budget_s):
                    error = jsonschema.exceptions.best_match(validator.iter_errors(args[arg]))
            except PatternTimeout as slow:
                # Fail closed: a constraint that cannot be decided in time allows nothing.
                return (
                    f"argument {arg!r} could not be checked against grant {grant.id}: its "
                    f"pattern {slow.pattern[:100]!r} did not finish within "
                    f"{self.pattern_budget_s} s"
                )
            if error is not None:
                return f"argument {arg!r} not allowed by grant {grant.id}: {error.message}"
        return None
