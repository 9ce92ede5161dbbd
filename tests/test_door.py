"""The door's shape (issue 29, point 1), without a database: ``Runtime`` keeps every use
case by name as a typed delegation to its domain's service, the rooms stay small, and the
domain packages never import the door."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import cortex_ray
from cortex_ray.runtime import RunRequest, Runtime
from cortex_ray.runtime._delegate import Delegate
from cortex_ray.runtime._governance import Governance

DOOR = Path(cortex_ray.__file__).parent / "runtime"

USE_CASES = [
    "list_agents",
    "get_agent",
    "create_agent",
    "update_agent",
    "start_run",
    "run_autonomous",
    "resume_run",
    "run_lease",
    "cancel_run",
    "list_runs",
    "get_run",
    "run_trace",
    "run_diagnostics",
    "turn_diagnostics",
    "run_status",
    "drive_run",
    "orphaned_runs",
    "give_up_run",
    "fail_run",
    "run_turn",
    "recover_turn",
    "orphaned_turns",
    "wait_turn",
    "end_session",
    "open_session",
    "get_session",
    "conversation",
    "accept_turn",
    "get_turn",
    "turn_trace",
    "authorize_turn",
    "authorize_end_session",
    "list_tools",
    "invoke_tool",
    "search_memory",
    "list_facts",
    "list_proposals",
    "decide_proposal",
    "eval_case_from_run",
    "save_eval_suite",
    "add_eval_case",
    "get_eval_suite",
    "list_eval_suites",
    "run_eval_suite",
    "get_eval_run",
    "list_eval_runs",
    "compare_eval_runs",
    "search_knowledge",
    "set_freshness_policy",
    "check_source_health",
    "source_health",
    "search_graph",
    "submit_triples",
    "set_collection_readers",
    "authenticate",
    "create_api_key",
    "revoke_api_key",
]


def test_every_use_case_is_a_delegation_with_its_service_signature() -> None:
    for name in USE_CASES:
        found = inspect.getattr_static(Runtime, name)
        assert isinstance(found, Delegate), name
        assert found.method_name == name
        assert found.__doc__ == found.__wrapped__.__doc__


def test_governance_delegates_reviews_and_schedules() -> None:
    for name in ("decide_approval", "label_run", "create_schedule", "fire_due_schedules"):
        assert isinstance(inspect.getattr_static(Governance, name), Delegate), name


def test_a_run_request_is_a_frozen_value() -> None:
    request = RunRequest("org", "agent", "a goal")
    assert request.max_steps is None and request.workflow is None
    try:
        request.goal = "another"  # type: ignore[misc]
    except AttributeError:
        pass
    else:
        raise AssertionError("RunRequest is not frozen")


def test_no_room_of_the_door_is_over_400_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in DOOR.glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 400} == {}


def test_the_domain_never_imports_the_door() -> None:
    core = DOOR.parent
    offenders = []
    for path in core.rglob("*.py"):
        if DOOR in path.parents or path.parent == core or core / "cli" in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "cortex_ray.runtime"
            ):
                offenders.append(str(path.relative_to(core)))
    assert offenders == []
