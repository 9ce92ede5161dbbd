"""The evaluation routes (issue 14, point 6) through the in-process app on the embedded
PostgreSQL, with a scripted model.

A run is recorded for real (``record_decisions`` is on by default): K=3 candidates judged in
``choice`` mode. Through HTTP it becomes a case of a suite, and the suite replays it under
the DECIDE settings it was recorded with (every case passes, whatever the server's own
settings say). Replayed again with the override ``{"evaluation": "scores"}``, the replay
asks for a model call the recording does not have: the case fails with its divergence,
and the comparison of the two suite runs lists it as broken. Bad input is a 4xx with its
reason and stores nothing; another organisation sees nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest

from cortex_ray import AgentMode, Grant, InProcessExecutor, Principal, Runtime, Settings
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient
from cortex_ray.storage import Database, Store
from serve import create_app

GOAL = "Tell me the time."
SUITE = "clock-regressions"
CASE = "clock-time"


def respond(request: ChatRequest) -> str:
    """Step 1: read the clock or guess (two candidates, judged); then finish."""
    props = (request.response_schema or {}).get("properties", {})
    text = "\n".join(m.content or "" for m in request.messages)
    if request.schema_name == "proposals":
        if "Step 1 of" in text:
            candidates = [
                {"tool": "current_time", "args": {}, "rationale": "read the clock"},
                {"finish": True, "message": "too early", "rationale": "a guess"},
            ]
        else:
            candidates = [{"finish": True, "message": "It is time.", "rationale": "done"}]
        return json.dumps({"candidates": candidates})
    if request.schema_name == "choice":
        listed = props["best"]["enum"]
        return json.dumps({"assessments": ["ok"] * len(listed), "best": listed[0]})
    if request.schema_name == "scores":
        n = int(props["scores"].get("maxItems", 1))
        return json.dumps({"scores": [9] + [2] * (n - 1)})
    if request.schema_name == "judgement":
        meets = "Final result: It is time." in text
        return json.dumps({"reason": "it says so" if meets else "no time given", "meets": meets})
    if "importance" in props:
        return json.dumps({"importance": 5})
    raise AssertionError(f"unexpected model call {request.schema_name!r}")


@dataclass
class Server:
    runtime: Runtime
    http: httpx2.AsyncClient


@pytest.fixture
async def server(settings: Settings, db: Database) -> AsyncIterator[Callable[..., Any]]:
    """``await server(**settings)``: a runtime with these settings (on the shared database)
    and an HTTP client of the app serving it; ``modelless=True``: a runtime without a model."""
    opened: list[tuple[Runtime, InProcessExecutor, httpx2.AsyncClient]] = []

    async def make(*, modelless: bool = False, **update: Any) -> Server:
        runtime = await Runtime.open(
            settings.model_copy(update={"embedding_backend": "hash", **update}),
            model=None if modelless else ScriptedModelClient(responder=respond),
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            db=db,
        )
        executor = InProcessExecutor(runtime)
        transport = httpx2.ASGITransport(app=create_app(runtime, executor))
        client = httpx2.AsyncClient(transport=transport, base_url="http://api")
        opened.append((runtime, executor, client))
        return Server(runtime, client)

    yield make
    for runtime, executor, client in opened:
        await client.aclose()
        await executor.aclose()
        await runtime.close(close_db=False)


async def member_key(store: Store, org: str, pid: str = "ada") -> dict[str, str]:
    """A bearer key of a member (not an admin) of ``org``."""
    await store.ensure_org(org)
    principal = Principal(id=pid, org_id=org, name=pid, grant=Grant(tools=frozenset({"*"})))
    key, _ = await store.create_api_key(principal, f"{pid} key")
    return {"Authorization": f"Bearer {key}"}


async def recorded_run(runtime: Runtime, org: str) -> uuid.UUID:
    agent = await runtime.create_agent(
        org, f"clock-{uuid.uuid4().hex[:6]}", mode=AgentMode.AUTONOMOUS
    )
    run = await runtime.run_autonomous(org, agent.id, GOAL)
    assert run.status.value == "COMPLETED", run
    return run.id


def assert_error(r: httpx2.Response, status: int, *fragments: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    message = str(r.json()["error"]["message"])
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


K3 = {"candidates": 3}


async def test_a_recorded_run_becomes_a_case_that_replays_and_then_breaks(
    server: Callable[..., Any], store: Store, org: str
) -> None:
    choice = await server(**K3, evaluation="choice")
    scores = await server(**K3, evaluation="scores")
    ada = await member_key(store, org)
    base = f"/api/orgs/{org}/evals"
    run_id = await recorded_run(choice.runtime, org)

    # The run becomes the first case of a new suite: version 1.
    r = await choice.http.post(
        f"{base}/suites/{SUITE}/cases", headers=ada, json={"runId": str(run_id), "case": CASE}
    )
    assert r.status_code == 201, r.text
    summary = r.json()
    assert (summary["name"], summary["version"], summary["cases"]) == (SUITE, 1, 1)
    assert summary["created_by"] == "ada"

    listed = (await choice.http.get(f"{base}/suites", headers=ada)).json()["suites"]
    assert [(s["name"], s["version"], s["cases"]) for s in listed] == [(SUITE, 1, 1)]

    r = await choice.http.get(f"{base}/suites/{SUITE}", headers=ada, params={"version": 1})
    assert r.status_code == 200, r.text
    suite = r.json()
    (case,) = suite["cases"]
    assert case["name"] == CASE and case["description"] == GOAL
    assert [c["kind"] for c in case["checks"]] == ["status", "same_decisions"]
    cassette = case["cassette"]
    assert cassette["source_run"] == str(run_id) and cassette["status"] == "COMPLETED"
    assert [s["decision"] for s in cassette["steps"]] == ["ACT", "FINISH"]
    assert cassette["steps"][0]["tool"] == "current_time"
    # Step 1's recording holds both its calls: the proposals and the choice among them.
    assert [c["schema_name"] for c in cassette["steps"][0]["model_calls"]] == [
        "proposals",
        "choice",
    ]

    assert (cassette["settings"]["candidates"], cassette["settings"]["evaluation"]) == (3, "choice")

    # Replayed by a server whose own settings score the candidates: a case replays under
    # the settings it was recorded with, so every decision is as recorded.
    r = await scores.http.post(f"{base}/runs", headers=ada, json={"suite": SUITE})
    assert r.status_code == 201, r.text
    passing = r.json()
    assert (passing["suite"], passing["suite_version"], passing["mode"]) == (SUITE, 1, "replay")
    assert (passing["passed"], passing["total"]) == (1, 1)
    assert passing["metrics"]["success_rate"] == 1.0
    assert passing["metrics"]["tool_correctness"] == 1.0
    assert passing["metrics"]["diverged"] == 0
    (result,) = passing["results"]
    assert result["case"] == CASE and result["passed"] is True
    assert all(v["passed"] is True for v in result["verdicts"])
    assert result["outcome"]["status"] == "COMPLETED"
    assert result["outcome"]["result"] == "It is time."
    assert result["outcome"]["divergence"] is None

    # Overridden to score the candidates instead: at step 1 the planner asks for scores,
    # which the recording does not have.
    r = await choice.http.post(
        f"{base}/runs",
        headers=ada,
        json={"suite": SUITE, "version": 1, "overrides": {"evaluation": "scores"}},
    )
    assert r.status_code == 201, r.text
    failing = r.json()
    assert (failing["passed"], failing["total"]) == (0, 1)
    assert failing["metrics"]["success_rate"] == 0.0
    assert failing["metrics"]["diverged"] == 1
    (result,) = failing["results"]
    assert result["passed"] is False
    divergence = result["outcome"]["divergence"]
    assert (divergence["step_index"], divergence["what"]) == (0, "model_call")
    assert "choice" in divergence["recorded"] and "scores" in divergence["replayed"]
    verdicts = {v["kind"]: v for v in result["verdicts"]}
    assert verdicts["status"]["passed"] is False
    assert verdicts["same_decisions"]["passed"] is False
    assert "step 1 (model_call)" in verdicts["same_decisions"]["detail"]

    # Both runs are stored, newest first, and read back with their results.
    r = await choice.http.get(f"{base}/runs", headers=ada, params={"suite": SUITE})
    assert [x["id"] for x in r.json()["runs"]] == [failing["id"], passing["id"]]
    assert all("results" not in x for x in r.json()["runs"])
    r = await choice.http.get(f"{base}/runs", headers=ada, params={"limit": 1})
    assert [x["id"] for x in r.json()["runs"]] == [failing["id"]]
    assert (
        await choice.http.get(f"{base}/runs", headers=ada, params={"suite": "other"})
    ).json() == {"runs": []}
    r = await choice.http.get(f"{base}/runs/{failing['id']}", headers=ada)
    assert r.status_code == 200 and r.json()["results"] == failing["results"]

    r = await choice.http.get(
        f"{base}/compare", headers=ada, params={"a": passing["id"], "b": failing["id"]}
    )
    assert r.status_code == 200, r.text
    comparison = r.json()
    assert comparison["broken"] == [CASE] and comparison["fixed"] == []
    assert comparison["a"]["id"] == passing["id"] and comparison["b"]["id"] == failing["id"]
    assert comparison["deltas"]["success_rate"] == -1.0
    (changed,) = comparison["changed"]
    assert changed["case"] == CASE and changed["passed"] == [True, False]
    # And the other way round, the case is fixed.
    r = await choice.http.get(
        f"{base}/compare", headers=ada, params={"a": failing["id"], "b": passing["id"]}
    )
    assert (r.json()["fixed"], r.json()["broken"]) == ([CASE], [])

    # The routes acted as the caller, through the core's audited use cases.
    audited = [
        (row["tool"], row["status"], row["principal_id"])
        for row in await store.audit_rows(org)
        if str(row["tool"]).startswith("evals.")
    ]
    assert audited == [
        ("evals.write", "OK", "ada"),
        ("evals.run", "OK", "ada"),
        ("evals.run", "OK", "ada"),
    ]


async def test_a_suite_is_saved_as_versions_and_live_mode_asks_the_servers_model(
    server: Callable[..., Any], store: Store, org: str
) -> None:
    choice = await server(**K3)
    ada = await member_key(store, org)
    base = f"/api/orgs/{org}/evals"
    run_id = await recorded_run(choice.runtime, org)
    r = await choice.http.post(
        f"{base}/suites/{SUITE}/cases",
        headers=ada,
        json={
            "run_id": str(run_id),  # the field's own name is accepted too
            "case": CASE,
            "description": "reads the clock",
            "checks": [
                {"kind": "status", "equals": "COMPLETED"},
                {"kind": "called", "tool": "current_time"},
                {"kind": "result_matches", "pattern": r"^It is \w+\.$"},
                {"kind": "judge", "rubric": "says the time"},
            ],
        },
    )
    assert r.status_code == 201, r.text
    stored = (await choice.http.get(f"{base}/suites/{SUITE}", headers=ada)).json()
    (case,) = stored["cases"]
    assert case["description"] == "reads the clock"

    # The suite as read back, without what the server gives (version, digest, author), is
    # the same cases: that version again, nothing new written.
    body = {"name": SUITE, "description": stored["description"], "cases": stored["cases"]}
    r = await choice.http.post(f"{base}/suites", headers=ada, json=body)
    assert r.status_code == 201, r.text
    assert (r.json()["version"], r.json()["digest"]) == (1, stored["digest"])
    # Other cases are the next version; version 1 stays as it was.
    renamed = {**case, "name": "clock-time-2", "checks": [{"kind": "max_steps", "value": 2}]}
    r = await choice.http.post(
        f"{base}/suites", headers=ada, json={**body, "cases": [case, renamed]}
    )
    assert r.status_code == 201, r.text
    assert r.json()["version"] == 2 and [c["name"] for c in r.json()["cases"]] == [
        CASE,
        "clock-time-2",
    ]
    r = await choice.http.get(f"{base}/suites/{SUITE}", headers=ada, params={"version": 1})
    assert [c["name"] for c in r.json()["cases"]] == [CASE]
    listed = (await choice.http.get(f"{base}/suites", headers=ada)).json()["suites"]
    assert [(s["name"], s["version"], s["cases"]) for s in listed] == [(SUITE, 2, 2)]

    # Live: the server's (scripted) model decides again; the recorded results answer the
    # tools. Without ``judge`` the judged check is skipped, not failed.
    r = await choice.http.post(
        f"{base}/runs", headers=ada, json={"suite": SUITE, "version": 1, "mode": "live"}
    )
    assert r.status_code == 201, r.text
    live = r.json()
    assert (live["mode"], live["model"], live["passed"], live["total"]) == (
        "live",
        "scripted",
        1,
        1,
    )
    verdicts = {v["kind"]: v["passed"] for v in live["results"][0]["verdicts"]}
    assert verdicts == {"status": True, "called": True, "result_matches": True, "judge": None}
    # With ``judge``, the server's model grades the result against the rubric.
    r = await choice.http.post(
        f"{base}/runs", headers=ada, json={"suite": SUITE, "version": 1, "judge": True}
    )
    assert r.status_code == 201, r.text
    (judged,) = [v for v in r.json()["results"][0]["verdicts"] if v["kind"] == "judge"]
    assert judged == {"kind": "judge", "passed": True, "detail": "scripted: it says so"}


async def test_bad_input_is_refused_with_its_reason_and_nothing_is_stored(
    server: Callable[..., Any], store: Store, org: str
) -> None:
    choice = await server(**K3)
    unrecorded = await server(**K3, record_decisions=False)
    ada = await member_key(store, org)
    base = f"/api/orgs/{org}/evals"
    run_id = await recorded_run(choice.runtime, org)
    r = await choice.http.post(
        f"{base}/suites/{SUITE}/cases", headers=ada, json={"runId": str(run_id), "case": CASE}
    )
    assert r.status_code == 201, r.text
    suite = (await choice.http.get(f"{base}/suites/{SUITE}", headers=ada)).json()
    (case,) = suite["cases"]
    ran = (await choice.http.post(f"{base}/runs", headers=ada, json={"suite": SUITE})).json()

    # Runs that cannot be cases: still RUNNING, recorded without decisions, unknown.
    agent = await choice.runtime.create_agent(org, "idle", mode=AgentMode.AUTONOMOUS)
    running = await choice.runtime.start_run(org, agent.id, GOAL)
    bare = await recorded_run(unrecorded.runtime, org)
    cases_url = f"{base}/suites/{SUITE}/cases"
    r = await choice.http.post(cases_url, headers=ada, json={"runId": str(running.id)})
    assert_error(r, 422, "still RUNNING")
    r = await choice.http.post(cases_url, headers=ada, json={"runId": str(bare)})
    assert_error(r, 422, "has no recording")
    r = await choice.http.post(cases_url, headers=ada, json={"runId": str(uuid.uuid4())})
    assert_error(r, 404)

    def with_checks(*checks: dict[str, Any]) -> dict[str, Any]:
        return {"runId": str(run_id), "case": "another", "checks": list(checks)}

    refusals: list[tuple[str, str, dict[str, Any], int, tuple[str, ...]]] = [
        # checks
        ("POST", cases_url, {"json": with_checks({"kind": "nope"})}, 422, ("checks.0",)),
        (
            "POST",
            cases_url,
            {"json": with_checks({"kind": "result_matches", "pattern": "("})},
            422,
            ("not a regular expression",),
        ),
        (
            "POST",
            cases_url,
            {"json": with_checks({"kind": "status", "equals": "COMPLETED", "extra": 1})},
            422,
            ("extra",),
        ),
        ("POST", cases_url, {"json": with_checks()}, 422, ("checks",)),
        (
            "POST",
            cases_url,
            {"json": with_checks({"kind": "result_contains", "values": ["a\x00b"]})},
            422,
            ("NUL",),
        ),
        # names
        (
            "POST",
            cases_url,
            {"json": {"runId": str(run_id), "case": "no spaces here"}},
            422,
            ("a case name is",),
        ),
        (
            "POST",
            f"{base}/suites/-bad/cases",
            {"json": {"runId": str(run_id)}},
            422,
            ("a suite name is",),
        ),
        (
            "POST",
            f"{base}/suites",
            {"json": {"name": "bad name!", "cases": [case]}},
            422,
            ("a suite name is",),
        ),
        (
            "POST",
            f"{base}/suites",
            {"json": {"name": SUITE, "cases": [case, case]}},
            422,
            (f"case name {CASE!r} appears twice",),
        ),
        ("POST", f"{base}/suites", {"json": {"name": SUITE, "cases": []}}, 422, ("cases",)),
        (
            "POST",
            f"{base}/suites",
            {"json": {"name": SUITE, "cases": [case], "version": 7}},
            422,
            ("version",),
        ),
        (
            "POST",
            f"{base}/suites",
            {"json": {"name": SUITE, "cases": [{**case, "checks": [{"kind": "nope"}]}]}},
            422,
            ("checks",),
        ),
        # versions, suites and runs that do not exist
        ("GET", f"{base}/suites/{SUITE}", {"params": {"version": 9}}, 404, ("version 9",)),
        ("GET", f"{base}/suites/{SUITE}", {"params": {"version": 0}}, 422, ("version",)),
        ("GET", f"{base}/suites/nothing-here", {}, 404, ("nothing-here",)),
        ("POST", f"{base}/runs", {"json": {"suite": SUITE, "version": 9}}, 404, ("version 9",)),
        ("POST", f"{base}/runs", {"json": {"suite": "nothing-here"}}, 404, ("nothing-here",)),
        ("POST", f"{base}/runs", {"json": {"suite": SUITE, "mode": "dream"}}, 422, ("mode",)),
        ("POST", f"{base}/runs", {"json": {"suite": SUITE, "bogus": 1}}, 422, ("bogus",)),
        ("POST", f"{base}/runs", {"json": {"suite": SUITE, "version": "1"}}, 422, ("version",)),
        (
            "POST",
            f"{base}/runs",
            {"json": {"suite": SUITE, "overrides": {"temperature": 0.5}}},
            422,
            ("not a setting a replay can change: temperature",),
        ),
        (
            "POST",
            f"{base}/runs",
            {"json": {"suite": SUITE, "overrides": {"candidates": 0}}},
            422,
            ("overrides", "candidates"),
        ),
        ("GET", f"{base}/runs/{uuid.uuid4()}", {}, 404, ("eval run",)),
        ("GET", f"{base}/runs/not-a-uuid", {}, 422, ()),
        ("GET", f"{base}/runs", {"params": {"limit": 0}}, 422, ("limit",)),
        ("GET", f"{base}/compare", {"params": {"a": ran["id"]}}, 422, ("b",)),
        (
            "GET",
            f"{base}/compare",
            {"params": {"a": ran["id"], "b": str(uuid.uuid4())}},
            404,
            ("eval run",),
        ),
    ]
    for method, url, kwargs, status, fragments in refusals:
        r = await choice.http.request(method, url, headers=ada, **kwargs)
        assert_error(r, status, *fragments)
        assert "Traceback" not in r.text
    # Live mode needs the server's model; a replay does not.
    modelless = await server(**K3, modelless=True)
    r = await modelless.http.post(
        f"{base}/runs", headers=ada, json={"suite": SUITE, "mode": "live"}
    )
    assert_error(r, 422, "needs a model")
    r = await modelless.http.post(f"{base}/runs", headers=ada, json={"suite": SUITE})
    assert r.status_code == 201 and r.json()["passed"] == 1, r.text
    replayed = r.json()

    # Nothing refused was stored: one suite version, the two runs that were made.
    listed = (await choice.http.get(f"{base}/suites", headers=ada)).json()["suites"]
    assert [(s["name"], s["version"]) for s in listed] == [(SUITE, 1)]
    runs = (await choice.http.get(f"{base}/runs", headers=ada)).json()["runs"]
    assert [x["id"] for x in runs] == [replayed["id"], ran["id"]]


async def test_another_organisation_sees_and_changes_nothing(
    server: Callable[..., Any], store: Store, org: str
) -> None:
    choice = await server(**K3)
    ada = await member_key(store, org)
    base = f"/api/orgs/{org}/evals"
    run_id = await recorded_run(choice.runtime, org)
    r = await choice.http.post(
        f"{base}/suites/{SUITE}/cases", headers=ada, json={"runId": str(run_id), "case": CASE}
    )
    assert r.status_code == 201, r.text
    case = (await choice.http.get(f"{base}/suites/{SUITE}", headers=ada)).json()["cases"][0]
    ran = (await choice.http.post(f"{base}/runs", headers=ada, json={"suite": SUITE})).json()

    other = f"org-{uuid.uuid4().hex[:12]}"
    intruder = await member_key(store, other, "mallory")

    def requests(target: str) -> list[tuple[str, str, dict[str, Any]]]:
        at = f"/api/orgs/{target}/evals"
        return [
            ("GET", f"{at}/suites", {}),
            ("GET", f"{at}/suites/{SUITE}", {}),
            ("POST", f"{at}/suites/{SUITE}/cases", {"json": {"runId": str(run_id)}}),
            ("POST", f"{at}/runs", {"json": {"suite": SUITE}}),
            ("GET", f"{at}/runs", {}),
            ("GET", f"{at}/runs/{ran['id']}", {}),
            ("GET", f"{at}/compare", {"params": {"a": ran["id"], "b": ran["id"]}}),
            ("POST", f"{at}/suites", {"json": {"name": SUITE, "cases": [case]}}),
        ]

    # Without a key: 401 on every route.
    for method, url, kwargs in requests(org):
        assert_error(await choice.http.request(method, url, **kwargs), 401)
    # Another organisation's principal on this one's paths: nothing is there for it.
    for method, url, kwargs in requests(org):
        r = await choice.http.request(method, url, headers=intruder, **kwargs)
        assert_error(r, 404, "not found")
        assert str(run_id) not in r.text and ran["id"] not in r.text
    # On its own paths, naming this organisation's suite, run and eval run: not found.
    mine = {
        "GET /suites": 200,
        "POST /suites": 201,  # its own suite (last), from the case it was given
        "GET /runs": 200,
    }
    for method, url, kwargs in requests(other):
        r = await choice.http.request(method, url, headers=intruder, **kwargs)
        key = f"{method} {url.removeprefix(f'/api/orgs/{other}/evals')}"
        assert r.status_code == mine.get(key, 404), (key, r.status_code, r.text)
        if key == "GET /runs":
            assert r.json() == {"runs": []}

    # This organisation's suite and runs are as they were.
    listed = (await choice.http.get(f"{base}/suites", headers=ada)).json()["suites"]
    assert [(s["name"], s["version"], s["created_by"]) for s in listed] == [(SUITE, 1, "ada")]
    runs = (await choice.http.get(f"{base}/runs", headers=ada)).json()["runs"]
    assert [x["id"] for x in runs] == [ran["id"]]
