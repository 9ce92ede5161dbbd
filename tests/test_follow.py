"""``resume_or_wait``: the use case behind ``cortex-ray runs resume [--wait]``, without a
database: a fake runtime answers the lease and status questions in a scripted order."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any
from uuid import UUID, uuid4

import pytest

from cortex_ray._types import Principal, RunStatus, TaskRun
from cortex_ray.runtime._follow import resume_or_wait
from cortex_ray.storage import LeaseHolder

ORG = "acme"
OPERATOR = Principal.operator(ORG)


def _holder(owner: str | None) -> LeaseHolder:
    expires = datetime(2026, 1, 1, tzinfo=UTC) if owner else None
    return LeaseHolder(owner=owner, expires_at=expires, token=1, attempts=1, live=owner is not None)


@dataclass
class _FakeRuntime:
    """Answers ``run_lease`` from ``holders`` and ``run_status`` from ``statuses`` in order;
    ``resume_run`` and ``get_run`` return the run with ``ends_as`` once it ended."""

    run: TaskRun
    holders: list[LeaseHolder]
    statuses: list[RunStatus] = field(default_factory=list)
    resumed: int = 0
    settings: Any = field(
        default_factory=lambda: SimpleNamespace(runs=SimpleNamespace(lease_renew_s=0.001))
    )

    async def resume_run(self, org_id: str, run_id: UUID, *, principal: Principal) -> TaskRun:
        self.resumed += 1
        return self.run

    async def run_lease(self, org_id: str, run_id: UUID, *, principal: Principal) -> LeaseHolder:
        return self.holders.pop(0)

    async def run_status(self, org_id: str, run_id: UUID, *, principal: Principal) -> RunStatus:
        status = self.statuses.pop(0)
        self.run = self.run.model_copy(update={"status": status})
        return status

    async def get_run(self, org_id: str, run_id: UUID, *, principal: Principal) -> TaskRun:
        return self.run


def _running() -> TaskRun:
    return TaskRun(org_id=ORG, agent_id=uuid4(), goal="g", max_steps=3)


async def test_a_run_another_driver_holds_is_left_to_it_and_the_caller_told() -> None:
    fake = _FakeRuntime(_running(), holders=[_holder("api-1")])
    told: list[tuple[str | None, bool]] = []
    run = await resume_or_wait(
        fake, ORG, fake.run, principal=OPERATOR, poll_s=0.001, wait=False,
        on_busy=lambda r, h, waiting: told.append((h.owner, waiting)),
    )  # fmt: skip
    assert run.status is RunStatus.RUNNING
    assert told == [("api-1", False)]
    assert fake.resumed == 0  # refused before any drive: nothing prepared, nothing touched


async def test_a_free_run_is_driven_here() -> None:
    fake = _FakeRuntime(_running(), holders=[_holder(None)])
    ended = fake.run.model_copy(update={"status": RunStatus.COMPLETED})
    driven: list[TaskRun] = []

    async def drive(current: TaskRun) -> TaskRun:
        driven.append(current)
        return ended

    run = await resume_or_wait(
        fake, ORG, fake.run, principal=OPERATOR, poll_s=0.001, wait=False,
        on_busy=lambda r, h, waiting: pytest.fail("not busy"), drive=drive,
    )  # fmt: skip
    assert run is ended and len(driven) == 1 and fake.holders == []


async def test_waiting_tells_once_and_takes_the_run_over_when_its_lease_falls_free() -> None:
    fake = _FakeRuntime(
        _running(),
        holders=[_holder("api-1"), _holder("api-1"), _holder(None)],
        statuses=[RunStatus.RUNNING, RunStatus.RUNNING],
    )
    told: list[bool] = []
    driven: list[UUID] = []

    async def drive(current: TaskRun) -> TaskRun:
        driven.append(current.id)  # the takeover: driven here, it finishes
        fake.run = current.model_copy(update={"status": RunStatus.COMPLETED})
        return fake.run

    run = await resume_or_wait(
        fake, ORG, fake.run, principal=OPERATOR, poll_s=0.001, wait=True,
        on_busy=lambda r, h, waiting: told.append(waiting), drive=drive,
    )  # fmt: skip
    assert run.status is RunStatus.COMPLETED
    assert told == [True]
    assert len(driven) == 1  # not driven while held; driven once its lease fell free


async def test_waiting_ends_with_the_run_as_its_other_driver_finished_it() -> None:
    fake = _FakeRuntime(_running(), holders=[_holder("api-1")], statuses=[RunStatus.FAILED])
    run = await resume_or_wait(
        fake, ORG, fake.run, principal=OPERATOR, poll_s=0.001, wait=True,
        on_busy=lambda r, h, waiting: None,
    )  # fmt: skip
    assert run.status is RunStatus.FAILED
    assert fake.resumed == 0
