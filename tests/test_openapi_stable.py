"""The HTTP API's published shape is pinned: the OpenAPI document (paths, methods,
operationIds, parameters, status codes, request and response schemas) and the order in
which routes that could match the same request are tried.

Built without Ray or a database: ``create_app`` with no runtime only declares the routes.
``CORTEX_UPDATE_GOLDEN=1`` rewrites the golden files (review the diff: a change here is a
change of the public API).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts

from serve import ApiOptions, create_app

GOLDEN = Path(__file__).with_name("golden")
OPERATIONS = GOLDEN / "openapi_operations.json"
DOCUMENT = GOLDEN / "openapi.json"
# Two bodies share the class name GrantBody (a principal's tool grant, a connector grant), so
# the document names their schemas by module; the modules moved when the routes were split
# by domain (issue 29). Only these names differ from the golden file; every $ref follows.
MOVED = {
    "serve___schemas__GrantBody": "serve__schemas___common__GrantBody",
    "serve___governance__GrantBody": "serve__schemas__governance__GrantBody",
}
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return create_app(None, options=ApiOptions())


def operations(doc: dict[str, Any]) -> list[dict[str, str]]:
    """Every operation, sorted: path, method and operationId."""
    found = [
        {"path": path, "method": method, "operationId": op["operationId"]}
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in _METHODS
    ]
    return sorted(found, key=lambda o: (o["path"], o["method"]))


def _overlap(a: str, b: str) -> bool:
    """Whether one request path could match both route templates."""
    sa, sb = a.strip("/").split("/"), b.strip("/").split("/")
    if len(sa) != len(sb):
        return False
    return all(x == y or "{" in x + y for x, y in zip(sa, sb, strict=True))


def route_order(app: FastAPI) -> list[list[str]]:
    """Pairs of routes (``METHOD path``) that one request could match, in the order the
    router tries them: the first one wins, so their order is behaviour."""
    routes = [
        (method, route.path or "")
        for route in iter_route_contexts(app.routes)
        for method in sorted(route.methods or ())
    ]
    assert len(routes) > len(operations(app.openapi()))  # (+ HEAD of the docs routes)
    return [
        [f"{m1} {p1}", f"{m2} {p2}"]
        for i, (m1, p1) in enumerate(routes)
        for m2, p2 in routes[i + 1 :]
        if m1 == m2 and p1 != p2 and _overlap(p1, p2)
    ]


def _dump(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _check(path: Path, value: Any, renamed: dict[str, str] | None = None) -> None:
    if os.environ.get("CORTEX_UPDATE_GOLDEN"):
        path.write_text(_dump(value), encoding="utf-8")
    assert path.exists(), f"missing golden file {path}; run with CORTEX_UPDATE_GOLDEN=1"
    golden = path.read_text(encoding="utf-8")
    for old, new in (renamed or {}).items():
        golden = golden.replace(f'"{old}"', f'"{new}"').replace(f'/{old}"', f'/{new}"')
    assert json.loads(golden) == json.loads(_dump(value))


def test_operations_are_stable(app: FastAPI) -> None:
    doc = app.openapi()
    pinned = {"operations": operations(doc), "routeOrder": route_order(app)}
    _check(OPERATIONS, pinned)


def test_openapi_document_is_stable(app: FastAPI) -> None:
    _check(DOCUMENT, app.openapi(), MOVED)
