"""Approvals on real Ray (issue 18, point 3): a run driven by its run actor pauses on an
approval request and its actor goes away (nothing waits in a process); approved in this
process, a new run actor carries out the approved call without deciding the step again.

The actors open their runtime in their own processes from ``ApprovalRuntime``, shipped by
value like ``tests/test_actors.py``'s factory (with the modules it uses)."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from actors import SessionManager, SessionPolicy  # noqa: E402
from cortex_ray import Principal, RunStatus, Runtime, Settings  # noqa: E402
from cortex_ray.governance import ApprovalStatus  # noqa: E402
from cortex_ray.memory import HeuristicImportanceScorer  # noqa: E402
from cortex_ray.models import HashEmbedder, ScriptedModelClient  # noqa: E402
from cortex_ray.storage import Database  # noqa: E402
from tests.test_approvals import open_runtime, paused_run, plan  # noqa: E402
from tests.test_connector_grants import CRM, TOOLS  # noqa: E402

for name in (__name__, "tests.test_approvals", "tests.test_connector_grants"):
    ray.cloudpickle.register_pickle_by_value(sys.modules[name])


@dataclass(frozen=True)
class ApprovalRuntime:
    """The runtime factory the actors get: the scripted planner and the CRM connector."""

    async def __call__(self, settings: Settings) -> Runtime:
        return await Runtime.open(
            settings.model_copy(update={"embedding_backend": "hash", "candidates": 1}),
            model=ScriptedModelClient(responder=plan),
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            tools=TOOLS,
            connectors=[CRM],
        )


def live_run_actors(namespace: str, org: str) -> set[str]:
    return {
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == namespace and a["name"].startswith(f"{org}/run/")
    }


async def test_a_paused_run_holds_no_actor_and_a_new_one_carries_out_the_approval(
    ray_cluster: Any, db: Database, settings: Settings, org: str
) -> None:
    actor_settings = settings.model_copy(update={"database_url": db.dsn, "pool_max_size": 2})
    local = await open_runtime(db, settings)
    namespace = f"test-approvals-{uuid.uuid4().hex[:8]}"
    sessions = SessionManager(
        actor_settings, factory=ApprovalRuntime(), policy=SessionPolicy(namespace=namespace)
    )
    try:
        # The agent, connector and grant (approval for writes), and a first run paused here.
        await paused_run(local, org)
        run = await local.start_run(org, "clerk", "update ann", max_steps=5)
        await sessions.start_run(org, run.id)
        assert await sessions.wait_run(org, run.id) is RunStatus.AWAITING_APPROVAL
        assert await _gone(namespace, org)  # nothing holds the paused run
        [request] = await local.governance.list_approvals(org, run_id=run.id)
        await local.governance.decide_approval(
            org, request.id, approve=True, principal=Principal(id="root", org_id=org, is_admin=True)
        )
        await sessions.start_run(org, run.id)  # a new actor
        assert await sessions.wait_run(org, run.id) is RunStatus.COMPLETED
        done = await local.store.get_run(org, run.id, recordings=True)
        assert [s.step_index for s in done.steps] == [0, 1, 2]
        approved_step = done.steps[1]
        assert approved_step.recording is not None
        assert approved_step.recording.model_calls == ()  # carried out, not decided again
        rows = await local.store.audit_rows(org, run_id=run.id, gate_only=True)
        assert [(r["tool"], r["decision"]) for r in rows] == [
            ("crm_lookup", "allowed"),
            ("crm_update", "approval_required"),
            ("crm_update", "allowed"),
        ]
        assert (await local.governance.get_approval(org, request.id)).status is (
            ApprovalStatus.APPROVED
        )
    finally:
        await local.close(close_db=False)


async def _gone(namespace: str, org: str) -> bool:
    import asyncio

    for _ in range(200):  # the actor exits once its drive returns
        if not live_run_actors(namespace, org):
            return True
        await asyncio.sleep(0.05)
    return False


@dataclass(frozen=True)
class TurnApprovalRuntime:
    """The session actors' runtime: the scripted chat model of ``tests/test_turn_approvals``
    (one crm_update round, then a reply), polling its approval request every 50 ms."""

    async def __call__(self, settings: Settings) -> Runtime:
        from tests.test_turn_approvals import chat

        return await Runtime.open(
            settings.model_copy(update={"embedding_backend": "hash", "approval_poll_s": 0.05}),
            model=ScriptedModelClient(responder=chat),
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            tools=TOOLS,
            connectors=[CRM],
        )


async def test_a_session_actor_killed_while_its_turn_waits_finds_the_request_again(
    ray_cluster: Any, db: Database, settings: Settings, org: str
) -> None:
    """The turn streams approval_required out of its session actor and waits there; the
    actor is killed; the turn, recovered by a new actor, finds the same request (no second
    one), and once an admin approves it here the call runs once and the turn replies."""
    import asyncio

    import tests.test_turn_approvals as turns
    from cortex_ray import TurnEvent, TurnEventKind
    from cortex_ray.storage import TurnStatus

    ray.cloudpickle.register_pickle_by_value(turns)
    short = settings.sessions.model_copy(
        update={"turn_lease_ttl_s": 1.5, "turn_orphan_grace_s": 0.0}
    )
    actor_settings = settings.model_copy(
        update={"database_url": db.dsn, "pool_max_size": 2, "sessions": short}
    )
    local = await turns.open_runtime(db, settings.model_copy(update={"sessions": short}))
    namespace = f"test-turn-approvals-{uuid.uuid4().hex[:8]}"
    sessions = SessionManager(
        actor_settings, factory=TurnApprovalRuntime(), policy=SessionPolicy(namespace=namespace)
    )
    try:
        session = await turns.world(local, org)
        caller = turns.caller(org)
        accepted = await local.accept_turn(org, session.id, "move ann to eu", principal=caller)
        events: list[TurnEvent] = []
        first = asyncio.ensure_future(
            sessions.turn(
                org, session.id, caller, accepted.message, turn_id=accepted.id,
                on_event=events.append,
            )
        )  # fmt: skip
        request = await turns.pending(local, org)
        for _ in range(400):  # the event crossed from the actor
            if any(e.kind is TurnEventKind.APPROVAL_REQUIRED for e in events):
                break
            await asyncio.sleep(0.05)
        [asked] = [e for e in events if e.kind is TurnEventKind.APPROVAL_REQUIRED]
        assert asked.approval_id == request.id and request.turn_id == accepted.id
        handle = ray.get_actor(f"{org}/session/{session.id}", namespace=namespace)
        ray.kill(handle, no_restart=True)  # the actor dies while the turn waits
        with pytest.raises(Exception):  # noqa: B017 - whichever error the dead actor gives
            await asyncio.wait_for(first, 60)
        for _ in range(400):  # its lease expires: an orphan, as the supervisor sees it
            if accepted.id in {o.turn_id for o in await local.orphaned_turns()}:
                break
            await asyncio.sleep(0.1)
        await sessions.recover_turn(org, session.id, accepted.id)  # a new actor drives it
        await asyncio.sleep(0.5)
        await local.governance.decide_approval(
            org, request.id, approve=True, principal=turns.admin(org)
        )
        ended = await local.wait_turn(org, session.id, accepted.id, 60)
        assert ended.status is TurnStatus.DONE and ended.reply == "updated ann"
        assert [a.id for a in await local.governance.list_approvals(org)] == [request.id]
        rows = await local.store.audit_rows(org, gate_only=True)
        calls = [(r["tool"], r["decision"]) for r in rows if r["tool"] == "crm_update"]
        assert calls.count(("crm_update", "allowed")) == 1  # the write ran once
    finally:
        await local.close(close_db=False)
