"""Graph retrieval: seeds → entities → neighbours within budgets, path search, citations,
and the reader's rights applied before anything is returned (a denied source cannot leak
through a traversal), through the runtime, the ``graph_search`` tool and the HTTP API."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from cortex_ray import AccessDeniedError, AgentMode, Grant, InvalidRequestError, Principal
from cortex_ray._types import ObservationStatus
from cortex_ray.act import InvocationContext
from cortex_ray.graph import GraphWriter, Triple
from cortex_ray.graph._writer import assert_rows
from cortex_ray.knowledge import KnowledgeWriter
from cortex_ray.storage import Database

# public: runbook.md ──mentions──▶ payments-db        (collection "public")
# secret: payments-db ──replicates_to──▶ nightingale  (collection "secret", bob only)
# secret: nightingale ──owned_by──▶ ops@example.com
# public: contacts.md ──mentions──▶ ops@example.com
PUBLIC = b"Runbook: payments-db\nContacts: ops@example.com\n"
SECRET = b"payments-db replicates to nightingale, owned by ops@example.com\n"


def seed_graph(dsn: str, org: str) -> dict[str, Any]:
    with KnowledgeWriter(dsn) as kw, GraphWriter(dsn) as gw:
        (runbook, contacts) = kw.register_sources(
            org, "public", [("runbook.md", "h1", len(PUBLIC)), ("contacts.md", "h2", len(PUBLIC))]
        )
        (plan,) = kw.register_sources(org, "secret", [("plan.md", "h3", len(SECRET))])
        run = gw.begin_run(org, collection="mixed")

        def fact(src: Any, s: tuple[str, str], p: str, o: tuple[str, str], text: bytes) -> dict:
            data = PUBLIC if src is not plan else SECRET
            start = data.index(text)
            return {
                "s_type": s[0], "s_name": s[1], "p": p, "o_type": o[0], "o_name": o[1],
                "source_id": str(src.source_id), "source_version": src.version,
                "method": "deterministic", "method_version": "rules-1", "confidence": 0.9,
                "byte_start": start, "byte_end": start + len(text),
                "line_start": data[:start].count(b"\n") + 1,
                "line_end": data[:start].count(b"\n") + 1,
            }  # fmt: skip

        rows = [
            fact(runbook, ("document", "runbook.md"), "mentions", ("service", "payments-db"),
                 b"payments-db"),
            fact(plan, ("service", "payments-db"), "replicates_to", ("project", "nightingale"),
                 b"nightingale"),
            fact(plan, ("project", "nightingale"), "owned_by", ("email", "ops@example.com"),
                 b"ops@example.com"),
            fact(contacts, ("document", "contacts.md"), "mentions", ("email", "ops@example.com"),
                 b"ops@example.com"),
        ]  # fmt: skip
        with gw.conn.transaction():
            assert_rows(gw.conn, org, run, rows)
        gw.finish_run(org, run)
    return {"runbook": runbook, "plan": plan}


def member(org: str, name: str, *tools: str) -> Principal:
    return Principal(id=name, org_id=org, grant=Grant(tools=frozenset(tools)))


async def test_a_denied_source_cannot_leak_through_a_traversal(
    scripted_runtime: Callable[..., Any], db: Database, org: str
) -> None:
    runtime = await scripted_runtime(None)
    await asyncio.to_thread(seed_graph, db.dsn, org)
    await runtime.set_collection_readers(org, "secret", ["bob"])
    alice = member(org, "alice", "graph_search")
    bob = member(org, "bob", "graph_search")

    # bob reads the secret collection: three hops from the runbook reach the e-mail.
    full = await runtime.search_graph(org, terms=["runbook.md"], depth=3, principal=bob)
    assert {e.name for e in full.entities} >= {"nightingale", "ops@example.com"}
    secret = [f for f in full.facts if f.collection == "secret"]
    assert {f.citation for f in secret} == {"plan.md:1-1 @v1"}
    assert all(f.evidence is not None for f in full.facts)

    # alice does not: no secret fact, no entity only the secret source names, at any depth,
    # from any seed, on either side of a path.
    for terms in (["runbook.md"], ["payments-db"], ["ops@example.com"], ["nightingale"]):
        seen = await runtime.search_graph(org, terms=terms, depth=4, principal=alice)
        assert all(f.collection != "secret" for f in seen.facts), terms
        names = {e.name for e in seen.entities} | {e.name for e in seen.seeds}
        assert "nightingale" not in names, terms
    nobody = await runtime.search_graph(org, terms=["nightingale"], principal=alice)
    assert nobody.seeds == [] and nobody.facts == []
    start, end = full.seeds[0].id, next(e.id for e in full.entities if e.name == "ops@example.com")
    found = await runtime.search_graph(org, entity_ids=[start], path_to=end, depth=4, principal=bob)
    assert found.path is not None
    assert [f.predicate for f in found.path] == ["mentions", "replicates_to", "owned_by"]
    hidden = await runtime.search_graph(
        org, entity_ids=[start], path_to=end, depth=4, principal=alice
    )
    assert hidden.path is None and all(f.collection != "secret" for f in hidden.facts)
    # An admin reads everything; opening the collection again lets alice read it too.
    assert (await runtime.search_graph(org, entity_ids=[start], path_to=end, depth=4)).path
    await runtime.set_collection_readers(org, "secret", [])
    opened = await runtime.search_graph(org, terms=["nightingale"], principal=alice)
    assert [e.name for e in opened.seeds] == ["nightingale"]


async def test_budgets_bound_the_expansion_and_bad_requests_are_refused(
    scripted_runtime: Callable[..., Any], org: str
) -> None:
    runtime = await scripted_runtime(None)
    hub = [
        Triple(subject_type="service", subject="hub", predicate="calls",
               object_type="service", object=f"spoke-{i}")
        for i in range(12)
    ]  # fmt: skip
    await runtime.submit_triples(org, hub)
    capped = await runtime.search_graph(org, terms=["hub"], per_entity=5)
    assert len(capped.facts) == 5 and all(
        f.citation == "submitted by operator" for f in capped.facts
    )
    small = await runtime.search_graph(org, terms=["hub"], depth=2, max_facts=3)
    assert len(small.facts) == 3 and small.truncated
    for bad in ({"depth": 0}, {"depth": 9}, {"max_facts": 0}, {"per_entity": 1000}):
        with pytest.raises(InvalidRequestError):
            await runtime.search_graph(org, terms=["hub"], **bad)
    with pytest.raises(InvalidRequestError, match="seed"):
        await runtime.search_graph(org)
    with pytest.raises(AccessDeniedError):
        await runtime.search_graph(org, terms=["hub"], principal=member(org, "eve", "x"))
    with pytest.raises(AccessDeniedError):
        await runtime.submit_triples(org, hub[:1], principal=member(org, "eve", "graph_search"))
    with pytest.raises(AccessDeniedError):
        await runtime.set_collection_readers(
            org, "any", [], principal=member(org, "eve", "graph_search")
        )


async def test_the_graph_search_tool_cites_what_it_found(
    scripted_runtime: Callable[..., Any], org: str
) -> None:
    runtime = await scripted_runtime(None)
    await runtime.submit_triples(
        org,
        [
            Triple(subject_type="service", subject="billing-api", predicate="owned_by",
                   object_type="team", object="payments", functional=True),
            Triple(subject_type="team", subject="payments", predicate="reachable_at",
                   object_type="email", object="pay@example.com"),
        ],
    )  # fmt: skip
    agent = await runtime.create_agent(
        org,
        "librarian",
        mode=AgentMode.AUTONOMOUS,
        tools=["graph_search"],
        grant=Grant(tools=frozenset({"graph_search"})),
    )
    ctx = InvocationContext(agent=agent, caller=None, mode=AgentMode.AUTONOMOUS)
    obs = await runtime.dispatcher.invoke(ctx, "graph_search", {"query": "Billing-API", "depth": 2})
    assert obs.status is ObservationStatus.OK, obs
    facts = obs.output["facts"]
    assert {f["fact"] for f in facts} == {
        "service:billing-api owned_by team:payments",
        "team:payments reachable_at email:pay@example.com",
    }
    assert all(f["citation"] == "submitted by operator" for f in facts)
    path = await runtime.dispatcher.invoke(
        ctx, "graph_search", {"query": "billing-api", "to": "pay@example.com"}
    )
    assert path.output["path_found"] is True and len(path.output["facts"]) == 2


async def test_the_http_routes(
    scripted_runtime: Callable[..., Any], db: Database, org: str
) -> None:
    httpx2 = pytest.importorskip("httpx2")
    from serve import create_app

    runtime = await scripted_runtime(None)
    await runtime.store.ensure_org(org)
    await asyncio.to_thread(seed_graph, db.dsn, org)
    admin = Principal(id="ada", org_id=org, is_admin=True, grant=Grant(tools=frozenset({"*"})))
    keys = {
        who: (await runtime.store.create_api_key(p, who))[0]
        for who, p in (
            ("ada", admin),
            ("alice", member(org, "alice", "graph_search", "graph_submit")),
            ("eve", member(org, "eve", "current_time")),
        )
    }

    def auth(who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {keys[who]}"}

    base = f"/api/orgs/{org}"
    transport = httpx2.ASGITransport(app=create_app(runtime))
    async with httpx2.AsyncClient(transport=transport, base_url="http://api") as client:
        r = await client.put(
            f"{base}/knowledge/collections/secret/readers",
            headers=auth("ada"),
            json={"principalIds": ["bob"]},
        )
        assert r.status_code == 204, r.text
        r = await client.get(
            f"{base}/graph/search",
            headers=auth("alice"),
            params={"term": "payments-db", "depth": 3},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert [s["name"] for s in body["seeds"]] == ["payments-db"]
        assert body["facts"] and all(f["collection"] == "public" for f in body["facts"])
        fact = body["facts"][0]
        assert fact["citation"] == "runbook.md:1-1 @v1"
        assert fact["evidence"] == {"byteStart": 9, "byteEnd": 20, "lineStart": 1, "lineEnd": 1}
        assert PUBLIC[9:20] == b"payments-db"
        r = await client.get(f"{base}/graph/search", headers=auth("ada"), params={"term": "x"})
        assert r.status_code == 200 and r.json()["facts"] == []

        triple = {"subjectType": "service", "subject": "api", "predicate": "owned_by",
                  "objectType": "team", "object": "core", "functional": True}  # fmt: skip
        r = await client.post(
            f"{base}/graph/triples", headers=auth("alice"), json={"triples": [triple]}
        )
        assert r.status_code == 201, r.text
        assert r.json()["assertions"] == 1
        r = await client.post(
            f"{base}/graph/triples",
            headers=auth("alice"),
            json={"triples": [{**triple, "object": "platform"}]},
        )
        assert r.json()["closed"] == 1
        api = (await client.get(f"{base}/graph/search", headers=auth("alice"),
                                params={"term": "api"})).json()  # fmt: skip
        assert [f["object"]["name"] for f in api["facts"]] == ["platform"]
        start = api["seeds"][0]["id"]
        end = api["facts"][0]["object"]["id"]
        r = await client.get(
            f"{base}/graph/path", headers=auth("alice"), params={"from": start, "to": end}
        )
        assert r.status_code == 200 and len(r.json()["path"]) == 1

        # Refusals: the error shape of every route, nothing stored.
        r = await client.get(f"{base}/graph/search", headers=auth("eve"), params={"term": "api"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        bad_requests: list[tuple[str, str, dict[str, Any]]] = [
            ("GET", "/graph/search", {"params": {"term": "api", "depth": 9}}),
            ("GET", "/graph/search", {"params": {}}),
            ("GET", "/graph/path", {"params": {"from": "nope", "to": end}}),
            ("POST", "/graph/triples", {"json": {"triples": []}}),
            (
                "POST",
                "/graph/triples",
                {"json": {"triples": [{**triple, "predicate": "Owned By"}]}},
            ),
            ("POST", "/graph/triples", {"json": {"triples": [{**triple, "subject": "a\x00b"}]}}),
            ("POST", "/graph/triples", {"json": {"triples": [{**triple, "confidence": 3}]}}),
        ]
        for method, path, kwargs in bad_requests:
            r = await client.request(method, base + path, headers=auth("alice"), **kwargs)
            assert r.status_code == 422, (path, kwargs, r.text)
            assert r.json()["error"]["code"] == "invalid_request"
        r = await client.get(
            f"{base}/graph/path",
            headers=auth("alice"),
            params={"from": str(uuid.UUID(int=1)), "to": end},
        )
        assert r.status_code == 404
        r = await client.put(
            f"{base}/knowledge/collections/nope/readers", headers=auth("ada"),
            json={"principalIds": []},
        )  # fmt: skip
        assert r.status_code == 404
        r = await client.put(
            f"{base}/knowledge/collections/secret/readers", headers=auth("alice"),
            json={"principalIds": []},
        )  # fmt: skip
        assert r.status_code == 403
    async with db.connection() as conn:
        row = await (
            await conn.execute(
                "SELECT count(*) AS n FROM graph_assertions WHERE org_id = %s AND method = 'user'",
                (org,),
            )
        ).fetchone()
    assert row is not None and row["n"] == 2


async def test_knowledge_search_honours_collection_readers_too(
    scripted_runtime: Callable[..., Any], db: Database, org: str
) -> None:
    from knowledge_fixtures import ingest

    runtime = await scripted_runtime(None)

    def publish() -> None:
        with KnowledgeWriter(db.dsn) as writer:
            ingest(writer, org, "public", {"open.md": b"# Open\n\nThe zebra timetable.\n"})
            ingest(writer, org, "secret", {"plan.md": b"# Plan\n\nThe zebra takeover.\n"})

    await asyncio.to_thread(publish)
    await runtime.set_collection_readers(org, "secret", ["bob"])
    alice = member(org, "alice", "knowledge_search")
    bob = member(org, "bob", "knowledge_search")
    seen = await runtime.search_knowledge(org, "zebra", principal=alice)
    assert {h.collection for h in seen.hits} == {"public"}
    with pytest.raises(AccessDeniedError, match="secret"):
        await runtime.search_knowledge(org, "zebra", collection=["secret"], principal=alice)
    both = await runtime.search_knowledge(org, "zebra", principal=bob)
    assert {h.collection for h in both.hits} == {"public", "secret"}

    agent = await runtime.create_agent(
        org,
        "reader",
        mode=AgentMode.AUTONOMOUS,
        tools=["knowledge_search"],
        grant=Grant(tools=frozenset({"knowledge_search"})),
    )
    ctx = InvocationContext(agent=agent, caller=None, mode=AgentMode.AUTONOMOUS)
    obs = await runtime.dispatcher.invoke(ctx, "knowledge_search", {"query": "zebra"})
    assert obs.status is ObservationStatus.OK
    assert {h["path"] for h in obs.output["hits"]} == {"open.md"}
    refused = await runtime.dispatcher.invoke(
        ctx, "knowledge_search", {"query": "zebra", "collection": "secret"}
    )
    assert refused.status is not ObservationStatus.OK
