"""What every body shares: camelCase on the wire, unknown request fields refused, free
text without NUL characters or lone surrogates (PostgreSQL cannot store them), anywhere in
a body, free-form objects included (the core's ``text_problem``/``json_problem``); names of
addressable objects in the core's safe set (``SafeName``); numbers that are JSON numbers
(``Int``, ``Number``); the error body; health; the principal and its grant."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictFloat, StrictInt
from pydantic.alias_generators import to_camel

from cortex_ray import MAX_JSON_DEPTH as _MAX_JSON_DEPTH
from cortex_ray import ActionType, Grant, Principal, PrincipalKind, json_problem, text_problem
from cortex_ray import SafeName as _SafeName

ORG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
"""Organisation ids, as the ``organisations`` table's CHECK constraint allows them."""

MAX_TEXT = 20_000
MAX_JSON_DEPTH = _MAX_JSON_DEPTH


def _clean(value: str) -> str:
    if (reason := text_problem(value)) is not None:
        raise ValueError(reason)
    return value


def has_bad_text(value: Any, depth: int = 0) -> str | None:
    """Why a free-form JSON value cannot be stored (NUL, lone surrogate, too deep), or None
    (the core's ``json_problem``)."""
    return json_problem(value, depth)


def _clean_json(value: dict[str, Any]) -> dict[str, Any]:
    reason = has_bad_text(value)
    if reason is not None:
        raise ValueError(reason)
    return value


Text = Annotated[str, AfterValidator(_clean)]
Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_clean)]
"""A free-form label or a reference (an id or a name): any text of 1 to 200 characters."""
SafeName = _SafeName
"""The name of an object addressed by name in a path (the core's safe set, ``cortex_ray.
NAME_PATTERN``): agents, workflows, secrets, connectors, eval suites, collections."""
LongText = Annotated[str, Field(max_length=MAX_TEXT), AfterValidator(_clean)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_clean_json)]

# Numbers in a JSON body are JSON numbers, on every route: "3" (a string) and true (a
# boolean) are refused, not coerced. (Query and path parameters are text by nature, and
# parsed as numbers.) A Number field accepts an integer too (3 for 3.0).
Int = StrictInt
Number = StrictFloat


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
