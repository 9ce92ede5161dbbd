"""Build the tool-retrieval development set (issue 15): BFCL's non-live cases in BEIR layout.

The corpus is every distinct function documentation of BFCL's non-live single-turn
categories (``CATEGORIES``, read from the installed ``bfcl-eval`` wheel); the queries are the
cases' user requests; the gold of a query is the functions of its possible answer, each
pointing at the case's own documentation of that function.

- a document: ``title`` the function name; ``text`` the description, then one line per
  parameter ``name (type): description`` with its enum values, bounds and default where
  given (nested properties as ``parent.child``); ``_id`` the name, or, where the same name
  has more than one distinct document, the name + ``#`` + the first 8 hex digits of the
  SHA-256 of ``title + "\\n" + text`` (stable between builds, independent of file order).
  Documentations that differ only in what the text does not show (``"false"`` for
  ``false``, BFCL's ``optional`` list) are one document: a retriever could not tell
  them apart, so a gold on one of two twins would be a coin toss.
- a query: ``_id`` the BFCL case id, ``text`` the user messages of its one turn, joined with
  a newline.
- ``qrels/test.tsv``: ``query-id  corpus-id  score`` (score 1), one row per distinct function
  of the possible answer.

BFCL's ``live_*`` categories are held out for evaluation and never read; neither are its
multi-turn, irrelevance (no gold function) or agentic files. Output is deterministic: rows
sorted, JSON with sorted keys and ``ensure_ascii=False``.

Run: ``.venv/bin/python bench/build_tool_set.py`` (``--bfcl-data DIR``, ``--out DIR``)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bfcl import bfcl_data_dir, single_turn_cases

from cortex_ray.perceive._tool_retrieval import parameter_lines

CATEGORIES = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
)
"""BFCL's non-live single-turn categories with a ground truth (never ``live_*``)."""

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "bfcl-tools"


@dataclass(frozen=True)
class ToolCase:
    """One BFCL case as the set needs it."""

    id: str
    category: str
    question: str
    functions: tuple[Mapping[str, Any], ...]
    gold: tuple[str, ...]
    """The distinct function names of the possible answer, in answer order."""


@dataclass(frozen=True)
class ToolSet:
    """The BEIR rows, sorted, and the counts the README reports."""

    corpus: list[dict[str, str]]
    queries: list[dict[str, str]]
    qrels: list[tuple[str, str, int]]
    counts: dict[str, dict[str, float]]


def read_cases(data_dir: Path, category: str) -> list[ToolCase]:
    """Every case of ``category`` with its gold function names, in file order.

    Read with ``_bfcl.single_turn_cases``; not ``_bfcl.load_cases``, which admits the Python
    categories only (the agent benchmark's): this set also takes BFCL's Java and JavaScript
    cases.
    """
    if category not in CATEGORIES:
        raise ValueError(f"unknown or held-out category {category!r} (known: {CATEGORIES})")
    cases = []
    for raw, question, answers in single_turn_cases(data_dir, category):
        gold = tuple(dict.fromkeys(next(iter(call)) for call in answers))
        offered = {f["name"] for f in raw["function"]}
        if len(offered) != len(raw["function"]):
            raise ValueError(f"{raw['id']}: two functions share a name")
        if not gold or not set(gold) <= offered:
            raise ValueError(f"{raw['id']}: gold {gold} not among its functions {offered}")
        cases.append(ToolCase(raw["id"], category, question, tuple(raw["function"]), gold))
    return cases


def doc_text(doc: Mapping[str, Any]) -> str:
    """The description, then one line per parameter (nested ones as ``parent.child``)."""
    lines = [str(doc.get("description") or "").strip()]
    properties = (doc.get("parameters") or {}).get("properties") or {}
    for name, spec in properties.items():
        lines.extend(parameter_lines(name, spec))
    return "\n".join(line for line in lines if line)


def _case_order(case_id: str) -> tuple[int, int]:
    category, _, index = case_id.rpartition("_")
    return CATEGORIES.index(category), int(index)


def build(data_dir: Path, categories: Sequence[str] = CATEGORIES) -> ToolSet:
    """The set from the BFCL data folder ``data_dir``."""
    cases = [case for category in categories for case in read_cases(data_dir, category)]
    texts = {(d["name"], doc_text(d)) for case in cases for d in case.functions}
    variants: dict[str, list[str]] = defaultdict(list)
    for name, text in texts:
        variants[name].append(text)
    doc_id: dict[tuple[str, str], str] = {}
    for name, group in variants.items():
        if len(group) == 1:
            doc_id[name, group[0]] = name
            continue
        for text in group:
            digest = hashlib.sha256(f"{name}\n{text}".encode()).hexdigest()
            doc_id[name, text] = f"{name}#{digest[:8]}"
        if len({doc_id[name, t] for t in group}) != len(group):
            raise ValueError(f"{name}: hash suffixes collide")
    corpus = sorted(
        ({"_id": doc_id[key], "title": key[0], "text": key[1]} for key in texts),
        key=lambda row: row["_id"],
    )
    queries = sorted(
        ({"_id": case.id, "text": case.question} for case in cases),
        key=lambda row: _case_order(row["_id"]),
    )
    qrels: list[tuple[str, str, int]] = []
    for case in sorted(cases, key=lambda c: _case_order(c.id)):
        own = {d["name"]: doc_id[d["name"], doc_text(d)] for d in case.functions}
        qrels.extend((case.id, cid, 1) for cid in sorted(own[name] for name in case.gold))
    return ToolSet(corpus, queries, qrels, _counts(cases, corpus, qrels, doc_id))


def _counts(
    cases: Sequence[ToolCase],
    corpus: Sequence[Mapping[str, str]],
    qrels: Sequence[tuple[str, str, int]],
    doc_id: Mapping[tuple[str, str], str],
) -> dict[str, dict[str, float]]:
    """Per category and in total: queries, qrels, gold per query, offered functions per
    case, documents the category uses."""
    gold_of = Counter(q for q, _, _ in qrels)
    counts: dict[str, dict[str, float]] = {}
    groups = [(c, [x for x in cases if x.category == c]) for c in CATEGORIES]
    for name, group in [*groups, ("total", list(cases))]:
        if not group:
            continue
        used = {doc_id[d["name"], doc_text(d)] for case in group for d in case.functions}
        n_qrels = sum(gold_of[case.id] for case in group)
        counts[name] = {
            "queries": len(group),
            "qrels": n_qrels,
            "gold_per_query": n_qrels / len(group),
            "functions_per_case": sum(len(c.functions) for c in group) / len(group),
            "documents": len(used),
        }
    counts["total"]["documents"] = len(corpus)
    return counts


def _dump(row: Mapping[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, ensure_ascii=False)


def write(tool_set: ToolSet, out: Path) -> list[Path]:
    """``corpus.jsonl``, ``queries.jsonl`` and ``qrels/test.tsv`` under ``out``."""
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    files = {
        out / "corpus.jsonl": "".join(_dump(r) + "\n" for r in tool_set.corpus),
        out / "queries.jsonl": "".join(_dump(r) + "\n" for r in tool_set.queries),
        out / "qrels" / "test.tsv": "query-id\tcorpus-id\tscore\n"
        + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in tool_set.qrels),
    }
    for path, text in files.items():
        path.write_text(text, encoding="utf-8", newline="\n")
    return list(files)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bfcl-data",
        type=Path,
        default=None,
        help="BFCL's data folder (default: the installed bfcl-eval package's)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the BEIR folder to write")
    args = parser.parse_args()
    data_dir = args.bfcl_data or bfcl_data_dir()
    if data_dir is None:
        parser.error("bfcl-eval is not installed (./dev setup installs it); pass --bfcl-data")
    tool_set = build(data_dir)
    paths = write(tool_set, args.out)
    size = sum(p.stat().st_size for p in paths)
    print(f"{args.out}: {size / 1e6:.2f} MB")
    print(f"{'category':<18} {'queries':>7} {'qrels':>6} {'gold/q':>6} {'fns/case':>8} {'docs':>5}")
    for name, c in tool_set.counts.items():
        print(
            f"{name:<18} {c['queries']:>7.0f} {c['qrels']:>6.0f} {c['gold_per_query']:>6.2f} "
            f"{c['functions_per_case']:>8.2f} {c['documents']:>5.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
