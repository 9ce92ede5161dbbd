"""The tool-retrieval development set (bench/data/bfcl-tools, built by bench/build_tool_set.py):
the committed files are exactly what the installed bfcl-eval gives, and the set is whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench_modules import load_bench

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "bench" / "data" / "bfcl-tools"
FILES = ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv")


build_tool_set = load_bench("build_tool_set")
DATA = build_tool_set.bfcl_data_dir()
needs_data = pytest.mark.skipif(
    DATA is None, reason="bfcl-eval is not installed (./dev setup installs it)"
)


def _rows(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _qrels(path: Path) -> list[list[str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "query-id\tcorpus-id\tscore"
    return [line.split("\t") for line in lines[1:]]


@needs_data
def test_rebuild_is_byte_identical(tmp_path: Path) -> None:
    build_tool_set.write(build_tool_set.build(DATA), tmp_path)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (COMMITTED / name).read_bytes(), name


def test_every_qrel_points_at_a_document_and_every_query_has_one() -> None:
    corpus = _rows(COMMITTED / "corpus.jsonl")
    queries = _rows(COMMITTED / "queries.jsonl")
    qrels = _qrels(COMMITTED / "qrels" / "test.tsv")
    doc_ids = [row["_id"] for row in corpus]
    query_ids = [row["_id"] for row in queries]
    assert len(set(doc_ids)) == len(doc_ids) and len(set(query_ids)) == len(query_ids)
    assert all(row["title"] and row["text"] for row in corpus)
    assert all(row["text"].strip() for row in queries)
    assert {doc for _, doc, _ in qrels} <= set(doc_ids)
    assert {query for query, _, _ in qrels} == set(query_ids)
    assert {score for _, _, score in qrels} == {"1"}
    assert len({(q, d) for q, d, _ in qrels}) == len(qrels)
    # a gold document is the case's own function: its title is a function name of the answer
    title = {row["_id"]: row["title"] for row in corpus}
    assert all(doc == title[doc] or doc.startswith(title[doc] + "#") for _, doc, _ in qrels)
    assert not any(q.startswith(("live_", "multi_turn", "irrelevance")) for q in query_ids)


@needs_data
def test_gold_is_the_cases_own_documentation() -> None:
    # parallel_multiple_1 asks for two areas; its functions include volume_cylinder.calculate
    # (offered, not gold) and area_rectangle.calculate / area_circle.calculate (gold)
    tool_set = build_tool_set.build(DATA, ["parallel_multiple"])
    gold = sorted(d for q, d, _ in tool_set.qrels if q == "parallel_multiple_1")
    assert [g.split("#")[0] for g in gold] == ["area_circle.calculate", "area_rectangle.calculate"]
    case = next(
        c
        for c in build_tool_set.read_cases(DATA, "parallel_multiple")
        if c.id == "parallel_multiple_1"
    )
    texts = {row["_id"]: row["text"] for row in tool_set.corpus}
    for doc_id in gold:
        doc = next(d for d in case.functions if d["name"] == doc_id.split("#")[0])
        assert texts[doc_id] == build_tool_set.doc_text(doc)


def test_document_text_has_parameters_enums_defaults_and_nesting() -> None:
    doc = {
        "name": "hotel.book",
        "description": "Book a hotel room.",
        "parameters": {
            "type": "dict",
            "properties": {
                "nights": {"type": "integer", "description": "How many nights.", "maximum": 30},
                "view": {"type": "string", "description": "Room view.", "enum": ["sea", "city"]},
                "extras": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["spa", "parking"]},
                    "description": "Services.",
                    "default": [],
                },
                "guest": {
                    "type": "dict",
                    "description": "Who stays.",
                    "properties": {"name": {"type": "string", "description": "Full name."}},
                },
                "note": {"type": "string", "description": "", "default": "none"},
            },
        },
    }
    assert build_tool_set.doc_text(doc).splitlines() == [
        "Book a hotel room.",
        "nights (integer): How many nights. (maximum: 30)",
        "view (string): Room view. (one of: sea, city)",
        "extras (array of string): Services. (one of: spa, parking; default: [])",
        "guest (dict): Who stays.",
        "guest.name (string): Full name.",
        "note (string): default: none",
    ]


def test_held_out_categories_are_refused(tmp_path: Path) -> None:
    for category in ("live_simple", "live_multiple", "multi_turn_base", "irrelevance"):
        with pytest.raises(ValueError, match="held-out"):
            build_tool_set.read_cases(tmp_path, category)


def test_same_name_different_docs_get_stable_distinct_ids(tmp_path: Path) -> None:
    def doc(description: str, default: object) -> dict[str, Any]:
        params = {"x": {"type": "boolean", "description": "flag", "default": default}}
        return {"name": "f", "description": description, "parameters": {"properties": params}}

    def case(i: int, fn: dict[str, Any]) -> tuple[str, str]:
        question = {"id": f"simple_python_{i}", "question": [[{"role": "user", "content": "q"}]]}
        answer = {"id": f"simple_python_{i}", "ground_truth": [{"f": {"x": [True]}}]}
        return json.dumps({**question, "function": [fn]}), json.dumps(answer)

    # 0 and 1 differ only in "false" vs false (the same text: one document); 2 differs
    rows = [case(0, doc("A", "false")), case(1, doc("A", False)), case(2, doc("B", False))]
    (tmp_path / "possible_answer").mkdir()
    name = "BFCL_v4_simple_python.json"
    (tmp_path / name).write_text("\n".join(r[0] for r in rows))
    (tmp_path / "possible_answer" / name).write_text("\n".join(r[1] for r in rows))
    first = build_tool_set.build(tmp_path, ["simple_python"])
    rows.reverse()
    (tmp_path / name).write_text("\n".join(r[0] for r in rows))
    second = build_tool_set.build(tmp_path, ["simple_python"])
    assert first == second
    ids = [row["_id"] for row in first.corpus]
    assert len(ids) == 2 and all(i.startswith("f#") and len(i) == len("f#") + 8 for i in ids)
    gold = {q: d for q, d, _ in first.qrels}
    assert gold["simple_python_0"] == gold["simple_python_1"] != gold["simple_python_2"]
