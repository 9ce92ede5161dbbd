"""Hybrid retrieval over published knowledge: BM25 in PostgreSQL, pgvector HNSW, fusion,
optional reranking, lazy passage vectors and range citations.

Asynchronous, on the core's pool. Its statements live in ``_sql.py``, which it shares with
the synchronous writer (``KnowledgeWriter``): the passage-vector backfill runs the same
statements from both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import numpy as np
from numpy.typing import NDArray

from cortex_ray._exceptions import ConfigurationError, InvalidRequestError
from cortex_ray.knowledge._bm25 import PLAIN, Analyzer
from cortex_ray.knowledge._sql import (
    BM25_EXACT_SQL,
    BM25_SQL,
    DIM,
    HITS_SQL,
    PASSAGE_DENSE_SQL,
    PASSAGE_EXACT_SQL,
    PUBLICATIONS_SQL,
    SECTION_DENSE_SQL,
    SECTION_EXACT_SQL,
    SET_VECTORS_SQL,
    TO_EMBED_SQL,
    UNEMBEDDED_SQL,
    USAGE_SQL,
    vector_literal,
)
from cortex_ray.knowledge._types import Fusion, RetrievalConfig, SearchHit, SearchResult, Tier
from cortex_ray.models import Embedder, Reranker, embed
from cortex_ray.observability import (
    GEN_AI_DATA_SOURCE_ID,
    GEN_AI_OPERATION_NAME,
    diagnostics,
    metrics,
    tracer,
)
from cortex_ray.storage import Conn, Database

__all__ = ["KnowledgeService", "Publication", "citation", "fuse"]

Ranked = list[tuple[int, float]]
"""(passage id, score), best first."""


@dataclass(frozen=True, slots=True)
class Publication:
    """The generations a search reads, resolved once at its start."""

    generations: dict[str, int]  # collection → generation
    collection_ids: dict[str, int]  # collection → its id (the postings partition key)
    passages: int
    total_length: int
    # collection → the analyzer its generation was written with (absent: PLAIN)
    analyzers: dict[str, Analyzer] = field(default_factory=dict)
    # collection → (passages, total length) of its generation
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def avgdl(self) -> float:
        return self.total_length / max(self.passages, 1)

    def by_analyzer(self) -> list[tuple[Analyzer, Publication]]:
        """The publication in parts that share an analyzer, each part with its own N and
        Σdl: itself when every generation has the same analyzer (the usual case)."""
        groups: dict[Analyzer, list[str]] = {}
        for name in self.generations:
            groups.setdefault(self.analyzers.get(name, PLAIN), []).append(name)
        if len(groups) <= 1:
            return [(next(iter(groups), PLAIN), self)]
        return [(analyzer, self._part(names)) for analyzer, names in groups.items()]

    def _part(self, names: Sequence[str]) -> Publication:
        return Publication(
            generations={n: self.generations[n] for n in names},
            collection_ids={n: self.collection_ids[n] for n in names},
            passages=sum(self.sizes[n][0] for n in names),
            total_length=sum(self.sizes[n][1] for n in names),
            analyzers={n: self.analyzers[n] for n in names if n in self.analyzers},
            sizes={n: self.sizes[n] for n in names},
        )


def citation(
    path: str, line_start: int, line_end: int, heading_path: Sequence[str], version: int
) -> str:
    """``docs/guide.md:120-134 (Guide › Install) @v3``."""
    headings = f" ({' › '.join(heading_path)})" if heading_path else ""
    return f"{path}:{line_start}-{line_end}{headings} @v{version}"


def fuse(
    rankings: Mapping[Tier, Ranked], method: Fusion, *, rrf_k: int = 60, bm25_weight: float = 0.5
) -> Ranked:
    """Combine rankings into one, best first (ties broken by passage id for stability).

    RRF sums ``1 / (rrf_k + rank)``. WEIGHTED min-max normalises each list's scores to [0, 1]
    and sums ``bm25_weight`` times the lexical score and ``1 - bm25_weight`` times the dense
    one (a passage absent from a list contributes 0 for it). ZSCORE standardises each list's
    scores (minus the list's mean, over its standard deviation) and sums them with the same
    weights; a passage absent from a list counts one standard deviation below that list's
    lowest (it ranked below everything the list returned).

    Why standardise: min-max maps each list's best and worst candidate to 1 and 0 whatever
    their distance, so a weight means something else on every query and every corpus (a
    lexical list whose top score stands far above the rest, as on tool documentation, is
    squeezed into the same [0, 1] as a flat one). The standard deviation is the list's own
    scale, so a weight means "this many spreads" everywhere (docs/knowledge.md, measured).
    """
    if method is Fusion.ZSCORE:
        return _zscore_fuse(rankings, bm25_weight)
    fused: dict[int, float] = {}
    for tier, ranked in rankings.items():
        if not ranked:
            continue
        if method is Fusion.RRF:
            for rank, (pid, _) in enumerate(ranked, start=1):
                fused[pid] = fused.get(pid, 0.0) + 1.0 / (rrf_k + rank)
        else:
            weight = bm25_weight if tier is Tier.BM25 else 1.0 - bm25_weight
            scores = [s for _, s in ranked]
            lo, hi = min(scores), max(scores)
            span = hi - lo
            for pid, s in ranked:
                norm = (s - lo) / span if span > 0 else 1.0
                fused[pid] = fused.get(pid, 0.0) + weight * norm
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))


# Where a passage one list did not return stands on that list: one spread below the lowest
# it returned (it ranked below all of them; how far is unknown). Counting it at the lowest
# itself (0 spreads) was measured too: wiki-ir-dev 0.8582 / bfcl-tools 0.8264 nDCG@10 at
# weight 0.3, against 0.8591 / 0.8267 (docs/knowledge.md, "Fusion").
_ABSENT_SPREADS = 1.0


def _zscore_fuse(rankings: Mapping[Tier, Ranked], bm25_weight: float) -> Ranked:
    """Fusion.ZSCORE (see ``fuse``). A list with one score, or all equal, has no spread:
    its scores standardise to 0 (it tells nothing apart)."""
    lists: list[tuple[float, dict[int, float], float]] = []  # weight, standardised, floor
    for tier, ranked in rankings.items():
        if not ranked:
            continue
        scores = [s for _, s in ranked]
        mean = sum(scores) / len(scores)
        spread = (sum((s - mean) ** 2 for s in scores) / len(scores)) ** 0.5
        scale = spread if spread > 1e-12 else 1.0
        norms = {pid: (s - mean) / scale for pid, s in ranked}
        weight = bm25_weight if tier is Tier.BM25 else 1.0 - bm25_weight
        lists.append((weight, norms, min(norms.values()) - _ABSENT_SPREADS))
    pids = {pid for _, norms, _ in lists for pid in norms}
    fused = {
        pid: sum(weight * norms.get(pid, floor) for weight, norms, floor in lists) for pid in pids
    }
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))


class KnowledgeService:
    """Search published knowledge of an organisation, with citations; fill in passage vectors.

    Args:
        db: the core's database pool.
        embedder: the query and passage embedder (384 dimensions, like the stored vectors).
        reranker: a cross-encoder behind the :class:`Reranker` protocol, if any.
        config: retrieval knobs; the defaults are the measured ones.
    """

    def __init__(
        self,
        db: Database,
        embedder: Embedder,
        *,
        reranker: Reranker | None = None,
        config: RetrievalConfig | None = None,
    ) -> None:
        if embedder.dim != DIM:
            raise InvalidRequestError(
                f"the knowledge store holds {DIM}-d vectors, not {embedder.dim}"
            )
        self.db = db
        self.embedder = embedder
        self.reranker = reranker
        self.config = config or RetrievalConfig()

    # -- publications ------------------------------------------------------------------

    async def publication(
        self, org_id: str, collection: str | Sequence[str] | None = None
    ) -> Publication:
        names = (
            [collection]
            if isinstance(collection, str)
            else (list(collection) if collection is not None else None)
        )
        async with self.db.connection() as conn:
            cur = await conn.execute(PUBLICATIONS_SQL, {"org": org_id, "names": names})
            rows = await cur.fetchall()
        try:
            analyzers = {r["name"]: Analyzer.from_json(r["analyzer"]) for r in rows}
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from exc
        return Publication(
            generations={r["name"]: r["generation"] for r in rows},
            collection_ids={r["name"]: r["id"] for r in rows},
            passages=sum(int(r["passages"] or 0) for r in rows),
            total_length=sum(int(r["total_length"] or 0) for r in rows),
            analyzers=analyzers,
            sizes={r["name"]: (int(r["passages"] or 0), int(r["total_length"] or 0)) for r in rows},
        )

    # -- the tiers ---------------------------------------------------------------------

    async def lexical(
        self, org_id: str, pub: Publication, query: str, k: int, *, exact: bool = False
    ) -> Ranked:
        """BM25 of ``query`` over the publication, its terms from the analyzer each
        generation was written with. Collections written with different analyzers have no
        common vocabulary: each group is scored with its own statistics and the lists are
        merged by score."""
        parts = pub.by_analyzer()
        if len(parts) == 1:
            analyzer, part = parts[0]
            return await self.bm25(org_id, part, analyzer.query_terms(query), k, exact=exact)
        ranked = await asyncio.gather(
            *(self.bm25(org_id, p, a.query_terms(query), k, exact=exact) for a, p in parts)
        )
        return sorted((hit for r in ranked for hit in r), key=lambda x: (-x[1], x[0]))[:k]

    async def bm25(
        self, org_id: str, pub: Publication, terms: Sequence[str], k: int, *, exact: bool = False
    ) -> Ranked:
        """BM25 of ``terms`` over the publication: impact-ordered candidates + exact
        rescore (or all postings of the terms when ``exact``). The terms must come from the
        publication's analyzer (:meth:`lexical` tokenises a query so)."""
        if not terms or not pub.generations:
            return []
        sql, params = self.bm25_query(org_id, pub, terms, k, exact=exact)
        async with self.db.connection() as conn:
            cur = await conn.execute(sql, params)
            return [(r["id"], float(r["score"])) for r in await cur.fetchall()]

    def bm25_query(
        self, org_id: str, pub: Publication, terms: Sequence[str], k: int, *, exact: bool = False
    ) -> tuple[str, dict[str, Any]]:
        """The SQL and parameters :meth:`bm25` runs (exposed so that a plan can be checked
        with EXPLAIN)."""
        cfg = self.config
        params = {
            "org": org_id,
            "n": pub.passages,
            "avgdl": pub.avgdl,
            "gens": list(pub.generations.values()),
            "cids": [pub.collection_ids[name] for name in pub.generations],
            "terms": list(terms),
            # The budget is per term across the searched collections (each has its own
            # index range), with a floor so a small collection is never starved.
            "per_term": None
            if exact
            else max(-(-cfg.postings_per_term // len(pub.generations)), 100),
            "pool": None if exact else max(2 * k, 2 * cfg.bm25_candidates),
            "k": k,
        }
        return (BM25_EXACT_SQL if exact else BM25_SQL), params

    async def _dense(
        self, sql: str, exact_sql: str, pub: Publication, params: dict[str, Any]
    ) -> list[dict[str, Any]]:
        async with self.db.transaction() as conn:
            await conn.execute(
                "SELECT set_config('hnsw.ef_search', %s, true)", (str(self.config.ef_search),)
            )
            cur = await conn.execute(sql, params)
            rows = await cur.fetchall()
            # An iterative scan stops at hnsw.max_scan_tuples: a filter that keeps a tiny
            # share of a big shared index can still come back short. When the searched
            # publication is small, an exact scan of it is cheap and loses nothing.
            if len(rows) < params["k"] and pub.passages <= self.config.exact_fallback_passages:
                cur = await conn.execute(exact_sql, params)
                rows = await cur.fetchall()
            return rows

    def _dense_params(
        self, org_id: str, pub: Publication, vector: NDArray[np.float32], k: int
    ) -> dict[str, Any]:
        return {
            "org": org_id,
            "q": vector_literal(vector),
            "cols": list(pub.generations),
            "gens": list(pub.generations.values()),
            "k": k,
        }

    async def passage_dense(
        self, org_id: str, pub: Publication, vector: NDArray[np.float32], k: int
    ) -> Ranked:
        """The ``k`` nearest published passages that have a vector (cosine similarity)."""
        if not pub.generations:
            return []
        params = self._dense_params(org_id, pub, vector, k)
        rows = await self._dense(PASSAGE_DENSE_SQL, PASSAGE_EXACT_SQL, pub, params)
        return [(r["id"], float(r["score"])) for r in rows]

    async def section_dense(
        self, org_id: str, pub: Publication, vector: NDArray[np.float32], k: int
    ) -> list[tuple[UUID, int, int, float]]:
        """The ``k`` nearest published sections: (source id, version, ordinal, cosine)."""
        if not pub.generations or k == 0:
            return []
        params = self._dense_params(org_id, pub, vector, k)
        rows = await self._dense(SECTION_DENSE_SQL, SECTION_EXACT_SQL, pub, params)
        return [(r["source_id"], r["version"], r["ordinal"], float(r["score"])) for r in rows]

    async def _embed_lazily(
        self,
        org_id: str,
        sections: Sequence[tuple[UUID, int, int, float]],
        vector: NDArray[np.float32],
        limit: int,
    ) -> Ranked:
        """Embed (and keep) the vector-less passages of the surfaced sections, up to
        ``limit``; returns their cosine scores against the query."""
        if not sections or limit == 0:
            return []
        async with self.db.connection() as conn:
            cur = await conn.execute(
                UNEMBEDDED_SQL,
                {
                    "org": org_id,
                    "src": [s[0] for s in sections],
                    "ver": [s[1] for s in sections],
                    "sec": [s[2] for s in sections],
                    "rank": list(range(len(sections))),
                    "limit": limit,
                },
            )
            rows = await cur.fetchall()
        if not rows:
            return []
        vectors = await self.embedder.embed([r["text"] for r in rows])
        ids = [int(r["id"]) for r in rows]
        async with self.db.connection() as conn:
            await _store_vectors(conn, org_id, ids, vectors)
        scores = vectors @ vector
        return sorted(
            zip(ids, (float(s) for s in scores), strict=True), key=lambda x: (-x[1], x[0])
        )

    # -- search ------------------------------------------------------------------------

    async def search(
        self,
        org_id: str,
        query: str,
        *,
        collection: str | Sequence[str] | None = None,
        k: int = 10,
        fusion: Fusion | str | None = None,
        bm25_weight: float | None = None,
        tiers: Collection[Tier | str] | None = None,
        rerank: bool = True,
        lazy: bool = True,
        track_usage: bool = True,
    ) -> SearchResult:
        """Hybrid search over the published generations of ``collection`` (one name, several,
        or every collection of the organisation).

        Args:
            fusion: ``rrf`` or ``weighted`` (default: ``RetrievalConfig.fusion``).
            bm25_weight: the lexical weight of weighted fusion (default: the config's).
            tiers: which tiers may answer (default all): ``bm25``, ``section_dense``,
                ``passage_dense``.
            rerank: rerank the fused candidates when a reranker is available.
            lazy: embed the vector-less passages of the best sections (bounded per query).
            track_usage: count the returned passages' hits (orders the backfill).
        """
        names = [collection] if isinstance(collection, str) else list(collection or ["*"])
        with tracer.start_as_current_span(
            f"retrieval {','.join(names)}",
            attributes={
                GEN_AI_OPERATION_NAME: "retrieval",
                GEN_AI_DATA_SOURCE_ID: ",".join(names),
                "cortex.k": k,
            },
        ) as span:
            started = time.perf_counter()
            try:
                result = await self._search(
                    org_id,
                    query,
                    collection=collection,
                    k=k,
                    fusion=fusion,
                    bm25_weight=bm25_weight,
                    tiers=tiers,
                    rerank=rerank,
                    lazy=lazy,
                    track_usage=track_usage,
                )
            except BaseException:
                self._searched(org_id, started, "error")
                raise
            self._searched(org_id, started, "ok")
            diagnostics.note(
                "retrieval",
                collections=names,
                k=k,
                fusion=result.fusion.value,
                tiers=[t.value for t in result.tiers],
                reranker=result.reranker,
                skipped=result.skipped,
                evidence=[h.passage_id for h in result.hits],
                citations=[h.citation for h in result.hits[:10]],
                timings_ms=result.timings_ms,
            )
            span.set_attribute("cortex.hits", len(result.hits))
            span.set_attribute("cortex.fusion", result.fusion.value)
            span.set_attribute("cortex.reranker", result.reranker or "none")
            span.set_attribute("cortex.tiers", [t.value for t in result.tiers])
            return result

    @staticmethod
    def _searched(org_id: str, started: float, outcome: str) -> None:
        metrics.record(
            metrics.KNOWLEDGE_SEARCH_DURATION,
            time.perf_counter() - started,
            org=org_id,
            outcome=outcome,
        )

    async def _search(
        self,
        org_id: str,
        query: str,
        *,
        collection: str | Sequence[str] | None,
        k: int,
        fusion: Fusion | str | None,
        bm25_weight: float | None,
        tiers: Collection[Tier | str] | None,
        rerank: bool,
        lazy: bool,
        track_usage: bool,
    ) -> SearchResult:
        if not query.strip():
            raise InvalidRequestError("the query is empty")
        if not 1 <= k <= 100:
            raise InvalidRequestError(f"k must be between 1 and 100, not {k}")
        try:
            method = Fusion(fusion) if fusion is not None else self.config.fusion
            wanted = {Tier(t) for t in tiers} if tiers is not None else set(Tier)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from exc
        cfg = self.config
        timings: dict[str, float] = {}
        started = time.perf_counter()
        pub = await self.publication(org_id, collection)
        dense_wanted = bool(wanted & {Tier.SECTION_DENSE, Tier.PASSAGE_DENSE})
        vector: NDArray[np.float32] | None = None
        if dense_wanted and pub.generations:
            t0 = time.perf_counter()
            vector = (await embed(self.embedder, [query]))[0]
            timings["embed_query"] = _ms(t0)

        async def timed(name: str, coro: Any) -> Any:
            t0 = time.perf_counter()
            out = await coro
            timings[name] = _ms(t0)
            return out

        no_sections: list[tuple[UUID, int, int, float]] = []
        bm25_task = (
            timed("bm25", self.lexical(org_id, pub, query, max(k, cfg.bm25_candidates)))
            if Tier.BM25 in wanted
            else _const([])
        )
        passage_task = (
            timed("passage_dense", self.passage_dense(org_id, pub, vector, cfg.dense_candidates))
            if vector is not None and Tier.PASSAGE_DENSE in wanted
            else _const([])
        )
        section_task = (
            timed("section_dense", self.section_dense(org_id, pub, vector, cfg.sections))
            if vector is not None and Tier.SECTION_DENSE in wanted
            else _const(no_sections)
        )
        lexical, dense, sections = await asyncio.gather(bm25_task, passage_task, section_task)
        lazily: Ranked = []
        if lazy and vector is not None and sections:
            t0 = time.perf_counter()
            lazily = await self._embed_lazily(org_id, sections, vector, cfg.lazy_passages)
            timings["lazy_embed"] = _ms(t0)
        dense_scores = dict(dense)
        for pid, score in lazily:
            dense_scores[pid] = score
        dense_ranked = sorted(dense_scores.items(), key=lambda x: (-x[1], x[0]))

        answered: list[Tier] = []
        if lexical:
            answered.append(Tier.BM25)
        if sections:
            answered.append(Tier.SECTION_DENSE)
        if dense_ranked:
            answered.append(Tier.PASSAGE_DENSE)
        rankings: dict[Tier, Ranked] = {Tier.BM25: lexical, Tier.PASSAGE_DENSE: dense_ranked}
        weight = cfg.bm25_weight if bm25_weight is None else bm25_weight
        if not 0.0 <= weight <= 1.0:
            raise InvalidRequestError(f"bm25_weight must be between 0 and 1, not {weight}")
        fused = fuse(rankings, method, rrf_k=cfg.rrf_k, bm25_weight=weight)

        skipped: list[str] = []
        reranked = False
        reranker_name: str | None = None
        rerank_scores: dict[int, float] = {}
        pool = fused[: max(k, cfg.rerank_candidates)] if rerank else fused[:k]
        details = await self._details(org_id, [pid for pid, _ in pool])
        if not rerank:
            skipped.append("rerank: not requested")
        elif self.reranker is None or not self.reranker.available:
            reason = self.reranker.reason if self.reranker is not None else None
            skipped.append(f"rerank: {reason or 'no reranker available'}")
        elif pool:
            t0 = time.perf_counter()
            texts = [details[pid]["text"] for pid, _ in pool]
            ranked = await self.reranker.rerank(query, texts)
            rerank_scores = {pool[h.index][0]: float(h.score) for h in ranked}
            # Documents the reranker left out (top_n) keep their order after the scored ones.
            floor = min(rerank_scores.values(), default=0.0) - 1.0
            rerank_scores = {pid: rerank_scores.get(pid, floor) for pid, _ in pool}
            pool = sorted(pool, key=lambda x: (-rerank_scores[x[0]], x[0]))
            reranked = True
            reranker_name = self.reranker.name
            timings["rerank"] = _ms(t0)
        final = pool[:k]

        lexical_scores = dict(lexical)
        section_keys = {(s[0], s[1], s[2]) for s in sections}
        hits = []
        for pid, score in final:
            row = details[pid]
            hit_tiers = []
            if pid in lexical_scores:
                hit_tiers.append(Tier.BM25)
            if (row["source_id"], row["version"], row["section_ordinal"]) in section_keys:
                hit_tiers.append(Tier.SECTION_DENSE)
            if pid in dense_scores:
                hit_tiers.append(Tier.PASSAGE_DENSE)
            hits.append(
                _hit(
                    row,
                    rerank_scores.get(pid, score),
                    lexical_scores.get(pid),
                    dense_scores.get(pid),
                    rerank_scores.get(pid),
                    tuple(hit_tiers),
                )
            )
        if track_usage and hits:
            async with self.db.connection() as conn:
                await conn.execute(
                    USAGE_SQL, {"org": org_id, "ids": sorted(h.passage_id for h in hits)}
                )
        timings["total"] = _ms(started)
        return SearchResult(
            query=query,
            hits=hits,
            tiers=answered,
            fusion=method,
            reranked=reranked,
            reranker=reranker_name,
            skipped=skipped,
            publications=pub.generations,
            lazily_embedded=len(lazily),
            timings_ms=timings,
        )

    async def _details(self, org_id: str, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        if not ids:
            return {}
        async with self.db.connection() as conn:
            cur = await conn.execute(
                HITS_SQL,
                {"org": org_id, "ids": list(ids)},
            )
            return {r["id"]: r for r in await cur.fetchall()}

    # -- backfill ----------------------------------------------------------------------

    async def backfill_passage_vectors(
        self, org_id: str, collection: str, limit: int, *, batch: int = 256
    ) -> int:
        """Embed up to ``limit`` published passages that have no vector, most used first
        (hit count, then last use, then document order). Returns how many were embedded."""
        if limit < 0:
            raise InvalidRequestError("limit must be >= 0")
        done = 0
        while done < limit:
            async with self.db.connection() as conn:
                cur = await conn.execute(
                    TO_EMBED_SQL, (org_id, collection, min(batch, limit - done))
                )
                rows = await cur.fetchall()
            if not rows:
                break
            vectors = await self.embedder.embed([r["text"] for r in rows])
            async with self.db.connection() as conn:
                await _store_vectors(conn, org_id, [int(r["id"]) for r in rows], vectors)
            done += len(rows)
        return done


async def _store_vectors(
    conn: Conn, org_id: str, ids: Sequence[int], vectors: NDArray[np.float32]
) -> None:
    await conn.execute(SET_VECTORS_SQL, (list(ids), [vector_literal(v) for v in vectors], org_id))


async def _const(value: Any) -> Any:
    return value


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 2)


def _hit(
    row: Mapping[str, Any],
    score: float,
    bm25_score: float | None,
    dense_score: float | None,
    rerank_score: float | None,
    tiers: tuple[Tier, ...],
) -> SearchHit:
    heading = tuple(row["heading_path"])
    return SearchHit(
        passage_id=row["id"],
        collection=row["collection"],
        source_id=row["source_id"],
        version=row["version"],
        path=row["path"],
        heading_path=heading,
        line_start=row["line_start"],
        line_end=row["line_end"],
        byte_start=row["byte_start"],
        byte_end=row["byte_end"],
        citation=citation(row["path"], row["line_start"], row["line_end"], heading, row["version"]),
        text=row["text"],
        score=score,
        bm25_score=bm25_score,
        dense_score=dense_score,
        rerank_score=rerank_score,
        tiers=tiers,
    )
