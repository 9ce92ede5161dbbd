"""The BM25 analyzer: identifier parts and stems, the analyzer recorded with each generation
and used for the queries that read it, and migration 0009 on a database that has rows."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping

import bm25s
import numpy as np
import psycopg
import pytest
from knowledge_fixtures import split_markdown

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray.knowledge import (
    BM25_B,
    BM25_K1,
    Analyzer,
    KnowledgeService,
    KnowledgeWriter,
    PublishReport,
    RetrievalConfig,
    tokenize,
)
from cortex_ray.knowledge._bm25 import DEFAULT, PLAIN
from cortex_ray.models import HashEmbedder
from cortex_ray.storage import Database
from cortex_ray.storage._database import _alembic

STEM = Analyzer(stem=True)
IDENTIFIERS = Analyzer(identifiers=True)
BOTH = Analyzer(stem=True, identifiers=True)


# -- text to terms ---------------------------------------------------------------------


def test_identifiers_give_their_whole_and_their_parts() -> None:
    text = "Call math.factorial, get_weather_forecast and calculateROE on HTTPServer top-k."
    assert IDENTIFIERS.tokenize(text) == [
        "call",
        "math.factorial",
        "math",
        "factorial",
        "get_weather_forecast",
        "get",
        "weather",
        "forecast",
        "calculateroe",
        "calculate",
        "roe",
        "httpserver",
        "http",
        "server",
        "top-k",
        "top",
        "k",
    ]
    # A dotted name whose last word is snake_case: the name, each word, the word's parts;
    # stopword parts go, the whole that holds them stays; a sentence's final dot is no joiner.
    assert IDENTIFIERS.tokenize("numpy.linalg.norm_two of-the. End") == [
        "numpy.linalg.norm_two",
        "numpy",
        "linalg",
        "norm_two",
        "norm",
        "two",
        "of-the",
        "end",
    ]
    # Leading and doubled underscores are separators, not parts.
    assert IDENTIFIERS.tokenize("__init__ snake__case") == ["init", "snake__case", "snake", "case"]


def test_stemming_stems_words_but_not_whole_identifiers() -> None:
    assert STEM.tokenize("The runners were running through cities") == [
        "runner",
        "run",
        "through",
        "citi",
    ]
    assert BOTH.tokenize("get_weather_forecasts") == [
        "get_weather_forecasts",
        "get",
        "weather",
        "forecast",
    ]
    # Without identifier splitting a snake_case name is one word, stemmed as one.
    assert STEM.tokenize("get_weather_forecasts") == ["get_weather_forecast"]
    assert STEM.query_terms("run runs running") == ["run"]


def test_plain_is_the_tokeniser_generations_were_written_with_before() -> None:
    text = "The Ünïcode  café's 42 of-them math.factorial get_weather calculateROE"
    expected = ["ünïcode", "café", "s", "42", "them", "math", "factorial", "get_weather"]
    assert PLAIN.tokenize(text) == [*expected, "calculateroe"]
    assert tokenize(text, PLAIN) == PLAIN.tokenize(text)
    assert Analyzer() == PLAIN


def test_the_default_analyzer_is_the_settings_default() -> None:
    assert DEFAULT == Analyzer.configured(RetrievalConfig()) == BOTH
    assert tokenize("get_weather") == ["get_weather", "get", "weather"]


def test_names_and_the_stored_form() -> None:
    for analyzer in (PLAIN, STEM, IDENTIFIERS, BOTH):
        assert Analyzer.parse(analyzer.name) == analyzer
        assert Analyzer.from_json(analyzer.to_json()) == analyzer
    assert [a.name for a in (PLAIN, STEM, IDENTIFIERS, BOTH)] == [
        "plain",
        "stem",
        "identifiers",
        "stem+identifiers",
    ]
    assert Analyzer.parse("identifiers,stem") == BOTH
    assert Analyzer.from_json({}) == PLAIN  # the column's default: rows from before 0009
    with pytest.raises(ValueError, match="lemma"):
        Analyzer.from_json({"lemma": True})
    with pytest.raises(ValueError, match="lemma"):
        Analyzer.parse("stem+lemma")
    assert Analyzer.configured(RetrievalConfig(bm25_identifiers=False)) == STEM


# -- the store -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def writer(db: Database) -> Iterator[KnowledgeWriter]:
    with KnowledgeWriter(db.dsn) as w:
        yield w


def write(
    writer: KnowledgeWriter,
    org: str,
    collection: str,
    files: Mapping[str, bytes],
    analyzer: Analyzer | None,
) -> PublishReport:
    """One run of a job: new or changed files written, unchanged ones carried forward."""
    gen = writer.begin_generation(org, collection, analyzer=analyzer)
    for path, data in files.items():
        source = writer.register_source(
            org, collection, path, hashlib.sha256(data).hexdigest(), len(data)
        )
        if source.unchanged:
            writer.carry_forward(gen, source.source_id)
        else:
            writer.write_passages(gen, source, split_markdown(data)[1])
    return writer.publish(gen)


def stored_analyzer(dsn: str, org: str, collection: str) -> Analyzer:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT g.analyzer FROM kb_collections c JOIN kb_generations g "
            "ON g.org_id = c.org_id AND g.id = c.published_generation "
            "WHERE c.org_id = %s AND c.name = %s",
            (org, collection),
        ).fetchone()
    assert row is not None
    return Analyzer.from_json(row[0])


RUNNERS = b"# Race\n\nThe runners were running through the cities.\n"
WEATHER = b"# Tools\n\nget_weather_forecast returns the forecast of a city.\n"


async def paths(service: KnowledgeService, org: str, query: str, collection: object) -> list[str]:
    result = await service.search(
        org,
        query,
        collection=collection,
        tiers=["bm25"],
        track_usage=False,  # type: ignore[arg-type]
    )
    return sorted(h.path for h in result.hits)


async def test_the_generation_analyzer_tokenises_the_queries(writer, db, org) -> None:
    service = KnowledgeService(db, HashEmbedder(384))
    write(writer, org, "stemmed", {"race.md": RUNNERS}, STEM)
    write(writer, org, "plain", {"race.md": RUNNERS}, PLAIN)
    assert stored_analyzer(db.dsn, org, "stemmed") == STEM
    assert stored_analyzer(db.dsn, org, "plain") == PLAIN
    pub = await service.publication(org, ["stemmed", "plain"])
    assert pub.analyzers == {"stemmed": STEM, "plain": PLAIN}

    # An inflection finds the stemmed collection; the plain one needs the very words.
    assert await paths(service, org, "runs in a city", "stemmed") == ["race.md"]
    assert await paths(service, org, "runs in a city", "plain") == []
    assert await paths(service, org, "runners cities", "plain") == ["race.md"]

    # Searched together, each collection reads the query with its own analyzer.
    both = await service.search(
        org, "runners cities", collection=["stemmed", "plain"], tiers=["bm25"]
    )
    assert sorted(h.collection for h in both.hits) == ["plain", "stemmed"]
    inflected = await service.search(org, "city", collection=["stemmed", "plain"], tiers=["bm25"])
    assert [h.collection for h in inflected.hits] == ["stemmed"]


async def test_identifier_parts_are_found_and_scores_equal_the_reference(writer, db, org) -> None:
    """BM25 in PostgreSQL equals ``bm25s`` on the analyzer's tokens, with both options on."""
    files = {
        "tools.md": WEATHER,
        "math.md": b"# Math\n\nmath.factorial computes factorials; math.gcd divides.\n",
        "finance.md": b"# Finance\n\ncalculateROE takes the net income and the equity.\n",
        "race.md": RUNNERS,
    }
    write(writer, org, "tools", files, BOTH)
    service = KnowledgeService(db, HashEmbedder(384))
    assert await paths(service, org, "weather forecasts", "tools") == ["tools.md"]
    assert await paths(service, org, "what is math.factorial of 5", "tools") == ["math.md"]
    assert await paths(service, org, "calculate the ROE", "tools") == ["finance.md"]

    texts = [p.text for data in files.values() for p in split_markdown(data)[1]]
    model = bm25s.BM25(k1=BM25_K1, b=BM25_B, method="lucene")
    model.index([BOTH.tokenize(t) for t in texts], show_progress=False)
    pub = await service.publication(org, "tools")
    for query in ("math.factorial factorial", "forecast of the city", "calculating income"):
        terms = [t for t in BOTH.query_terms(query) if t in model.vocab_dict]
        expected = sorted((float(s) for s in model.get_scores(terms) if s > 0), reverse=True)
        got = await service.lexical(org, pub, query, 10, exact=True)
        assert expected and [s for _, s in got] == pytest.approx(expected, rel=1e-5)


async def test_a_collection_keeps_the_analyzer_it_was_published_with(
    writer, db, org, monkeypatch
) -> None:
    monkeypatch.setenv("CORTEX_KNOWLEDGE__BM25_STEM", "true")
    monkeypatch.setenv("CORTEX_KNOWLEDGE__BM25_IDENTIFIERS", "false")
    write(writer, org, "docs", {"race.md": RUNNERS}, None)  # a new collection: the setting
    assert stored_analyzer(db.dsn, org, "docs") == STEM

    # The setting changes: the next run keeps the published analyzer (its carried-forward
    # source keeps its postings), and asking for another one explicitly is refused.
    monkeypatch.setenv("CORTEX_KNOWLEDGE__BM25_STEM", "false")
    report = write(writer, org, "docs", {"race.md": RUNNERS, "tools.md": WEATHER}, None)
    assert report.added_sources == 1
    assert stored_analyzer(db.dsn, org, "docs") == STEM
    service = KnowledgeService(db, HashEmbedder(384))
    assert await paths(service, org, "runs forecasts", "docs") == ["race.md", "tools.md"]
    with pytest.raises(InvalidRequestError, match="written with the stem analyzer"):
        writer.begin_generation(org, "docs", analyzer=PLAIN)


def test_a_collection_that_was_never_published_keeps_its_first_analyzer(writer, db, org) -> None:
    # A first run wrote the file and died before publishing; the rerun, with another
    # setting, would reuse that version's passages and postings: it keeps the analyzer.
    killed = writer.begin_generation(org, "race", analyzer=STEM)
    source = writer.register_source(org, "race", "race.md", "h", len(RUNNERS))
    writer.write_passages(killed, source, split_markdown(RUNNERS)[1])
    rerun = writer.begin_generation(org, "race", analyzer=None)
    writer.write_passages(rerun, source, split_markdown(RUNNERS)[1])
    writer.publish(rerun)
    assert stored_analyzer(db.dsn, org, "race") == STEM


def test_publish_refuses_a_generation_of_another_analyzer(writer, db, org) -> None:
    first = writer.begin_generation(org, "race", analyzer=STEM)
    second = writer.begin_generation(org, "race")
    # As a run that began at the same moment, with another setting, would have recorded it.
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE kb_generations SET analyzer = '{}' WHERE org_id = %s AND id = %s",
            (org, second.id),
        )
    writer.publish(first)
    with pytest.raises(InvalidRequestError, match="written with the plain analyzer"):
        writer.publish(second)


# -- the migration ---------------------------------------------------------------------


async def test_the_migration_gives_existing_generations_the_plain_analyzer(
    scratch_database,
) -> None:
    async with scratch_database("analyzer") as dsn:
        _alembic(dsn, "upgrade", "0008")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO organisations (id) VALUES ('acme');"
                "INSERT INTO kb_collections (org_id, name) VALUES ('acme', 'docs');"
                "INSERT INTO kb_generations (org_id, collection, status) "
                "VALUES ('acme', 'docs', 'PUBLISHED')"
            )
        _alembic(dsn, "upgrade", "head")
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT analyzer FROM kb_generations").fetchall()
            assert [Analyzer.from_json(r[0]) for r in rows] == [PLAIN]
        _alembic(dsn, "downgrade", "0008")
        with psycopg.connect(dsn, autocommit=True) as conn:
            columns = conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'kb_generations'"
            ).fetchall()
            assert "analyzer" not in {c for (c,) in columns}
        _alembic(dsn, "upgrade", "head")


def test_the_options_off_path_is_unchanged_on_random_text() -> None:
    """PLAIN against the tokeniser as it was written before the analyzer existed."""
    import re

    def before(text: str) -> list[str]:
        from cortex_ray.knowledge import STOPWORDS

        return [t for t in re.findall(r"\w+", text.lower()) if t not in STOPWORDS and len(t) <= 64]

    rng = np.random.default_rng(0)
    alphabet = [*"abcXYZ_.-' 09é\nİ", "the ", "of ", "What "]
    for _ in range(200):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 80))))
        assert PLAIN.tokenize(text) == before(text)
