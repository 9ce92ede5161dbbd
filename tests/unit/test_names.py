"""The core's rules for names and text (``cortex_ray._names``), and the agent use case that
applies the name rule whatever the door (here: Python, on the fakes)."""

from __future__ import annotations

import re

import pytest
from fakes import FakeStore, FakeTransaction
from pydantic import BaseModel, ValidationError

from cortex_ray import (
    NAME_PATTERN,
    InvalidRequestError,
    SafeName,
    check_name,
    is_safe_name,
    json_problem,
    text_problem,
)
from cortex_ray._types import Principal
from cortex_ray.act import ToolRegistry, builtin_tools
from cortex_ray.runtime import AccessGate
from cortex_ray.runtime._agents import AgentUseCases

ADMIN = Principal(id="root", org_id="acme", is_admin=True)
SAFE = ["a", "A1", "ops.bot_2-x", "9lives", "x" * 128]
UNSAFE = [
    "",
    "../../../../etc/passwd",
    "..",
    ".hidden",
    "-rf",
    "_x",
    "a b",
    "a/b",
    "a:b",
    "a%2Fb",
    "é",
    "a\x00b",
    "a\ud800b",
    "a\n",
    "x" * 129,
]


@pytest.mark.parametrize("name", SAFE)
def test_safe_names_pass_every_form_of_the_rule(name: str) -> None:
    class Body(BaseModel):
        name: SafeName

    assert is_safe_name(name) and check_name("agent", name) == name
    assert Body(name=name).name == name
    assert re.fullmatch(NAME_PATTERN, name)


@pytest.mark.parametrize("name", UNSAFE)
def test_unsafe_names_are_refused_with_the_rule_in_words(name: str) -> None:
    class Body(BaseModel):
        name: SafeName

    assert not is_safe_name(name)
    with pytest.raises(InvalidRequestError, match="1 to 128 characters") as refused:
        check_name("agent", name)
    assert len(str(refused.value)) < 200  # the name is quoted cut, not whole
    str(refused.value).encode("utf-8")  # and printable (a surrogate is escaped)
    with pytest.raises(ValidationError, match="a name is 1 to 128 characters"):
        Body(name=name)


def test_a_long_name_is_quoted_cut_with_its_length() -> None:
    with pytest.raises(InvalidRequestError) as refused:
        check_name("agent", "/" * 100_000)
    assert "(100000 characters)" in str(refused.value)
    assert len(str(refused.value)) < 200


def test_text_and_json_problems() -> None:
    assert text_problem("fine, ünïcode ✓") is None
    assert text_problem("a\x00b") == "text must not contain NUL characters"
    assert text_problem("a\ud800b") == "text must be valid Unicode (no lone surrogates)"
    assert json_problem({"a": [1, {"b": "ok"}]}) is None
    assert json_problem({"a": [1, {"b": "a\x00"}]}) is not None
    assert json_problem({"k\ud800": 1}) is not None  # keys too
    deep: object = "x"
    for _ in range(40):
        deep = [deep]
    assert json_problem(deep) == "nested deeper than 32 levels"


@pytest.fixture
def agents(gate: AccessGate[FakeTransaction], fake_store: FakeStore) -> AgentUseCases:
    return AgentUseCases(gate, fake_store, ToolRegistry(builtin_tools()))


async def test_the_agent_use_case_refuses_an_unsafe_name_and_stores_nothing(
    agents: AgentUseCases, fake_store: FakeStore
) -> None:
    with pytest.raises(InvalidRequestError, match=re.escape("agent name '../../etc/passwd'")):
        await agents.create_agent("acme", "../../etc/passwd", principal=ADMIN)
    assert await fake_store.list_agents("acme") == []
    created = await agents.create_agent("acme", "  helper-1 ", principal=ADMIN)  # trimmed
    assert created.name == "helper-1"
