"""The lexical model: the analyzer (text to terms) shared by ingest, queries and the
reference, and BM25's formula.

An :class:`Analyzer` turns text into terms. With both options off (``PLAIN``, what every
generation written before migration 0009 used) it lower-cases, splits on Unicode word
characters (``\\w+``), drops a short English stopword list (function and question words) and
terms longer than 64 characters. Two options (docs/knowledge.md, "Analyzer"):

- ``stem``: English Snowball stemming (``snowballstemmer``'s pure-Python stemmer, pinned, so
  every process stems alike) of each word after the stopword check;
- ``identifiers``: a snake_case, camelCase/PascalCase, dotted or kebab name gives its whole
  (``math.factorial``, ``get_weather_forecast``, ``calculateroe``) *and* its parts (``math``,
  ``factorial``; ``get``, ``weather``, ``forecast``; ``calculate``, ``roe``). Wholes are kept
  as written (lower-cased, never stemmed): they are the exact names a query may quote.

The analyzer a generation is written with is stored with it (``kb_generations.analyzer``)
and a search tokenises the query with the analyzer of each generation it reads, so the
postings (computed in Python and copied into PostgreSQL) and the query terms never disagree.

BM25 is the Lucene variant (as in Kamphuis et al., ECIR 2020, and ``bm25s``'s default):
``idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))`` and
``tf-factor = tf / (tf + k1 · (1 - b + b · dl / avgdl))``. ``k1`` and ``b`` are constants of
the stored index: the per-posting impacts are computed with them at write time.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cortex_ray.settings import RetrievalConfig

__all__ = [
    "BM25_B",
    "BM25_K1",
    "DEFAULT",
    "PLAIN",
    "STOPWORDS",
    "Analyzer",
    "idf",
    "length_norm",
    "query_terms",
    "term_counts",
    "tf_factor",
    "tokenize",
]

BM25_K1 = 1.2
BM25_B = 0.75
MAX_TERM_CHARS = 64

# The most frequent English function words plus question words ("what", "how", ...): enough
# to keep the postings of "the" and "of" (in nearly every passage) out of the index and the
# interrogatives out of questions, small enough not to remove content words. Measured on
# wiki-ir-dev (bm25s on these tokens): no list 0.656 nDCG@10, function words only 0.666,
# with question words 0.682 (docs/knowledge.md).
_STOPWORDS = """a an and are as at be but by for from has have he her his i if in into is it
its of on or she that the their there these they this to was were which who will with you
what whom whose when where why how does do did many much"""
STOPWORDS: frozenset[str] = frozenset(_STOPWORDS.split())

_WORD = re.compile(r"\w+", re.UNICODE)
# A name: words joined by single dots or hyphens (``numpy.linalg.norm``, ``top-k``). A dot
# that ends a sentence is not followed by a word character, so it is not taken.
_COMPOUND = re.compile(r"\w+(?:[.\-]\w+)*", re.UNICODE)
_JOINER = re.compile(r"[.\-]")
# camelCase and PascalCase boundaries: before an upper-case letter that follows a lower-case
# letter or a digit (get|Weather, HTTP2|Response), and before the last capital of a run that
# starts a word (HTTP|Server).
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

_OPTIONS = ("stem", "identifiers")


class _Stemmer(threading.local):
    """Snowball's English stemmer, one per thread (a stemmer object keeps its state between
    calls). The pure-Python class is used even where PyStemmer is installed (which
    ``snowballstemmer.stemmer()`` would prefer), so stems never depend on what else is
    installed."""

    def __init__(self) -> None:
        from snowballstemmer import EnglishStemmer

        self.stemmer = EnglishStemmer()


_stemmer = _Stemmer()
# A corpus repeats its words: the cache makes stemming a dict look-up (a miss costs ~20 µs).
_stems: dict[str, str] = {}
_MAX_STEMS = 1 << 18


def _stem(word: str) -> str:
    stem = _stems.get(word)
    if stem is None:
        stem = str(_stemmer.stemmer.stemWord(word))
        if len(_stems) < _MAX_STEMS:
            _stems[word] = stem
    return stem


@dataclass(frozen=True, slots=True)
class Analyzer:
    """How text becomes BM25 terms; both options off is ``PLAIN`` (docs/knowledge.md).

    Args:
        stem: English Snowball stemming of each word (not of whole identifiers).
        identifiers: snake_case, camelCase, dotted and kebab names give their whole and
            their parts.
    """

    stem: bool = False
    identifiers: bool = False

    # -- names and the stored form ---------------------------------------------------

    @property
    def name(self) -> str:
        """``plain``, ``stem``, ``identifiers`` or ``stem+identifiers``."""
        on = [option for option in _OPTIONS if getattr(self, option)]
        return "+".join(on) or "plain"

    @classmethod
    def parse(cls, name: str) -> Analyzer:
        """The analyzer a :attr:`name` stands for (options joined by ``+`` or ``,``)."""
        options = {part.strip() for part in re.split(r"[+,]", name) if part.strip()}
        options.discard("plain")
        unknown = options - set(_OPTIONS)
        if unknown:
            raise ValueError(
                f"unknown analyzer option {sorted(unknown)[0]!r} (options: {', '.join(_OPTIONS)})"
            )
        return cls(**{option: True for option in options})

    @classmethod
    def configured(cls, config: RetrievalConfig) -> Analyzer:
        """The analyzer the settings give new generations (``bm25_stem``,
        ``bm25_identifiers``)."""
        return cls(stem=config.bm25_stem, identifiers=config.bm25_identifiers)

    def to_json(self) -> dict[str, bool]:
        """The stored form (``kb_generations.analyzer``)."""
        return {option: getattr(self, option) for option in _OPTIONS}

    @classmethod
    def from_json(cls, value: Mapping[str, Any] | None) -> Analyzer:
        """The analyzer of a stored form; a missing option is off (``{}``, the column's
        default, is ``PLAIN``). An option this code does not know is an error: the
        generation was written by a newer analyzer, whose terms this one cannot reproduce."""
        value = value or {}
        unknown = set(value) - set(_OPTIONS)
        if unknown:
            raise ValueError(
                f"a generation was written with analyzer option {sorted(unknown)[0]!r}, "
                "which this version does not know"
            )
        return cls(**{option: bool(value.get(option, False)) for option in _OPTIONS})

    # -- text to terms ----------------------------------------------------------------

    def tokenize(self, text: str) -> list[str]:
        """The terms of ``text`` in order (with repeats)."""
        if not self.identifiers:
            words = [
                t
                for t in _WORD.findall(text.lower())
                if t not in STOPWORDS and len(t) <= MAX_TERM_CHARS
            ]
            return [_stem(t) for t in words] if self.stem else words
        return self._identifier_terms(text)

    def _identifier_terms(self, text: str) -> list[str]:
        stem = self.stem
        terms: list[str] = []
        for compound in _COMPOUND.findall(text):
            if compound.isalnum() and (compound.islower() or not _CAMEL.search(compound)):
                # One word of one part (most of prose): what the loop below would give.
                term = compound.lower()
                if term not in STOPWORDS and len(term) <= MAX_TERM_CHARS:
                    terms.append(_stem(term) if stem else term)
                continue
            words = _JOINER.split(compound)
            if len(words) > 1 and len(compound) <= MAX_TERM_CHARS:
                terms.append(compound.lower())
            for word in words:
                parts = [p for piece in word.split("_") if piece for p in _CAMEL.split(piece)]
                if len(parts) > 1 and len(word) <= MAX_TERM_CHARS:
                    terms.append(word.lower())
                for part in parts:
                    term = part.lower()
                    if term not in STOPWORDS and len(term) <= MAX_TERM_CHARS:
                        terms.append(_stem(term) if stem else term)
        return terms

    def term_counts(self, text: str) -> tuple[Counter[str], int]:
        """Term frequencies of a passage and its length in terms (BM25's ``dl``)."""
        terms = self.tokenize(text)
        return Counter(terms), len(terms)

    def query_terms(self, text: str) -> list[str]:
        """The distinct terms of a query, in first-seen order (a repeated term counts once)."""
        return list(dict.fromkeys(self.tokenize(text)))


PLAIN = Analyzer()
"""Both options off: the analyzer of every generation written before migration 0009."""
DEFAULT = Analyzer.configured(RetrievalConfig())
"""The analyzer a new collection gets when neither the caller nor the environment says
otherwise (the settings' defaults, chosen by measurement: docs/knowledge.md)."""

# The functions below are for text meant for a collection written with ``DEFAULT`` (the
# benchmarks, the tests); a search tokenises with the analyzer of the generation it reads.


def tokenize(text: str, analyzer: Analyzer = DEFAULT) -> list[str]:
    """``analyzer.tokenize(text)``: the terms of ``text`` in order (with repeats)."""
    return analyzer.tokenize(text)


def term_counts(text: str, analyzer: Analyzer = DEFAULT) -> tuple[Counter[str], int]:
    """``analyzer.term_counts(text)``: a passage's term frequencies and length in terms."""
    return analyzer.term_counts(text)


def query_terms(text: str, analyzer: Analyzer = DEFAULT) -> list[str]:
    """``analyzer.query_terms(text)``: a query's distinct terms, in first-seen order."""
    return analyzer.query_terms(text)


def idf(n_docs: int, df: int) -> float:
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


def length_norm(length: int, avgdl: float) -> float:
    """``k1 · (1 − b + b · dl / avgdl)``: the part of ``tf_factor`` that depends only on the
    passage, so a writer computes it once per passage instead of once per term."""
    return BM25_K1 * (1.0 - BM25_B + BM25_B * length / max(avgdl, 1e-9))


def tf_factor(tf: int, length: int, avgdl: float) -> float:
    return tf / (tf + length_norm(length, avgdl))
