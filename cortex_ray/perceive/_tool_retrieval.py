"""Tool retrieval: the part of a large action space that a prompt shows.

An agent may hold more tools than one prompt can show (the context, and a small model's
attention, are the limit). Above ``tool_retrieval_threshold`` tools, PERCEIVE shows the
``tool_retrieval_k`` tools retrieved for the objective and the freshest progress, plus the
tools it must always see (:func:`always_shown`); the rest stay held (``WorkingMemory``'s
``hidden_tools``): a candidate naming one is still validated and goes through the one gate.

Retrieval is the knowledge search's, in memory (a few hundred tools need no database): BM25
over each tool's document (:func:`tool_document`: its name, description and parameter docs)
with the analyzer the knowledge settings give new collections, cosine of the runtime's
embedder, and the two rankings fused by ``cortex_ray.knowledge``'s ``fuse`` with the method
and weights of ``settings.knowledge``, so tools follow whatever fusion knowledge search uses.
Tool vectors are computed once per document and an index once per tool set (keyed by a hash
of the documents), so a step pays one query embedding.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from cortex_ray._types import AgentMode, Observation, ToolSpec, Turn
from cortex_ray.act import BUILTIN_TOOL_NAMES, KNOWLEDGE_SEARCH
from cortex_ray.knowledge import Analyzer, RetrievalConfig, Tier, fuse, idf, tf_factor
from cortex_ray.models import Embedder

__all__ = [
    "ToolIndex",
    "ToolRetriever",
    "always_shown",
    "parameter_lines",
    "shown_note",
    "tool_document",
]

Ranked = list[tuple[int, float]]
"""(tool's position in the index, score), best first."""

_EMBED_BATCH = 256
_MAX_VECTORS = 20_000  # tool documents whose vectors are kept (384 floats each: ~30 MB)
_MAX_INDEXES = 32  # tool sets whose index is kept


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def parameter_lines(name: str, spec: Mapping[str, Any]) -> list[str]:
    """``name (type): description (one of: …; minimum: …; maximum: …; default: …)``, the
    parenthesis holding what is given, then the nested properties as ``parent.child``: the
    layout bench/data/bfcl-tools is built with (bench/build_tool_set.py calls this), so the
    runtime indexes the text retrieval was measured on."""
    kind = str(spec.get("type") or "")
    items = spec.get("items") if isinstance(spec.get("items"), Mapping) else None
    if items is not None and items.get("type"):
        kind = f"{kind} of {items['type']}"
    head = f"{name} ({kind})" if kind else name
    description = str(spec.get("description") or "").strip()
    extras = []
    enum = spec.get("enum") or (items or {}).get("enum")
    if enum:
        extras.append("one of: " + ", ".join(_value(v) for v in enum))
    for key in ("minimum", "maximum", "default"):
        if key in spec:
            extras.append(f"{key}: {_value(spec[key])}")
    body = description
    if extras:
        body = f"{description} ({'; '.join(extras)})" if description else "; ".join(extras)
    lines = [f"{head}: {body}" if body else head]
    nested = spec.get("properties") or (items or {}).get("properties") or {}
    for child, child_spec in nested.items():
        if isinstance(child_spec, Mapping):
            lines.extend(parameter_lines(f"{name}.{child}", child_spec))
    return lines


def tool_document(spec: ToolSpec) -> str:
    """What a tool is found by: its name, its description, then one line per parameter,
    ``name (type): description (one of: …; minimum: …; maximum: …; default: …)``, nested
    properties as ``parent.child`` (the layout of the tool-retrieval development set)."""
    lines = [spec.name, spec.description.strip()]
    properties = spec.parameters.get("properties") or {}
    for name, param in properties.items():
        if isinstance(param, Mapping):
            lines.extend(parameter_lines(name, param))
    return "\n".join(line for line in lines if line)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class ToolIndex:
    """BM25 and cosine over a fixed list of tool documents, fused like knowledge search.

    Args:
        documents: one text per tool (:func:`tool_document`).
        vectors: their unit-length vectors, one row each.
        analyzer: BM25's analyzer (the knowledge settings' for new collections).
    """

    def __init__(
        self, documents: Sequence[str], vectors: NDArray[np.float32], analyzer: Analyzer
    ) -> None:
        if len(documents) != len(vectors):
            raise ValueError(f"{len(documents)} documents but {len(vectors)} vectors")
        self.analyzer = analyzer
        self.size = len(documents)
        self.vectors = np.asarray(vectors, dtype=np.float32)
        counts = [analyzer.term_counts(text) for text in documents]
        avgdl = sum(length for _, length in counts) / max(self.size, 1)
        by_term: dict[str, tuple[list[int], list[float]]] = {}
        for doc, (tfs, length) in enumerate(counts):
            for term, tf in tfs.items():
                docs, factors = by_term.setdefault(term, ([], []))
                docs.append(doc)
                factors.append(tf_factor(tf, length, avgdl))
        # term → (documents, idf · tf-factor): a query adds up the impacts of its terms.
        self._postings: dict[str, tuple[NDArray[np.int64], NDArray[np.float64]]] = {
            term: (
                np.array(docs, dtype=np.int64),
                idf(self.size, len(docs)) * np.array(factors, dtype=np.float64),
            )
            for term, (docs, factors) in by_term.items()
        }

    def bm25(self, query: str, n: int) -> Ranked:
        """The ``n`` best documents by BM25 (only those sharing a term with the query)."""
        scores = np.zeros(self.size, dtype=np.float64)
        hit = False
        for term in self.analyzer.query_terms(query):
            posting = self._postings.get(term)
            if posting is not None:
                scores[posting[0]] += posting[1]  # a term's documents are distinct
                hit = True
        if not hit:
            return []
        return _top(scores, n, positive=True)

    def dense(self, vector: NDArray[np.float32], n: int) -> Ranked:
        """The ``n`` nearest documents by cosine (vectors are unit length)."""
        return _top(self.vectors @ np.asarray(vector, dtype=np.float32), n)

    def rank(self, query: str, vector: NDArray[np.float32], config: RetrievalConfig) -> list[int]:
        """Documents best first: BM25 and dense fused as ``config`` says."""
        rankings = {
            Tier.BM25: self.bm25(query, config.bm25_candidates),
            Tier.PASSAGE_DENSE: self.dense(vector, config.dense_candidates),
        }
        fused = fuse(rankings, config.fusion, rrf_k=config.rrf_k, bm25_weight=config.bm25_weight)
        return [doc for doc, _ in fused]


def _top(scores: NDArray[Any], n: int, *, positive: bool = False) -> Ranked:
    """The ``n`` highest scores, best first, ties by position (as ``fuse`` breaks them)."""
    order = np.lexsort((np.arange(len(scores)), -scores))[:n]
    return [(int(i), float(scores[i])) for i in order if not positive or scores[i] > 0]


class ToolRetriever:
    """Chooses the tools a prompt shows from the ones an agent holds.

    Args:
        embedder: the runtime's embedder (tool documents and queries).
        config: knowledge search's settings: BM25's analyzer, the fusion and its weights.
        threshold: above this many held tools, retrieval applies (``tool_retrieval_threshold``).
        k: tools retrieved for the prompt, beside those always shown (``tool_retrieval_k``).
    """

    def __init__(
        self, embedder: Embedder, config: RetrievalConfig, *, threshold: int, k: int
    ) -> None:
        self.embedder = embedder
        self.config = config
        self.threshold = threshold
        self.k = k
        self.analyzer = Analyzer.configured(config)
        self._vectors: OrderedDict[str, NDArray[np.float32]] = OrderedDict()
        self._indexes: OrderedDict[str, ToolIndex] = OrderedDict()
        # The registry hands out one ToolSpec per tool, so a spec's document is written once
        # (kept with the spec itself, so that its id cannot be reused while it is cached).
        self._documents: dict[int, tuple[ToolSpec, str]] = {}

    def document(self, spec: ToolSpec) -> str:
        """:func:`tool_document` of ``spec``, cached for the same spec object (writing the
        documents of 769 tools took 27 ms a step; the look-up takes well under 1)."""
        found = self._documents.get(id(spec))
        if found is not None and found[0] is spec:
            return found[1]
        text = tool_document(spec)
        if len(self._documents) >= _MAX_VECTORS:
            self._documents.clear()
        self._documents[id(spec)] = (spec, text)
        return text

    def applies(self, held: int) -> bool:
        """Retrieval narrows an action space of ``held`` tools."""
        return held > self.threshold and held > self.k

    async def index(self, documents: Sequence[str]) -> ToolIndex:
        """The index of these documents, built once per tool set (kept for the last 32 sets;
        vectors for the last 20,000 documents, so sets that share tools share vectors)."""
        key = _digest("\x00".join(documents))
        found = self._indexes.get(key)
        if found is not None:
            self._indexes.move_to_end(key)
            return found
        digests = [_digest(text) for text in documents]
        missing = list(dict.fromkeys(d for d in digests if d not in self._vectors))
        if missing:
            text_of = dict(zip(digests, documents, strict=True))
            for start in range(0, len(missing), _EMBED_BATCH):
                batch = missing[start : start + _EMBED_BATCH]
                vectors = await self.embedder.embed([text_of[d] for d in batch])
                for digest, vector in zip(batch, vectors, strict=True):
                    self._vectors[digest] = np.asarray(vector, dtype=np.float32)
        matrix = np.stack([self._vectors[d] for d in digests])
        for digest in digests:
            self._vectors.move_to_end(digest)
        while len(self._vectors) > max(_MAX_VECTORS, len(digests)):
            self._vectors.popitem(last=False)
        built = ToolIndex(documents, matrix, self.analyzer)
        self._indexes[key] = built
        while len(self._indexes) > _MAX_INDEXES:
            self._indexes.popitem(last=False)
        return built

    async def retrieve(self, tools: Sequence[ToolSpec], query: str, k: int) -> list[ToolSpec]:
        """The ``k`` tools that best fit ``query``, best first."""
        if not tools or k <= 0:
            return []
        index = await self.index([self.document(t) for t in tools])
        vector = (await self.embedder.embed([query]))[0]
        return [tools[i] for i in index.rank(query, vector, self.config)[:k]]

    async def shown(
        self, held: Sequence[ToolSpec], query: str, keep: Collection[str] = ()
    ) -> tuple[tuple[ToolSpec, ...], tuple[ToolSpec, ...]]:
        """``(shown, hidden)``: all of ``held`` and nothing hidden at or below the threshold;
        above it the ``k`` tools retrieved for ``query`` and every tool named in ``keep``.
        Both keep the order of ``held`` (the prompt lists tools by category and name, not by
        score)."""
        if not self.applies(len(held)):
            return tuple(held), ()
        candidates = [t for t in held if t.name not in keep]
        chosen = {t.name for t in await self.retrieve(candidates, query, self.k)} | set(keep)
        shown = tuple(t for t in held if t.name in chosen)
        hidden = tuple(t for t in held if t.name not in chosen)
        return shown, hidden


def always_shown(
    mode: AgentMode, observations: Iterable[Observation], conversation: Iterable[Turn]
) -> set[str]:
    """Tools a retrieved action space keeps whatever the objective: the runtime's own (memory,
    the clock, ``knowledge_search``, and ``reply``, with which an interactive agent finishes;
    an autonomous run finishes by its answer, no tool) and every tool this run or
    conversation already called (the planner is told of those calls and may need to call
    again)."""
    keep = {*BUILTIN_TOOL_NAMES, KNOWLEDGE_SEARCH.name}
    if mode is AgentMode.AUTONOMOUS:
        keep.discard("reply")
    keep.update(o.tool for o in observations)
    keep.update(t.tool for t in conversation if t.tool)
    return keep


def shown_note(shown: Sequence[ToolSpec], hidden: Sequence[ToolSpec]) -> str | None:
    """What the step log says of a retrieved action space (``None`` when all were shown)."""
    if not hidden:
        return None
    names = ", ".join(t.name for t in shown)
    return f"tools shown: {len(shown)} of {len(shown) + len(hidden)} (tool retrieval): {names}"
