"""Lance's FTS text analysis (pylance 14, base tokenizer `simple`) in Python, vectorised over Arrow arrays.

Global BM25 needs the term frequencies and document lengths Lance's INVERTED index counted, which pylance
does not expose, so we analyse text the way the index does, in Lance's order (`InvertedIndexParams::build`):
split on every non-alphanumeric character, drop tokens of `max_token_length` bytes or more, lower-case,
Snowball-stem, drop stop words (Snowball's list, checked after stemming), ASCII-fold.
Approximations (documented in docs/search-fts.md): ASCII folding is NFKD minus combining marks plus a few
letters that do not decompose (Lance uses Lucene's full folding table), and "alphanumeric" is Unicode
L/N (Rust's also counts Other_Alphabetic marks).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import snowballstemmer

from memwal.errors import BadInputError

__all__ = ["Analyzed", "TokenizerConfig", "analyze", "query_terms"]

# tantivy's English stop words (StopWordFilter::new(English)): Snowball's list without cannot, could, no, nor, not,
# ought, would, with can, just, now, re, will (checked against Lance in tests/library/test_full_text_search.py).
_ENGLISH_STOP_WORDS = frozenset((
    "i", "me", "my", "myself", "we", "our", "ours", "ourselves", "you", "your", "yours", "yourself",
    "yourselves", "he", "him", "his", "himself", "she", "her", "hers", "herself", "it", "its", "itself", "they",
    "them", "their", "theirs", "themselves", "what", "which", "who", "whom", "this", "that", "these", "those",
    "am", "is", "are", "was", "were", "be", "been", "being", "have", "has", "had", "having", "do", "does",
    "did", "doing", "should", "i'm", "you're", "he's", "she's", "it's", "we're", "they're", "i've", "you've",
    "we've", "they've", "i'd", "you'd", "he'd", "she'd", "we'd", "they'd", "i'll", "you'll", "he'll", "she'll",
    "we'll", "they'll", "isn't", "aren't", "wasn't", "weren't", "hasn't", "haven't", "hadn't", "doesn't",
    "don't", "didn't", "won't", "wouldn't", "shan't", "shouldn't", "can't", "couldn't", "mustn't", "let's",
    "that's", "who's", "what's", "here's", "there's", "when's", "where's", "why's", "how's", "a", "an", "the",
    "and", "but", "if", "or", "because", "as", "until", "while", "of", "at", "by", "for", "with", "about",
    "against", "between", "into", "through", "during", "before", "after", "above", "below", "to", "from", "up",
    "down", "in", "out", "on", "off", "over", "under", "again", "further", "then", "once", "here", "there",
    "when", "where", "why", "how", "all", "any", "both", "each", "few", "more", "most", "other", "some", "such",
    "only", "own", "same", "so", "than", "too", "very", "can", "just", "now", "re", "will",
))
# Letters NFKD does not reduce to ASCII, folded as Lucene's ASCIIFoldingFilter folds them.
_FOLD = str.maketrans({"ß": "ss", "æ": "ae", "Æ": "AE", "ø": "o", "Ø": "O", "œ": "oe", "Œ": "OE", "đ": "d",
                       "Đ": "D", "ł": "l", "Ł": "L", "þ": "th", "Þ": "TH", "ð": "d", "Ð": "D", "\u0131": "i"})
_SPLIT = r"[^\p{L}\p{N}]+"


@dataclass(frozen=True)
class TokenizerConfig:
    """The INVERTED index parameters that decide its terms (describe_indices details)."""

    max_token_length: int | None = 40
    lower_case: bool = True
    stem: bool = True
    remove_stop_words: bool = True
    custom_stop_words: tuple[str, ...] | None = None
    ascii_folding: bool = True
    language: str = "English"

    @classmethod
    def from_index_details(cls, details: Mapping[str, Any] | None, *, index: str = "?") -> TokenizerConfig:
        """The config of an INVERTED index from its describe_indices details (defaults where absent)."""
        d = dict(details or {})
        base = d.get("base_tokenizer") or "simple"
        if base != "simple":
            raise BadInputError(f"FTS index {index}: base_tokenizer {base!r} is not supported here (only 'simple')")
        language = d.get("language") or "English"
        if language != "English" and (d.get("stem", True) or d.get("remove_stop_words", True)):
            raise BadInputError(f"FTS index {index}: language {language!r} is not supported here (only English)")
        stops = d.get("custom_stop_words")
        return cls(
            max_token_length=d.get("max_token_length", 40),
            lower_case=bool(d.get("lower_case", True)),
            stem=bool(d.get("stem", True)),
            remove_stop_words=bool(d.get("remove_stop_words", True)),
            custom_stop_words=tuple(stops) if stops is not None else None,
            ascii_folding=bool(d.get("ascii_folding", True)),
            language=language,
        )


@dataclass(frozen=True)
class Analyzed:
    """The terms of n documents: term occurrence i belongs to document doc[i] and is vocab[term[i]]."""

    n: int
    doc: np.ndarray
    term: np.ndarray
    vocab: list[str]

    def lengths(self) -> np.ndarray:
        """Terms per document (BM25's document length)."""
        return np.bincount(self.doc, minlength=self.n).astype(np.int64)

    def frequencies(self, terms: list[str]) -> np.ndarray:
        """A (len(terms), n) array: how often each term occurs in each document."""
        index = {t: i for i, t in enumerate(self.vocab)}
        out = np.zeros((len(terms), self.n), np.int64)
        for row, t in enumerate(terms):
            tid = index.get(t)
            if tid is not None:
                out[row] = np.bincount(self.doc[self.term == tid], minlength=self.n)
        return out


@lru_cache(maxsize=8)
def _stemmer(language: str) -> Any:
    return snowballstemmer.stemmer(language.lower())


def _fold(token: str) -> str:
    if token.isascii():
        return token
    decomposed = unicodedata.normalize("NFKD", token.translate(_FOLD))
    return "".join(c for c in decomposed if not unicodedata.combining(c))


@lru_cache(maxsize=1 << 18)
def _term(raw: str, config: TokenizerConfig) -> str | None:
    """The index term of one base token, or None when a filter drops it."""
    if config.max_token_length is not None and len(raw.encode()) >= config.max_token_length:
        return None
    token = raw.lower() if config.lower_case else raw
    if config.stem:
        token = _stemmer(config.language).stemWord(token)
    if config.remove_stop_words:
        stops = _ENGLISH_STOP_WORDS if config.custom_stop_words is None else frozenset(config.custom_stop_words)
        if token in stops:
            return None
    return _fold(token) if config.ascii_folding else token


def analyze(texts: pa.Array | pa.ChunkedArray, config: TokenizerConfig) -> Analyzed:
    """The terms of each text (a null text has none)."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    n = len(texts)
    lists = pc.split_pattern_regex(texts.cast(pa.large_string()), _SPLIT)
    raw = pc.list_flatten(lists)
    doc = pc.list_parent_indices(lists).to_numpy().astype(np.int64)
    encoded = pc.dictionary_encode(raw).combine_chunks() if isinstance(raw, pa.ChunkedArray) \
        else pc.dictionary_encode(raw)
    vocab: list[str] = []
    ids: dict[str, int] = {}
    mapping = np.full(len(encoded.dictionary), -1, np.int64)
    for i, token in enumerate(encoded.dictionary.to_pylist()):
        term = _term(token, config) if token else None
        if term is not None:
            mapping[i] = ids.setdefault(term, len(ids))
            if mapping[i] == len(vocab):
                vocab.append(term)
    term = mapping[encoded.indices.to_numpy(zero_copy_only=False)] if len(encoded) else np.zeros(0, np.int64)
    keep = term >= 0
    return Analyzed(n, doc[keep], term[keep], vocab)


def query_terms(query: str, config: TokenizerConfig) -> list[str]:
    """The query's terms in order, repeats kept (Lance sums a repeated query term once per occurrence)."""
    a = analyze(pa.array([query], pa.string()), config)
    return [a.vocab[t] for t in a.term]
