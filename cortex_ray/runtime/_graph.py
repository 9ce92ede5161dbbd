"""The context graph as use cases (docs/graph.md): search, submitted facts, and who may
read a collection's facts."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

import cortex_ray.graph as _graph
from cortex_ray._exceptions import InvalidRequestError
from cortex_ray._types import Principal
from cortex_ray.access import UseCase
from cortex_ray.runtime._gate import UseCaseGate

__all__ = ["GraphUseCases"]


class GraphUseCases:
    """The context graph (``Runtime.search_graph``, ``submit_triples``, ...)."""

    def __init__(self, gate: UseCaseGate, graph: _graph.GraphStore) -> None:
        self.gate = gate
        self.graph = graph

    async def search_graph(
        self,
        org_id: str,
        *,
        terms: Sequence[str] = (),
        entity_ids: Sequence[UUID] = (),
        source_ids: Sequence[UUID] = (),
        depth: int = 1,
        max_facts: int = 50,
        per_entity: int = 10,
        predicates: Sequence[str] | None = None,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        path_to: UUID | None = None,
        principal: Principal | None = None,
    ) -> _graph.GraphResult:
        """Seeds (terms, entity ids, the sources of knowledge hits) → entities → neighbours
        within the budgets, as of ``valid_at`` / ``known_at``; with ``path_to``, a shortest
        path from the one entity id given to it (``depth`` long at most). Facts whose source
        the caller may not read are left out before anything is returned. Admins, or callers
        granted ``graph_search``."""
        args = {"terms": [t[:100] for t in terms][:10], "depth": depth, "max_facts": max_facts}
        caller = await self.gate.authorize(principal, UseCase.GRAPH_SEARCH, org_id, args=args)
        reader = _graph.Reader(caller.id, caller.is_admin, valid_at, known_at)
        if path_to is not None:
            if len(entity_ids) != 1 or terms or source_ids:
                raise InvalidRequestError("a path search takes one entity id and path_to")
            result = await self.graph.path(
                org_id, reader, entity_ids[0], path_to, max_depth=depth, per_entity=per_entity,
                predicates=predicates,
            )  # fmt: skip
        else:
            result = await self.graph.search(
                org_id, reader, terms=terms, entity_ids=entity_ids, source_ids=source_ids,
                depth=depth, max_facts=max_facts, per_entity=per_entity, predicates=predicates,
            )  # fmt: skip
        await self.gate.audited(caller, UseCase.GRAPH_SEARCH, org_id, args=args)
        return result

    async def submit_triples(
        self, org_id: str, triples: Sequence[_graph.Triple], *, principal: Principal | None = None
    ) -> _graph.SubmitReport:
        """Record the caller's own facts (one extraction run of method ``user``); a
        ``functional`` predicate's newer fact closes the older one's validity. Admins, or
        writers granted ``graph_submit``."""
        args = {"triples": len(triples)}
        caller = await self.gate.authorize(principal, UseCase.GRAPH_SUBMIT, org_id, args=args)
        if not 1 <= len(triples) <= 1000:
            raise InvalidRequestError("triples: 1 to 1000 per call")
        report = await self.graph.submit(org_id, triples, principal_id=caller.id)
        await self.gate.audited(caller, UseCase.GRAPH_SUBMIT, org_id, args=args)
        return report

    async def set_collection_readers(
        self,
        org_id: str,
        collection: str,
        principal_ids: Sequence[str],
        *,
        principal: Principal | None = None,
    ) -> None:
        """Restrict who may read a collection's facts (none listed: every member). Admins."""
        args = {"collection": collection, "readers": list(principal_ids)[:50]}
        caller = await self.gate.authorize(principal, UseCase.COLLECTION_READERS, org_id, args=args)
        await self.graph.set_collection_readers(org_id, collection, principal_ids)
        await self.gate.audited(caller, UseCase.COLLECTION_READERS, org_id, args=args)
