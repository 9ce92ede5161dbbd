"""The lexical model: one tokeniser for ingest, queries and the reference, and BM25's formula.

The tokeniser lower-cases, splits on Unicode word characters (``\\w+``), drops a short
English stopword list (function and question words) and terms longer than 64 characters,
and does not stem (no stemmer ships with the base install; see docs/knowledge.md for the
measurement). The same function runs when passages are written (their postings are computed
in Python and copied into PostgreSQL) and when a query arrives, so the two never disagree.

BM25 is the Lucene variant (as in Kamphuis et al., ECIR 2020, and ``bm25s``'s default):
``idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))`` and
``tf-factor = tf / (tf + k1 · (1 - b + b · dl / avgdl))``. ``k1`` and ``b`` are constants of
the stored index: the per-posting impacts are computed with them at write time.
"""

from __future__ import annotations

import math
import re
from collections import Counter

__all__ = [
    "BM25_B",
    "BM25_K1",
    "STOPWORDS",
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
# with question words 0.682; Snowball stemming on top added 0.005 (docs/knowledge.md).
_STOPWORDS = """a an and are as at be but by for from has have he her his i if in into is it
its of on or she that the their there these they this to was were which who will with you
what whom whose when where why how does do did many much"""
STOPWORDS: frozenset[str] = frozenset(_STOPWORDS.split())

_WORD = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """The terms of ``text`` in order (with repeats)."""
    return [
        t for t in _WORD.findall(text.lower()) if t not in STOPWORDS and len(t) <= MAX_TERM_CHARS
    ]


def term_counts(text: str) -> tuple[Counter[str], int]:
    """Term frequencies of a passage and its length in terms (BM25's ``dl``)."""
    terms = tokenize(text)
    return Counter(terms), len(terms)


def query_terms(text: str) -> list[str]:
    """The distinct terms of a query, in first-seen order (a repeated term counts once)."""
    return list(dict.fromkeys(tokenize(text)))


def idf(n_docs: int, df: int) -> float:
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


def length_norm(length: int, avgdl: float) -> float:
    """``k1 · (1 − b + b · dl / avgdl)``: the part of ``tf_factor`` that depends only on the
    passage, so a writer computes it once per passage instead of once per term."""
    return BM25_K1 * (1.0 - BM25_B + BM25_B * length / max(avgdl, 1e-9))


def tf_factor(tf: int, length: int, avgdl: float) -> float:
    return tf / (tf + length_norm(length, avgdl))
