"""What every body shares: camelCase on the wire, unknown request fields refused, free
text without NUL characters or lone surrogates (PostgreSQL cannot store them), anywhere in
a body, free-form objects included; the error body; health; the principal and its grant."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from cortex_ray import ActionType, Grant, Principal, PrincipalKind

ORG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
"""Organisation ids, as the ``organisations`` table's CHECK constraint allows them."""

MAX_TEXT = 20_000
MAX_JSON_DEPTH = 32


def _clean(value: str) -> str:
    if "\x00" in value:
        raise ValueError("text must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return value


def has_bad_text(value: Any, depth: int = 0) -> str | None:
    """Why a free-form JSON value cannot be stored (NUL, lone surrogate, too deep), or None."""
    if depth > MAX_JSON_DEPTH:
        return f"nested deeper than {MAX_JSON_DEPTH} levels"
    items: list[Any]
    if isinstance(value, str):
        items = []
        try:
            _clean(value)
        except ValueError as exc:
            return str(exc)
    elif isinstance(value, dict):
        for key in value:
            if (reason := has_bad_text(key, depth + 1)) is not None:
                return reason
        items = list(value.values())
    elif isinstance(value, list):
        items = value
    else:
        return None
    for item in items:
        if (reason := has_bad_text(item, depth + 1)) is not None:
            return reason
    return None


def _clean_json(value: dict[str, Any]) -> dict[str, Any]:
    reason = has_bad_text(value)
    if reason is not None:
        raise ValueError(reason)
    return value


Text = Annotated[str, AfterValidator(_clean)]
Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_clean)]
LongText = Annotated[str, Field(max_length=MAX_TEXT), AfterValidator(_clean)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_clean_json)]


class _Body(BaseModel):
    """Requests: camelCase on the wire, unknown fields are an error."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class _Out(BaseModel):
    """Responses: camelCase on the wire."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


# errors ----------------------------------------------------------------------------------


class ErrorDetail(_Out):
    """One reason a request was refused (validation errors name the field)."""

    loc: list[str | int] = Field(default_factory=list, description="where: body, query, path")
    msg: str
    type: str = ""


class ErrorBody(_Out):
    code: str = Field(description="a stable machine-readable code, e.g. not_found")
    message: str = Field(description="what went wrong, for a person")
    details: list[ErrorDetail] = Field(default_factory=list)
    correlation_id: str = Field(
        description="the request's correlation id (also the X-Correlation-Id header): the "
        "server log has the full detail under it"
    )


class ApiError(_Out):
    """The body of every 4xx and 5xx response."""

    error: ErrorBody


# health ----------------------------------------------------------------------------------


class Health(_Out):
    status: Literal["ok", "ready"]


# principals ------------------------------------------------------------------------------


class GrantBody(_Body):
    """What a principal may invoke: tool names (``"*"`` for all) and whole action types."""

    tools: list[Name] = Field(default_factory=list, max_length=256)
    action_types: list[ActionType] = Field(default_factory=list, max_length=4)

    def to_grant(self) -> Grant:
        return Grant(tools=frozenset(self.tools), action_types=frozenset(self.action_types))


def _grant_body(grant: Grant | None) -> GrantBody | None:
    if grant is None:
        return None
    return GrantBody(tools=sorted(grant.tools), action_types=sorted(grant.action_types))


class PrincipalBody(_Out):
    id: str
    org_id: str
    kind: PrincipalKind
    name: str
    is_admin: bool
    grant: GrantBody | None

    @classmethod
    def of(cls, principal: Principal) -> PrincipalBody:
        return cls(
            id=principal.id,
            org_id=principal.org_id,
            kind=principal.kind,
            name=principal.name,
            is_admin=principal.is_admin,
            grant=_grant_body(principal.grant),
        )
