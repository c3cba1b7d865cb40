"""Test helper: a pure-Python model of full-text search over the LSM view (Lance's analysis, one global BM25).

Written apart from memwal.fts_tokenizer (per text, with `re`), so the two can disagree. Shared with it: the
Snowball stemmer and stop-word list, which the plain-base test checks against Lance's own FTS.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections import Counter

import snowballstemmer

from memwal.fts_tokenizer import _ENGLISH_STOP_WORDS

_STEM = snowballstemmer.stemmer("english")
_WORD = re.compile(r"[^\W_]+")


def terms_of(text: str | None) -> list[str]:
    """Lance 14's default analysis: split on non-alphanumerics, drop >= 40-byte tokens, lower-case, stem,
    drop stop words (after stemming), fold to ASCII."""
    return list(_terms(text or ""))


@functools.lru_cache(maxsize=1 << 16)
def _terms(text: str) -> tuple[str, ...]:
    """terms_of, remembered per text: the model test scores the same texts for every query of every step."""
    out = []
    for raw in _WORD.findall(text):
        if len(raw.encode()) >= 40:
            continue
        term = _STEM.stemWord(raw.lower())
        if term in _ENGLISH_STOP_WORDS:
            continue
        term = "".join(c for c in unicodedata.normalize("NFKD", term) if not unicodedata.combining(c))
        out.append(term)
    return tuple(out)


@functools.lru_cache(maxsize=1 << 16)
def _counts(text: str) -> Counter:
    return Counter(_terms(text))


def global_bm25(texts: dict, query: str) -> dict:
    """key -> score of every live row (key -> text) holding a query term, with the statistics of all rows."""
    docs = {key: _counts(t or "") for key, t in texts.items()}  # shared Counters: read only
    lengths = {key: sum(c.values()) for key, c in docs.items()}
    n = sum(1 for v in lengths.values() if v)
    if n == 0:
        return {}
    avg = sum(lengths.values()) / n
    scores: dict = {}
    for term in terms_of(query):
        df = sum(1 for c in docs.values() if term in c)
        if not df:
            continue
        idf = math.log((n - df + 0.5) / (df + 0.5) + 1.0)
        for key, c in docs.items():
            tf = c.get(term, 0)
            if tf:
                norm = 1.2 * (1 - 0.75 + 0.75 * lengths[key] / avg)
                scores[key] = scores.get(key, 0.0) + idf * 2.2 * tf / (tf + norm)
    return scores


def top_k(scores: dict, k: int) -> list[float]:
    """The k best scores, best first."""
    return sorted(scores.values(), reverse=True)[:k]


def assert_ranking(result_keys: list, result_scores: list[float], model: dict, k: int, what: str) -> None:
    """Our result equals the model's top k: the same scores in order, each key scored as the model scores it
    (keys tied at the cut may differ), and no key twice."""
    assert len(set(result_keys)) == len(result_keys), f"{what}: a key came back twice: {result_keys}"
    want = top_k(model, k)
    assert len(result_scores) == len(want), \
        f"{what}: {len(result_scores)} results, the model's global BM25 has {len(want)} (never short)"
    for key, score in zip(result_keys, result_scores, strict=True):
        assert key in model, f"{what}: key {key} returned but its newest live version does not match"
        assert math.isclose(score, model[key], rel_tol=1e-5), \
            f"{what}: key {key} scored {score}, global BM25 over the LSM view gives {model[key]}"
    for got, exp in zip(result_scores, want, strict=True):
        assert math.isclose(got, exp, rel_tol=1e-5), \
            f"{what}: scores {result_scores} are not the model's top {k} {want}"
