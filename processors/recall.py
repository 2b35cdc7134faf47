"""The pure half of hybrid recall: terms, sparse vectors, fusion and the final score.

Recall asks the vector store for two candidate lists, one by embedding cosine
(dense) and one by BM25 term weights (sparse), fuses them by reciprocal rank
fusion (:func:`rrf`), then re-weights each candidate by what the memory dynamics
say about it at query time (:func:`score`, :func:`rank`): how well it is still
retained, how recent and how important it is.

Contract:

* pure and deterministic: no I/O, no clock (``now`` is an argument), no
  randomness; term indices come from BLAKE2b, never from the salted ``hash()``,
  so every process agrees on them;
* the tokenizer is part of the index: changing it (its stopwords, its stemmer,
  its ranges) changes the sparse vectors already stored, so such a change needs
  a reindex and a new :data:`TOKENIZER`. Its Unicode tables are Python's
  (``unicodedata``; 14.0.0 on 3.11);
* every score and every part of it is finite and in ``[0, 1]``.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
import unicodedata
from array import array
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Annotated, Self, get_args

from pydantic import Field, model_validator

from processors.build import fields, trusted
from processors.forgetting import ForgettingParams, retention_of
from schemas.base import Model
from schemas.derived import Layer

# --- tokens -------------------------------------------------------------------

CJK = (
    "\u3005\u3007"  # 々 〇
    "\u3040-\u30ff"  # hiragana, katakana
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\u1100-\u11ff\u3130-\u318f"  # hangul jamo, compatibility jamo
    "\uac00-\ud7af"  # hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\U00020000-\U0003134f"  # CJK extensions B-H
)
"""Characters (inside a regex class) that are indexed as character bigrams."""

ENGLISH_STOPWORDS = frozenset((
    "a", "about", "after", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be",
    "been", "before", "being", "between", "both", "but", "by", "can", "could", "did", "do",
    "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has",
    "have", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his", "how",
    "i", "if", "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my",
    "myself", "no", "nor", "not", "now", "of", "off", "on", "once", "only", "or", "other",
    "our", "ours", "ourselves", "out", "over", "own", "same", "she", "should", "so", "some",
    "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there",
    "these", "they", "this", "those", "through", "to", "too", "under", "until", "up", "very",
    "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "why",
    "will", "with", "would", "you", "your", "yours", "yourself", "yourselves", "dont", "doesnt",
    "didnt", "isnt", "arent", "wasnt", "werent", "hasnt", "havent", "hadnt", "cant", "couldnt",
    "wont", "wouldnt", "shouldnt", "mustnt",
))  # fmt: skip
"""Dropped English words, compared after normalisation and apostrophe handling,
before stemming (``"don't"`` is compared as ``"dont"``)."""

CJK_STOPWORDS = frozenset((
    "的", "地", "得", "了", "着", "过", "是", "在", "和", "与", "及", "或", "也", "就", "都",
    "而", "又", "吗", "呢", "吧", "啊", "呀", "嘛", "哦", "么", "之", "其", "这", "那", "我",
    "你", "您", "他", "她", "它", "们", "个", "把", "被", "给", "从", "对", "向", "为", "以",
    "于", "不", "没", "有", "の", "は", "が", "を", "に", "へ", "と", "も", "で", "や", "か",
    "ね", "よ",
))  # fmt: skip
"""Chinese particles, pronouns and function characters (and a few Japanese
particles), dropped when they would be a unigram; bigrams keep them."""

_CLITICS = ("s", "ll", "re", "ve", "m", "d")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\uff07": "'"})
_CURLY = re.compile("[\u2019\u2018\u02bc\uff07]")  # what _APOSTROPHES replaces
_VOWELS = frozenset("aeiouy")
_UNDOUBLED = frozenset("bcdfghjkmnpqrtvwx")  # l, s, z stay doubled: fall, miss, buzz
_ASCII_WORD = re.compile(r"[a-z]+")
_CJK_RUN = re.compile(f"[{CJK}]+")


def tokenize(text: str, *, cjk_unigrams: bool = False) -> list[str]:
    """The index terms of ``text`` in reading order, repeats kept (they are the tf).

    - Normalisation: NFKC and case folding (NFKC again after folding), curly and
      full-width apostrophes made straight: ``"Ｈｅｌｌｏ"`` is ``"hello"``.
    - Words: maximal runs of letters, digits and combining marks (so Devanagari
      or Arabic words stay whole) outside the CJK ranges; punctuation, symbols,
      whitespace and ``_`` separate them. Digits joined by ``.`` or ``,`` stay
      one token (``"3.5"``, ``"1,000"``); other punctuation splits (``"14:30"``
      is ``"14"``, ``"30"``).
    - Apostrophes: only between word characters. An English clitic after the
      last one is dropped (``'s 'll 're 've 'm 'd``: ``"alice's"`` is ``"alice"``
      before stemming),
      any other apostrophe is removed (``"don't"`` is ``"dont"``, ``"o'neill"``
      is ``"oneill"``).
    - Stopwords: a word in :data:`ENGLISH_STOPWORDS` is dropped.
    - Stemming: a word of ASCII letters only is stemmed by :func:`stem`, a
      light, dictionary-free suffix stripper (plural ``-s``, ``-ing``, ``-ed``).
    - CJK (Han, kana, hangul): a run of two or more characters gives its
      overlapping bigrams (``"上海天气"`` is ``"上海", "海天", "天气"``); a run of
      one character gives that character unless it is in :data:`CJK_STOPWORDS`.
      With ``cjk_unigrams`` (the document side of :func:`document_sparse`)
      each non-stopword character of a longer run is also given, before the
      bigram it starts, so a one-character query term can match it.

    Mixed text is tokenised piece by piece in order. Empty, whitespace-only or
    punctuation-only text gives ``[]``.
    """
    return [term for term, _ in _terms(text, cjk_unigrams=cjk_unigrams)]


def stem(word: str) -> str:
    """A light English stemmer for a lower-case ASCII word; other words unchanged.

    In order, each step keeping at least three characters of the word:

    1. plural: a final ``s`` is removed unless the word ends in ``ss``, ``us``
       or ``is`` (``"cats"`` -> ``"cat"``, ``"class"``, ``"status"`` stay);
    2. ``-ing`` / ``-ed`` are removed when what is left has a vowel, and a
       doubled final consonant other than ``l s z`` is undoubled
       (``"running"`` -> ``"run"``, ``"stopped"`` -> ``"stop"``, ``"falling"`` ->
       ``"fall"``);
    3. a final ``y`` after a consonant becomes ``i`` (``"study"``, ``"studies"``,
       ``"studied"`` all give ``"studi"``);
    4. a final ``e`` is removed (``"make"`` and ``"making"`` both give ``"mak"``,
       ``"boxes"`` and ``"box"`` both ``"box"``).

    Stems need not be words; they only have to agree between documents and
    queries. Irregular forms (``"ran"``, ``"mice"``) are not conflated.
    """
    if not _ASCII_WORD.fullmatch(word):
        return word
    if len(word) > 3 and word[-1] == "s" and word[-2] not in "sui":
        word = word[:-1]
    for suffix in ("ing", "ed"):
        base = word[: -len(suffix)]
        if word.endswith(suffix) and len(base) >= 3 and _VOWELS & set(base):
            doubled = len(base) > 3 and base[-1] == base[-2] and base[-1] in _UNDOUBLED
            word = base[:-1] if doubled else base
            break
    if len(word) >= 3 and word[-1] == "y" and word[-2] not in _VOWELS:
        word = word[:-1] + "i"
    if len(word) > 3 and word[-1] == "e":
        word = word[:-1]
    return word


def normalise(text: str) -> str:
    """NFKC, case-folded (then NFKC again), with straight apostrophes."""
    if text.isascii():
        return text.lower()
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return _straight(folded) if _CURLY.search(folded) else folded


def _straight(text: str) -> str:
    """``text.translate(_APOSTROPHES)``, by ``str.replace``: many times faster than a
    ``translate`` by a dict on text that is not ASCII."""
    for curly, straight in _APOSTROPHES.items():
        text = text.replace(chr(curly), str(straight))
    return text


def _terms(text: str, *, cjk_unigrams: bool) -> Iterator[tuple[str, bool]]:
    """``(term, extra)`` in reading order; ``extra`` marks the optional CJK unigrams,
    which do not count in a document's length."""
    for cjk, number, word in _tokens(normalise(text)):
        if cjk:
            yield from _cjk_terms(cjk, unigrams=cjk_unigrams)
        elif number:
            yield number, False
        else:
            term = _word_term(word)
            if term is not None:
                yield term, False


def _document_terms(text: str) -> tuple[list[str], int]:
    """The terms of ``_terms(text, cjk_unigrams=True)`` in no particular order (the
    same multiset), and how many of them are not extra: the document's length."""
    terms: list[str] = []
    extra = 0
    for cjk, number, word in _tokens(normalise(text)):
        if cjk:
            run, unigrams = _cjk_document_terms(cjk)
            terms += run
            extra += unigrams
        elif number:
            terms.append(number)
        else:
            term = _word_term(word)
            if term is not None:
                terms.append(term)
    return terms, len(terms) - extra


def _cjk_terms(run: str, *, unigrams: bool) -> Iterator[tuple[str, bool]]:
    if len(run) == 1:
        if run not in CJK_STOPWORDS:
            yield run, False
        return
    for i in range(len(run) - 1):
        if unigrams and run[i] not in CJK_STOPWORDS:
            yield run[i], True
        yield run[i : i + 2], False
    if unigrams and run[-1] not in CJK_STOPWORDS:
        yield run[-1], True


@lru_cache(maxsize=1 << 14)
def _cjk_document_terms(run: str) -> tuple[tuple[str, ...], int]:
    """The terms of ``_cjk_terms(run, unigrams=True)`` (bigrams, then unigrams) and
    how many are extra unigrams (remembered for the most recent runs)."""
    if len(run) == 1:
        return ((), 0) if run in CJK_STOPWORDS else ((run,), 0)
    unigrams = tuple(char for char in run if char not in CJK_STOPWORDS)
    bigrams = tuple(run[i : i + 2] for i in range(len(run) - 1))
    return bigrams + unigrams, len(unigrams)


@lru_cache(maxsize=1 << 16)
def _word_term(word: str) -> str | None:
    """The term a matched word gives: its clitic and apostrophes removed, then
    stemmed; None for a stopword (remembered for the most recent words)."""
    word = _unclitic(word)
    return None if word in ENGLISH_STOPWORDS else stem(word)


def _unclitic(word: str) -> str:
    if "'" not in word:
        return word
    head, _, tail = word.rpartition("'")
    if tail in _CLITICS:
        word = head
    return word.replace("'", "")


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def _tokens(folded: str) -> list[tuple[str, str, str]]:
    """``(cjk, number, word)`` per token of normalised text, two of them empty: CJK
    runs, dotted numbers and words (see :func:`tokenize`)."""
    astral, basic = _token_patterns()
    pattern = astral if _ASTRAL.search(folded) else basic
    return pattern.findall(folded)


@lru_cache(maxsize=1)
def _token_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The token regex for any text, and the same for text without a character past
    U+FFFF, which is several times faster: the regex engine looks a character up in
    a table when it is in the Basic Multilingual Plane, and in a list of ranges
    when it is past it. Built on first use (it lists every word character).

    A word character is one class (what ``\\w`` matches but ``_``, and the
    combining marks, which ``\\w`` does not match, so that words keep them; all
    outside :data:`CJK`), so the engine takes a word a character at a time, without
    an alternation."""
    ranges = _word_ranges()
    basic = [(start, min(stop, 0xFFFF)) for start, stop in ranges if start <= 0xFFFF]
    return _token_pattern_of(ranges), _token_pattern_of(basic)


def _token_pattern_of(ranges: Sequence[tuple[int, int]]) -> re.Pattern[str]:
    char = "[" + "".join(_class_range(start, stop) for start, stop in ranges) + "]"
    return re.compile(rf"([{CJK}]+)|(\d+(?:[.,]\d+)+)|({char}+(?:'{char}+)*)")


def _class_range(start: int, stop: int) -> str:
    first = re.escape(chr(start))
    return first if start == stop else f"{first}-{re.escape(chr(stop))}"


def _word_ranges() -> list[tuple[int, int]]:
    """The word characters as ascending, disjoint ``(first, last)`` code point ranges."""
    every = array("I", range(0xD800))
    every.extend(range(0xE000, sys.maxunicode + 1))  # surrogates are no characters
    text = every.tobytes().decode("utf-32-le" if sys.byteorder == "little" else "utf-32-be")
    words = "".join(re.findall(rf"[^\W_{CJK}]+", text))
    codes = sorted({ord(char) for char in words} | set(_mark_code_points()))
    ranges: list[tuple[int, int]] = []
    for code in codes:
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1] = (ranges[-1][0], code)
        else:
            ranges.append((code, code))
    return ranges


def _mark_code_points() -> Iterator[int]:
    """Combining marks (categories Mn, Mc, Me) outside the CJK ranges."""
    for start, stop in ((0, 0x20000), (0xE0000, 0xE1000)):
        for code in range(start, stop):
            char = chr(code)
            if unicodedata.category(char)[0] == "M" and not _CJK_RUN.fullmatch(char):
                yield code


# --- sparse vectors -------------------------------------------------------------

TOKENIZER = f"engram-bm25-1/unicode-{unicodedata.unidata_version}"
"""Names what :func:`document_sparse` computes with its default parameters: the
tokenizer, the weighting and Python's Unicode tables. Weights recorded under another
name (``memory.embedded``'s ``terms``) are computed again, not trusted; bump the
number with any change that changes a document's weights."""

SparseVector = tuple[list[int], list[float]]
"""``(indices, values)``, indices strictly ascending: Qdrant's ``SparseVector``."""

TERM_INDEX_BITS = 31


@lru_cache(maxsize=1 << 16)
def term_index(term: str) -> int:
    """The sparse index of ``term``: the first 4 bytes of BLAKE2b of its UTF-8,
    big-endian, top bit cleared; in ``[0, 2**31)`` and the same in every process
    (remembered for the most recent terms: a vocabulary repeats)."""
    digest = hashlib.blake2b(term.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "big") & ((1 << TERM_INDEX_BITS) - 1)


def document_sparse(
    text: str, *, k1: float = 1.2, b: float = 0.75, avg_len: float = 32.0
) -> SparseVector:
    """The document side of BM25: per distinct term, ``tf·(k1+1) / (tf + k1·(1−b+b·len/avg_len))``.

    ``len`` is the number of terms of :func:`tokenize` (the extra CJK unigrams of
    ``cjk_unigrams=True`` are indexed but not counted, as overlapping tokens are
    not in Lucene's length norm). The store applies IDF at query time (Qdrant's
    ``Modifier.IDF``). Terms whose indices collide are summed, in term order.
    Empty text (or text of stopwords only) gives ``([], [])``.
    """
    if k1 < 0 or not 0 <= b <= 1 or avg_len <= 0:
        raise ValueError(f"BM25 needs k1 >= 0, 0 <= b <= 1, avg_len > 0; got {k1}, {b}, {avg_len}")
    terms, length = _document_terms(text)
    norm = k1 * (1.0 - b + b * length / avg_len)
    tf = Counter(terms)
    weight = {n: n * (k1 + 1.0) / (n + norm) for n in set(tf.values())}  # few distinct tf
    return _vector({term: weight[n] for term, n in tf.items()})


def query_sparse(text: str) -> SparseVector:
    """The query side: weight 1.0 per distinct term of :func:`tokenize` (collisions summed)."""
    return _vector(dict.fromkeys(tokenize(text), 1.0))


def _vector(weights: Mapping[str, float]) -> SparseVector:
    """Weights by term to ``(indices, values)``; colliding terms summed in term order
    (each value is ``0.0 + w…``, so a lone term's value is ``0.0 + w`` too)."""
    merged = {term_index(term): 0.0 + weight for term, weight in weights.items()}
    if len(merged) < len(weights):
        return _colliding_vector(weights)
    indices = sorted(merged)
    return indices, [merged[i] for i in indices]


def _colliding_vector(weights: Mapping[str, float]) -> SparseVector:
    merged: dict[int, float] = {}
    for term in sorted(weights):
        index = term_index(term)
        merged[index] = merged.get(index, 0.0) + weights[term]
    indices = sorted(merged)
    return indices, [merged[i] for i in indices]


# --- fusion ---------------------------------------------------------------------


def rrf(rankings: Sequence[Sequence[str]], k: int = 60) -> dict[str, float]:
    """Reciprocal rank fusion: ``Σ 1 / (k + rank)`` over the rankings an id is in.

    Ranks start at 1. Repeats within one ranking are dropped first (an id counts
    at its best rank, later ids move up). Keys are in first-seen order.
    """
    if k < 0:
        raise ValueError(f"rrf needs k >= 0, got {k}")
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, memory_id in enumerate(dict.fromkeys(ranking), start=1):
            fused[memory_id] = fused.get(memory_id, 0.0) + 1.0 / (k + rank)
    return fused


def max_rrf(rankings: int, k: int = 60) -> float:
    """The largest :func:`rrf` score over ``rankings`` lists: first in every one."""
    return rankings / (k + 1)


# --- scoring --------------------------------------------------------------------

Weight = Annotated[float, Field(ge=0, le=1000)]


class RecallWeights(Model):
    """How recall weighs the parts of a candidate's score; part of the recall config.

    The score is the weighted mean of four parts, each in ``[0, 1]``, so it is
    in ``[0, 1]`` too and a weight of 0 removes its part:

    * ``relevance`` (1.0): the candidate's :func:`rrf` score over
      ``rankings`` lists (2: dense and sparse) fused with ``rrf_k`` (5), divided
      by the largest possible one (:func:`max_rrf`), capped at 1. A small ``k``
      keeps the ranks apart: with the customary 60, first and fifth place differ
      by 6 % of relevance and the other parts decide the order instead;
    * ``retention`` (0.3): the forgetting curve's R at query time
      (:func:`candidate_retention`); 1.0 for L3 or promoted memories;
    * ``recency`` (0.1): ``0.5 ** (age / recency_half_life_days)`` (7 days), the
      age counted from the memory's creation (retention already counts from
      the last reinforcement); 1.0 for a memory created at or after ``now``;
    * ``importance`` (0.1): ``(importance − 1) / 9``.

    Each weight is in ``[0, 1000]`` and at least one is positive.
    """

    relevance: Weight = 1.0
    retention: Weight = 0.3
    recency: Weight = 0.1
    importance: Weight = 0.1
    recency_half_life_days: Annotated[float, Field(gt=0, le=36_500)] = 7.0
    rrf_k: Annotated[int, Field(ge=0, le=1_000_000)] = 5
    rankings: Annotated[int, Field(ge=1, le=1000)] = 2

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.total == 0:
            raise ValueError("at least one recall weight must be positive")
        return self

    @property
    def total(self) -> float:
        return self.relevance + self.retention + self.recency + self.importance


_LAYERS = frozenset(get_args(Layer))


@dataclass(frozen=True)
class Candidate:
    """A memory the vector store returned, with what scoring needs of its payload.

    ``rrf`` is its fused score (:func:`rrf` with ``RecallWeights.rrf_k``);
    ``strength`` the trace's ``strength_days`` (S, or the FSRS card's stability);
    ``last_reinforced_at`` the time the curve's clock last restarted: the
    creation or latest reinforcement, and under the ``fsrs`` curve also a
    weakening (a lapse is a review of the card). Datetimes must be aware.
    """

    id: str
    rrf: float
    importance: float
    strength: float
    reinforcements: int
    last_reinforced_at: datetime
    created_at: datetime
    layer: Layer
    promoted: bool = False

    def __post_init__(self) -> None:
        if (
            self.id
            and 0 <= self.rrf < math.inf
            and 1 <= self.importance <= 10
            and 0 < self.strength < math.inf
            and self.reinforcements >= 0
            and self.layer in _LAYERS
            and _aware(self.last_reinforced_at)
            and _aware(self.created_at)
        ):
            return  # the common case: valid, and no message is built
        problems = [
            ("id must be a non-empty string", not self.id),
            ("rrf must be finite and >= 0", not (math.isfinite(self.rrf) and self.rrf >= 0)),
            ("importance must be in 1..10", not 1 <= self.importance <= 10),
            ("strength must be finite and > 0", not 0 < self.strength < math.inf),
            ("reinforcements must be >= 0", self.reinforcements < 0),
            ("last_reinforced_at must be aware", not _aware(self.last_reinforced_at)),
            ("created_at must be aware", not _aware(self.created_at)),
            (f"layer must be one of {sorted(_LAYERS)}", self.layer not in _LAYERS),
        ]
        found = [text for text, bad in problems if bad]
        if found:
            raise ValueError(f"candidate {self.id!r}: " + "; ".join(found))

    @property
    def protected(self) -> bool:
        """Never forgotten (L3 or promoted): its retention is 1."""
        return self.layer == "L3" or self.promoted


class ScoredMemory(Model):
    """A ranked memory: its score and the parts it is made of, each in ``[0, 1]``."""

    id: str
    score: Annotated[float, Field(ge=0, le=1)]
    relevance: Annotated[float, Field(ge=0, le=1)]
    retention: Annotated[float, Field(ge=0, le=1)]
    recency: Annotated[float, Field(ge=0, le=1)]
    importance: Annotated[float, Field(ge=0, le=1)]
    rrf: Annotated[float, Field(ge=0)]


def candidate_retention(
    strength: float, last_reinforced_at: datetime, now: datetime, forgetting: ForgettingParams
) -> float:
    """R at ``now`` of a memory with strength ``S`` reinforced at ``last_reinforced_at``.

    Exactly :func:`processors.forgetting.retention` of the memory's trace (for
    ``fsrs``, a card whose stability is ``strength`` and whose last review is
    ``last_reinforced_at``: retrievability reads nothing else), computed by
    :func:`processors.forgetting.retention_of` without building the trace.
    """
    return retention_of(strength, last_reinforced_at, now, forgetting)


def score(
    candidate: Candidate, *, now: datetime, weights: RecallWeights, forgetting: ForgettingParams
) -> ScoredMemory:
    """The candidate's final score at ``now`` and its parts (see :class:`RecallWeights`)."""
    if not _aware(now):
        raise ValueError(f"recall needs an aware datetime, got {now!r}")
    return _scored(candidate, _parts(candidate, now, _Scale.of(weights), forgetting))


@dataclass(frozen=True, slots=True)
class _Scale:
    """What scoring reads of the weights, read once for a whole ranking (a pydantic
    attribute read costs several plain ones, and every candidate needs eight)."""

    top_rrf: float
    relevance: float
    retention: float
    recency: float
    importance: float
    half_life_days: float
    total: float

    @classmethod
    def of(cls, weights: RecallWeights) -> _Scale:
        return cls(
            top_rrf=max_rrf(weights.rankings, weights.rrf_k),
            relevance=weights.relevance,
            retention=weights.retention,
            recency=weights.recency,
            importance=weights.importance,
            half_life_days=weights.recency_half_life_days,
            total=weights.total,
        )


Parts = tuple[float, float, float, float, float]
"""``(score, relevance, retention, recency, importance)`` of a candidate."""


def _parts(
    candidate: Candidate, now: datetime, scale: _Scale, forgetting: ForgettingParams
) -> Parts:
    """The score of ``candidate`` at ``now`` (aware) and its parts, as :func:`score`
    documents them; plain floats, no model built."""
    relevance = min(candidate.rrf / scale.top_rrf, 1.0)
    kept = (
        1.0
        if candidate.protected
        else candidate_retention(candidate.strength, candidate.last_reinforced_at, now, forgetting)
    )
    age_days = max((now - candidate.created_at).total_seconds(), 0.0) / 86_400.0
    recency = 0.5 ** (age_days / scale.half_life_days)
    importance = (candidate.importance - 1.0) / 9.0
    total = (
        scale.relevance * relevance
        + scale.retention * kept
        + scale.recency * recency
        + scale.importance * importance
    )
    return min(total / scale.total, 1.0), relevance, kept, recency, importance


def _scored(candidate: Candidate, parts: Parts) -> ScoredMemory:
    """The :class:`ScoredMemory` of a candidate with its :func:`_parts`."""
    total, relevance, kept, recency, importance = parts
    values = {
        "id": candidate.id,
        "score": total,
        "relevance": relevance,
        "retention": kept,
        "recency": recency,
        "importance": importance,
        "rrf": candidate.rrf,
    }
    return trusted(ScoredMemory, values, _SCORED_GIVEN)  # each part is in [0, 1] by its making


_SCORED_GIVEN = fields(ScoredMemory.model_fields)


def rank(
    candidates: Sequence[Candidate],
    *,
    now: datetime,
    weights: RecallWeights,
    forgetting: ForgettingParams,
    k: int,
) -> list[ScoredMemory]:
    """The top ``k`` candidates by score, descending, ties by id ascending: the
    :func:`score` of each, built for the ``k`` kept only.

    The order of ``candidates`` does not matter; two candidates with the same id
    are a ``ValueError``, and so is a naive ``now`` when there are candidates.
    """
    if k < 0:
        raise ValueError(f"rank needs k >= 0, got {k}")
    ids = [c.id for c in candidates]
    if len(set(ids)) != len(ids):
        raise ValueError("candidates must have distinct ids")
    if candidates and not _aware(now):
        raise ValueError(f"recall needs an aware datetime, got {now!r}")
    scale = _Scale.of(weights)
    scored = [(_parts(c, now, scale, forgetting), c) for c in candidates]
    scored.sort(key=lambda pair: (-pair[0][0], pair[1].id))
    return [_scored(c, parts) for parts, c in scored[:k]]


def _aware(moment: datetime) -> bool:
    return moment.tzinfo is not None and moment.utcoffset() is not None


__all__ = [
    "CJK",
    "CJK_STOPWORDS",
    "ENGLISH_STOPWORDS",
    "Candidate",
    "RecallWeights",
    "ScoredMemory",
    "SparseVector",
    "candidate_retention",
    "document_sparse",
    "max_rrf",
    "normalise",
    "query_sparse",
    "rank",
    "rrf",
    "score",
    "stem",
    "term_index",
    "tokenize",
]
