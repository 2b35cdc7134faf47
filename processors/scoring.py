"""Deterministic default scorer of turns and episodes, for English and Chinese.

Everything here is a pure function of its inputs and of :class:`ScoringParams`:
no model, no segmenter, no clock, so a replay scores every turn exactly as the
first run did. The lexicons are small and transparent on purpose; an agent that
knows better supplies ``importance`` / ``sentiment`` / ``confidence`` in the
event, and :func:`score_turn` lets those values win.

Text is compared after :func:`normalise`: NFKC (full-width Latin, digits and
punctuation become ASCII), case folding, curly apostrophes made straight and
whitespace runs collapsed. Lexicon keys are normalised the same way.
"""

from __future__ import annotations

import heapq
import math
import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce
from itertools import chain
from operator import add
from typing import Final, NamedTuple

from processors.memo import Memo
from processors.sentences import remembered_sentences_and_gaps
from processors.state import ScoringParams

CJK = (
    "\u3005\u3007"  # 々 〇
    "\u3040-\u30ff"  # hiragana, katakana
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\U00020000-\U0003134f"  # CJK extensions B-H
)
"""Character ranges (inside a regex class) tokenised as unigrams + bigrams."""

_TOKEN = re.compile(
    rf"(?P<cjk>[{CJK}]+)"
    r"|(?P<num>\d+(?:[.,:/-]\d+)+)"
    rf"|(?P<word>[^\W_{CJK}]+(?:'[^\W_{CJK}]+)*)"
)
_CJK_CHAR = re.compile(f"[{CJK}]")
_WORD = re.compile(rf"[^\W_{CJK}]+(?:'[^\W_{CJK}]+)*")
_CURLY_APOSTROPHES = ("\u2019", "\u2018", "\u02bc")
"""Apostrophes that :func:`normalise` makes straight."""
_WIDE_PUNCTUATION = tuple(
    (wide, unicodedata.normalize("NFKC", wide)) for wide in "，！？：；（）\u3000"
)
"""Full-width punctuation of CJK text and its NFKC form, an ASCII character (a starter:
it composes with nothing). :func:`normalise` replaces them before NFKC, which gives the
same (NFKC works on the compatibility decomposition) and returns most CJK text as it is,
after a quick check, instead of decomposing and composing it again."""
_CLAUSE_END = re.compile(r"[,.;:!?\n、。，；：！？]")
_LATIN_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*")


def normalise(text: str) -> str:
    """NFKC, case-folded, straight apostrophes, single spaces, stripped.

    Idempotent in practice and the common ground of every lexicon match.
    """
    if text.isascii():  # NFKC and the apostrophe map leave ASCII alone
        return " ".join(text.lower().split())
    for wide, narrow in _WIDE_PUNCTUATION:
        text = text.replace(wide, narrow)
    folded = unicodedata.normalize("NFKC", text).casefold()
    for curly in _CURLY_APOSTROPHES:  # a replace per character: faster than translate
        folded = folded.replace(curly, "'")
    return " ".join(folded.split())  # the same whitespace as ``\\s`` and ``strip()``


Spans = list[tuple[int, int]]


def word_spans(norm: str) -> Spans:
    """``(start, end)`` of each non-CJK word of a normalised text (digits included)."""
    return [m.span() for m in _WORD.finditer(norm)]


def tokenize(text: str) -> list[str]:
    """Word tokens of ``text`` in reading order, for scoring and for BM25.

    - The text is :func:`normalise`-d first (NFKC + case folding), so ``"Ｈｅｌｌｏ"``
      and ``"hello"`` give the same token.
    - A Latin (or any space-delimited script) word is one token; inner apostrophes
      stay (``"don't"``), underscores and other punctuation split and are dropped.
    - Numbers joined by ``. , : / -`` stay whole: ``"3.5"``, ``"14:30"``, ``"2024-06-01"``.
    - A run of CJK characters (Han, kana, hangul) yields, for each character, its
      unigram followed by the bigram it starts: ``"京都"`` -> ``["京", "京都", "都"]``.
      That is the segmenter-free indexing used for Chinese retrieval (every word of
      one or two characters is matched exactly, longer words by their bigrams).

    Pure and deterministic; an empty or punctuation-only text gives ``[]``.
    """
    tokens: list[str] = []
    for match in _TOKEN.finditer(normalise(text)):
        run = match.group(1)  # the ``cjk`` group
        if run is None:
            tokens.append(match.group())
        else:
            last = len(run) - 1
            for i in range(last):
                tokens += (run[i], run[i : i + 2])  # each unigram, then its bigram
            tokens.append(run[last])
    return tokens


def _cjk_grams(run: str) -> Iterator[str]:
    """Unigrams and bigrams of a CJK run, each unigram followed by its bigram."""
    for i, char in enumerate(run):
        yield char
        if i + 1 < len(run):
            yield run[i : i + 2]


# --- lexicons: processors.cues; the parameters: processors.state.ScoringParams ---


_W = f"[^\\W_{CJK}]"
"""A character of a :data:`_WORD` word (letter or digit, not CJK)."""


@dataclass(frozen=True)
class Lexicon:
    """A compiled cue table giving leftmost-longest, non-overlapping matches.

    Latin cues (one or more words) match whole words only; CJK cues match anywhere
    (no segmenter), by one literal alternation. When every Latin cue is plain words
    joined by single spaces (the shipped tables), the Latin cues are one whole-word
    alternation too (``latin``), run only from the first word that can start a cue;
    otherwise they are found by looking up word n-grams.
    """

    weights: Mapping[str, float]
    cjk: re.Pattern[str] | None
    firsts: frozenset[str]
    longest: int
    latin: re.Pattern[str] | None = None
    single: frozenset[str] = frozenset()
    """The Latin cues of one word."""
    multi: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """First word -> the Latin cues of several words that start with it."""
    quick: re.Pattern[str] | None = None
    """``latin`` with ASCII word boundaries (see :func:`_quick_words`): the same
    matches when the boundary characters of each are what ``latin`` needs."""

    @classmethod
    def build(cls, table: Mapping[str, float]) -> Lexicon:
        weights = {normalise(cue): weight for cue, weight in table.items() if normalise(cue)}
        cjk = sorted((c for c in weights if _CJK_CHAR.search(c)), key=lambda c: (-len(c), c))
        latin = [c for c in weights if c not in cjk]
        pattern = re.compile("|".join(map(re.escape, cjk))) if cjk else None
        firsts = frozenset(c.split(" ")[0] for c in latin)
        longest = max((c.count(" ") + 1 for c in latin), default=0)
        single = frozenset(c for c in latin if " " not in c)
        multi: dict[str, tuple[str, ...]] = {}
        for cue in latin:
            if " " in cue:
                first = cue.split(" ")[0]
                multi[first] = (*multi.get(first, ()), cue)
        whole = _whole_words(latin)
        quick = None if whole is None else _quick_words(latin)
        return cls(weights, pattern, firsts, longest, whole, single, multi, quick)

    def hits(self, norm: str, words: Spans | None = None) -> list[tuple[int, str, float]]:
        """``(start, cue, weight)`` of each match in normalised text, in text order.

        ``words`` are the spans of :func:`word_spans` of ``norm``, when already known.
        """
        if self.latin is not None:
            return self.find(norm, _WORD.findall(norm))
        found = list(self._latin_hits(norm, words)) if self.firsts else []
        return self._with_cjk(norm, found)

    def _with_cjk(
        self, norm: str, found: list[tuple[int, str, float]]
    ) -> list[tuple[int, str, float]]:
        """``found`` plus the CJK matches, sorted (a CJK cue holds a non-ASCII char)."""
        if self.cjk is None or norm.isascii():
            return found
        weights = self.weights
        cjk = [(m.start(), m.group(), weights[m.group()]) for m in self.cjk.finditer(norm)]
        if not found:
            return cjk
        return sorted(found + cjk) if cjk else found

    def _fast_latin_hits(self, norm: str, words: list[str]) -> list[tuple[int, str, float]]:
        """:meth:`_latin_hits` by regex, from the first word that starts a cue.

        ``words`` are the words of ``norm`` (``_WORD.findall``); every cue starts with
        one of them, so no match can start before the first occurrence of one.
        """
        assert self.latin is not None
        starts = self.firsts.intersection(words)
        if not starts:
            return []
        multi = self.multi
        if starts.isdisjoint(self.single) and not any(
            cue in norm for first in starts for cue in multi.get(first, ())
        ):
            return []  # no cue of one word, none of several even as a substring
        start = min(norm.find(word) for word in starts)
        if self.quick is None:
            return self._scan(self.latin, norm, start)
        found = self._scan(self.quick, norm, start)
        if norm.isascii() or all(_whole_word_at(norm, at, cue) for at, cue, _ in found):
            return found  # each match of ``quick`` checked: ``latin``'s (see _quick_words)
        return self._scan(self.latin, norm, start)

    def _scan(
        self, pattern: re.Pattern[str], norm: str, start: int
    ) -> list[tuple[int, str, float]]:
        """``(start, cue, weight)`` of each match of ``pattern`` in ``norm`` from ``start``."""
        weights = self.weights
        return [(m.start(), m.group(), weights[m.group()]) for m in pattern.finditer(norm, start)]

    def _latin_hits(self, norm: str, words: Spans | None) -> Iterator[tuple[int, str, float]]:
        """Longest cue of whole words at each word, left to right, without overlaps."""
        words = word_spans(norm) if words is None else words
        i = 0
        while i < len(words):
            if norm[words[i][0] : words[i][1]] in self.firsts:
                for n in range(min(self.longest, len(words) - i), 0, -1):
                    cue = norm[words[i][0] : words[i + n - 1][1]]
                    if cue in self.weights:
                        yield words[i][0], cue, self.weights[cue]
                        i += n - 1
                        break
            i += 1

    def find(self, norm: str, words: list[str]) -> list[tuple[int, str, float]]:
        """:meth:`hits`, given the words of ``norm`` (``_WORD.findall(norm)``)."""
        if self.latin is None:
            return self.hits(norm)
        return self._with_cjk(norm, self._fast_latin_hits(norm, words))

    def distinct_sum_of(self, norm: str, words: list[str]) -> float:
        """:meth:`distinct_sum`, given the words of ``norm`` (``_WORD.findall(norm)``)."""
        return self.sum_of(self.distinct_of(norm, words))

    def distinct_of(self, norm: str, words: list[str]) -> frozenset[str]:
        """The distinct cues found in ``norm``, given its words (``_WORD.findall(norm)``).

        When no cue of several words occurs in ``norm`` even as a substring, the
        Latin cues found are just the words that are cues: no regex is needed.
        """
        if self.latin is None:
            return frozenset([cue for _, cue, _ in self.hits(norm)])
        starts = self.firsts.intersection(words)
        multi = self.multi
        if any(cue in norm for first in starts for cue in multi.get(first, ())):
            return frozenset([cue for _, cue, _ in self.find(norm, words)])
        cues = starts & self.single
        if self.cjk is not None and not norm.isascii():
            cues = cues.union([m.group() for m in self.cjk.finditer(norm)])
        return cues

    def sum_of(self, cues: frozenset[str] | set[str]) -> float:
        """The sum of the weights of ``cues``, correctly rounded (``math.fsum``): the same
        whatever the order of a set."""
        weights = self.weights
        return math.fsum([weights[cue] for cue in cues])

    def distinct_sum(self, norm: str, words: Spans | None = None) -> float:
        """Sum of the weights of the distinct cues found (first-seen order)."""
        return self._distinct(self.hits(norm, words))

    def _distinct(self, hits: list[tuple[int, str, float]]) -> float:
        seen = dict.fromkeys(cue for _, cue, _ in hits)
        return math.fsum(self.weights[cue] for cue in seen)


def _whole_words(cues: Sequence[str]) -> re.Pattern[str] | None:
    """One regex matching, leftmost-longest, any of ``cues`` as whole words.

    A word starts where a word character follows neither a word character nor an
    apostrophe glued to one (``_WORD`` would have taken it), and ends likewise. Only
    possible when each cue is words joined by single spaces; else ``None``.
    """
    if not cues:
        return None
    for cue in cues:
        spans = word_spans(cue)
        pieces = [cue[a:b] for a, b in spans]
        if not pieces or " ".join(pieces) != cue:
            return None
    alternation = "|".join(map(re.escape, sorted(cues, key=lambda c: (-len(c), c))))
    return re.compile(f"{_STARTS_WORD}(?:{alternation}){_ENDS_WORD}")


_STARTS_WORD = rf"(?<!{_W})(?<!{_W}')"
_ENDS_WORD = rf"(?!{_W})(?!'{_W})"
_ASCII_W = "[0-9A-Za-z]"
"""The ASCII characters of :data:`_W`."""


def _quick_words(cues: Sequence[str]) -> re.Pattern[str]:
    """:func:`_whole_words`, faster, with word boundaries seen in ASCII only.

    One branch per first character of a cue, its lookbehinds after that character: the
    regex engine skips to the characters that can start a cue, instead of trying the
    lookbehinds at every position (with :data:`_W` in each branch, the regex would take
    a tenth of a second to compile). The alternatives are in the same order and their
    boundary checks are weaker, so where the characters around each match meet
    :data:`_W`'s checks (always in ASCII text), the matches are those of
    :func:`_whole_words`: no earlier start or alternative passed the weaker checks.
    """
    rests: dict[str, list[str]] = {}  # first character -> the rest of each cue
    for cue in sorted(cues, key=lambda c: (-len(c), c)):
        rests.setdefault(cue[0], []).append(cue[1:])
    starts = f"(?<!{_ASCII_W}.)(?<!{_ASCII_W}'.)"
    alternation = "|".join(
        f"{re.escape(first)}{starts}(?:{'|'.join(map(re.escape, rest))})"
        for first, rest in sorted(rests.items())
    )
    return re.compile(f"(?:{alternation})(?!{_ASCII_W})(?!'{_ASCII_W})")


_STARTS_WORD_AT = re.compile(_STARTS_WORD)
_ENDS_WORD_AT = re.compile(_ENDS_WORD)


def _whole_word_at(norm: str, start: int, cue: str) -> bool:
    """Whether ``cue``, found at ``start`` in ``norm``, has word boundaries by :data:`_W`."""
    end = start + len(cue)
    return bool(_STARTS_WORD_AT.match(norm, start)) and bool(_ENDS_WORD_AT.match(norm, end))


@dataclass(frozen=True)
class Reading:
    """What the scorer reads a text with under one :class:`ScoringParams`: its
    lexicons, built once per parameter set (see :func:`reading`)."""

    importance: Lexicon
    polarity: Lexicon
    confidence: Lexicon
    negators: frozenset[str]
    intensifiers: frozenset[str]
    intensifier_chars: frozenset[str]
    """Every character of an intensifier: a window without any has none to remove."""
    apart: bool
    """Whether :func:`analysis` may read a text sentence by sentence (see
    :func:`_read`): no cue holds a clause end (so none spans two sentences), and no
    intensifier or negator character holds a space (so the space between two
    sentences changes no negation's scope)."""

    @staticmethod
    def of(params: ScoringParams) -> Reading:
        lexicons = (
            Lexicon.build(params.importance_markers),
            Lexicon.build(params.polarity),
            Lexicon.build(params.confidence_cues),
        )
        cut = any(_CLAUSE_END.search(cue) for lexicon in lexicons for cue in lexicon.weights)
        spaced = any(c.isspace() for c in "".join(params.intensifiers) + params.negator_chars)
        return Reading(
            *lexicons,
            negators=frozenset(params.negators),
            intensifiers=frozenset(params.intensifiers),
            intensifier_chars=frozenset("".join(params.intensifiers)),
            apart=not cut and not spaced,
        )


DEFAULT_PARAMS = ScoringParams()


# --- per-turn scores ------------------------------------------------------------


@dataclass(frozen=True)
class Scores:
    """Importance 1..10, sentiment -1..1, confidence 0..1 (checked on creation)."""

    importance: float
    sentiment: float
    confidence: float

    def __post_init__(self) -> None:
        if not 1.0 <= self.importance <= 10.0:
            raise ValueError(f"importance {self.importance} outside 1..10")
        if not -1.0 <= self.sentiment <= 1.0:
            raise ValueError(f"sentiment {self.sentiment} outside -1..1")
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence {self.confidence} outside 0..1")


def _clamp(value: float, low: float, high: float) -> float:
    """``value`` limited to [low, high] and rounded to 3 decimals (stable floats).

    The rounding is remembered by value: ``round(x, 3)`` goes through a decimal string
    (some 2 600 instructions), and a third of the values the rich workload rounds are
    new. Zeros are not remembered (0.0 and -0.0 are one key, with two roundings), nor
    is NaN (never found again)."""
    clamped = min(max(value, low), high)
    rounded = _ROUNDED.get(clamped)
    if rounded is None:
        rounded = round(clamped, 3)
        if clamped != 0.0 and clamped == clamped:
            if len(_ROUNDED) >= 65536:
                _ROUNDED.clear()
            _ROUNDED[clamped] = rounded
    return rounded


_ROUNDED: Final[dict[float, float]] = {}
""":func:`_clamp`'s roundings (bounded: cleared when full)."""


def score_text(text: str, params: ScoringParams = DEFAULT_PARAMS) -> Scores:
    """Estimate the scores of one text with the lexicon heuristics of ``params``.

    Pure and deterministic; see :class:`ScoringParams` for the formulas. A text
    without any word scores the minimum importance, neutral sentiment and the
    base confidence.
    """
    return analysis(text, params)[0]


def analyse(text: str, params: ScoringParams = DEFAULT_PARAMS) -> tuple[Scores, list[str]]:
    """``(score_text(text, params), extract_entities(text))``, sharing the work."""
    scores, entities = analysis(text, params)
    return scores, list(entities)


MEMO_TEXTS = 16384
"""Texts whose :func:`analysis` a :class:`ScoringParams` remembers (the oldest forgotten
first), at most ``MEMO_CHARS`` long each."""
MEMO_SENTENCES = 65536
"""Sentences whose :class:`_Part` a :class:`ScoringParams` remembers: enough for those of
the turns that the open episodes and working memories of a worker's agents hold, which
the summariser reads again (tens of MB at most: see :class:`~processors.memo.Memo`)."""
MEMO_CHARS = 512
"""Longer texts and sentences are read every time, not remembered."""
MEMO_TOTAL_CHARS = 1 << 22
"""Characters of texts (and of sentences) each memo holds at most."""


Analysis = tuple[Scores, tuple[str, ...]]
"""What :func:`analysis` finds in a text: its estimated scores and its entities."""


class _Part:
    """What the scorer reads in one sentence, or in a whole text read at once: the
    parts of a text's sentences add up to the text's :func:`analysis` (:func:`_total`),
    when the sentences can be read apart (:func:`_adds_up`, from the last four fields).

    A class of its own, not a named tuple: compiled, it is made and read natively."""

    __slots__ = (
        "asks", "bangs", "cjk", "ends", "entities", "felt", "follows", "hedged", "lead",
        "marked", "norm", "stable", "words",
    )  # fmt: skip

    def __init__(
        self,
        norm: str,
        words: int,
        cjk: int,
        bangs: int,
        asks: bool,
        felt: tuple[float, ...],
        marked: frozenset[str],
        hedged: frozenset[str],
        entities: tuple[str, ...],
        ends: bool,
        follows: bool,
        lead: int,
        stable: bool,
    ) -> None:
        self.norm = norm
        """The sentence, :func:`normalise`-d."""
        self.words = words
        """Its words (:data:`_WORD`)."""
        self.cjk = cjk
        """Its CJK characters."""
        self.bangs = bangs
        """Its exclamation marks."""
        self.asks = asks
        """Whether it holds a question mark or 吗."""
        self.felt = felt
        """weight · :func:`_modifier` of each polarity cue, in text order."""
        self.marked = marked
        """Its distinct importance markers."""
        self.hedged = hedged
        """Its distinct confidence cues."""
        self.entities = entities
        """:func:`extract_entities` of the sentence (of its own characters, not normalised)."""
        self.ends = ends
        """Whether another sentence may follow it (see :func:`_ends`)."""
        self.follows = follows
        """Whether it may follow another sentence (see :func:`_follows`)."""
        self.lead = lead
        """How many opening quotes and brackets come before its first word."""
        self.stable = stable
        """Whether NFKC leaves a boundary before its first character (:data:`_STABLE`)."""


class _Memo(NamedTuple):
    params: ScoringParams
    reading: Reading
    texts: Memo[Analysis]
    sentences: Memo[_Part]


_MEMOS: dict[int, _Memo] = {}


class _Last:
    """The parameters :func:`_memo_of` was last asked for, and their entry: a native
    object, read without the lookups by id (a fold asks for one ``params`` at a time,
    some thirty thousand times in ten thousand events)."""

    __slots__ = ("entry", "params")

    def __init__(self) -> None:
        self.params: ScoringParams | None = None
        self.entry: _Memo | None = None


_LAST: Final = _Last()


def _memo_of(params: ScoringParams) -> _Memo:
    """The lexicons of ``params`` and the texts and sentences it has read, found by
    identity: a copy of ``params`` (``model_copy(update=...)``) gets its own; each entry
    holds its ``params``, so the id is not reused while the entry lives."""
    last = _LAST.entry
    if last is not None and _LAST.params is params:
        return last
    entry = _MEMOS.get(id(params))
    if entry is None or entry.params is not params:
        if len(_MEMOS) >= 64:
            _MEMOS.clear()
        texts: Memo[Analysis] = Memo(MEMO_TEXTS, MEMO_TOTAL_CHARS, MEMO_CHARS)
        sentences: Memo[_Part] = Memo(MEMO_SENTENCES, MEMO_TOTAL_CHARS, MEMO_CHARS)
        entry = _MEMOS[id(params)] = _Memo(params, Reading.of(params), texts, sentences)
    _LAST.params = params
    _LAST.entry = entry
    return entry


def reading(params: ScoringParams) -> Reading:
    """The lexicons of ``params``, built the first time they are asked for."""
    return _memo_of(params).reading


def analysis(text: str, params: ScoringParams) -> Analysis:
    """``(score_text(text, params), extract_entities(text))``, remembered for short texts.

    The analysis is a pure function of the text and ``params``, so remembering it
    changes no result: it saves the work when a text comes back (a short reply, a
    repeated prompt, the one sentence of a turn summarised with its episode). A
    text is read sentence by sentence when that gives the same (:func:`_adds_up`),
    and each sentence is remembered: the summariser scores the sentences of the turns
    it summarises, and a sentence met again in another text is not read again.
    """
    memo = _memo_of(params)
    found = memo.texts.get(text)
    if found is None:
        found = _finish(_read(text, params, memo.sentences), params)
        memo.texts.put(text, found)
    return found


def _read(text: str, params: ScoringParams, memo: Memo[_Part]) -> _Part:
    """What the scorer reads in ``text``: the total of the parts of its sentences
    (:func:`~processors.sentences.sentences_and_gaps`) when they add up to what reading
    the text at once gives (:func:`_adds_up`), else the text read at once."""
    if reading(params).apart:
        sentences, gaps = remembered_sentences_and_gaps(text)
        if len(sentences) == 1 and not gaps[0] and text.endswith(sentences[0]):
            return _sentence_part(text, params, memo)  # the text is its one sentence
        if sentences:
            parts = [_sentence_part(sentence, params, memo) for sentence in sentences]
            if _adds_up(text, parts, gaps):
                return _total(parts)
    return _part(text, normalise(text), params)


def _sentence_part(sentence: str, params: ScoringParams, memo: Memo[_Part]) -> _Part:
    """:func:`_part` of a sentence, remembered in ``memo``."""
    part = memo.get(sentence)
    if part is None:
        part = _part(sentence, normalise(sentence), params)
        memo.put(sentence, part)
    return part


def _part(text: str, norm: str, params: ScoringParams) -> _Part:
    """What the scorer reads in ``text``, whose :func:`normalise` is ``norm``."""
    words = _WORD.findall(norm)
    cjk = 0 if norm.isascii() else len(_CJK_CHAR.findall(norm))
    bangs, asks = norm.count("!"), "?" in norm or "吗" in norm
    entities = tuple(extract_entities(text))
    ends, follows = _ends(text, norm), _follows(text, norm)
    lead = len(text) - len(text.lstrip(_OPENERS))
    stable = _STABLE.match(text) is not None
    if not words and not cjk:  # no cue can match: each has a word or a CJK character
        return _Part(
            norm, 0, 0, bangs, asks, (), _NONE, _NONE, entities, ends, follows, lead, stable
        )
    read = reading(params)
    felt = tuple(
        [
            weight * _modifier(norm, start, cue, params)
            for start, cue, weight in read.polarity.find(norm, words)
        ]
    )
    marked = read.importance.distinct_of(norm, words)
    hedged = read.confidence.distinct_of(norm, words)
    return _Part(
        norm, len(words), cjk, bangs, asks, felt, marked, hedged, entities, ends, follows, lead,
        stable,
    )  # fmt: skip


_NONE: frozenset[str] = frozenset()


def _finish(part: _Part, params: ScoringParams) -> Analysis:
    """The analysis of the text whose reading is ``part``: the same floating-point
    operations in the same order as :func:`score_text` as first written."""
    if not part.words and not part.cjk:
        return Scores(1.0, 0.0, _clamp(params.confidence_base, 0.0, 1.0)), part.entities
    sentiment = _sentiment(reduce(add, part.felt, 0.0), part.bangs, params)
    length = part.words + part.cjk / params.cjk_chars_per_word
    named = len(part.entities)
    scores = Scores(
        importance=_importance(part.marked, named, length, part.bangs > 0, sentiment, params),
        sentiment=sentiment,
        confidence=_confidence(part.hedged, part.asks, params),
    )
    return scores, part.entities


def _total(parts: list[_Part]) -> _Part:
    """The reading of the text made of ``parts`` (its ``norm`` and the last four fields
    left out): what reading the text at once finds, in the same order. The polarities
    follow each other (their sum, ``reduce(add, ...)``, is then the same floating-point
    additions in the same order as the text's); the distinct cues are the union of
    the parts' (their weights are summed by ``math.fsum``: any order gives the same);
    counts add up; the entities are the first ten distinct (case-folded) of the parts,
    in order."""
    words = cjk = bangs = 0
    asks = False
    felt: list[float] = []
    marked: set[str] = set()
    hedged: set[str] = set()
    for part in parts:
        words += part.words
        cjk += part.cjk
        bangs += part.bangs
        asks = asks or part.asks
        felt.extend(part.felt)
        marked.update(part.marked)
        hedged.update(part.hedged)
    entities = _first_entities([part.entities for part in parts])
    return _Part(
        "", words, cjk, bangs, asks, tuple(felt), frozenset(marked), frozenset(hedged), entities,
        False, False, 0, False,
    )  # fmt: skip


def _first_entities(entities: Sequence[tuple[str, ...]], limit: int = 10) -> tuple[str, ...]:
    """The first ``limit`` distinct (case-folded) of ``entities``, in order."""
    found: dict[str, str] = {}
    for entity in chain.from_iterable(entities):
        found.setdefault(entity.casefold(), entity)
        if len(found) == limit:
            break
    return tuple(found.values())


# --- when the sentences of a text can be read apart ----------------------------------
#
# The scores: every cue, word and clause (a negation's scope) ends at a clause end
# (``_CLAUSE_END``): when the normalised text is the normalised sentences joined by
# their gaps (a space, or nothing) and each sentence but the last ends with a clause
# end, the cues of the text are those of its sentences (:attr:`Reading.apart`).
# The entities: no rule may match across a gap, and each rule's context must read the
# same in a sentence alone (see _adds_up).

_ENDS = frozenset(".!?;:\n。！？；：")
"""The characters :func:`_starts_sentence` reads as a sentence's end."""
_OPENERS = " \t\"'“‘([「『"
"""What :func:`_starts_sentence` skips before a sentence's first word."""
_QUOTE = re.compile("[「『“《]")
"""The first character of a quoted span (an entity rule), which may hold sentences."""
_QUOTATION_MARKS = "「」『』“”《》"
"""The characters a quoted span cannot hold (its rule's class), opening and closing."""
_CLAUSE_ENDS = frozenset(",.;:!?\n、。，；：！？")
"""The characters of ``_CLAUSE_END``."""
_GAP_ROOM = 60
"""Gap and opening quotes before a sentence's first word that :func:`_starts_sentence`,
which looks 64 characters back, sees across to the sentence before."""
_STABLE = re.compile(
    "[\x21-\x7e\u2018-\u201f\u3001-\u3029\u3041-\u3096\u30a1-\u30fa"
    "\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7a3\uff01-\uff5e]"
)
"""First characters before which NFKC leaves a boundary: starters that no character
before them composes with, and whose NFKC starts with such a starter, not a space
(printable ASCII, Han, kana, hangul syllables, CJK punctuation and quotation marks,
full-width ASCII; ``tests/unit/test_scoring_fast_paths.py`` checks each). NFKC of a
string cut before one is NFKC of the head followed by NFKC of the rest."""


def _ends(sentence: str, norm: str) -> bool:
    """Whether another sentence may follow ``sentence`` (whose :func:`normalise` is
    ``norm``): it ends with a mark that :func:`_starts_sentence` reads as an end and
    that normalises to a clause end, and leaves no quote open (a quoted span, the only
    entity rule whose match may hold a sentence's end, could close in the next)."""
    if not norm or sentence[-1] not in _ENDS or norm[-1] not in _CLAUSE_ENDS:
        return False
    return _QUOTE.search(sentence) is None or not _quote_unclosed(sentence)


def _quote_unclosed(sentence: str) -> bool:
    """Whether the last quotation mark of ``sentence`` opens a quote."""
    last = max(sentence.rfind(mark) for mark in _QUOTATION_MARKS)
    return _QUOTE.match(sentence, last) is not None


def _follows(sentence: str, norm: str) -> bool:
    """Whether ``sentence`` may follow another: it does not start with a digit (``March.
    3`` is a date) and does not normalise to nothing."""
    return bool(norm) and _DIGIT.match(sentence) is None


def _adds_up(text: str, parts: list[_Part], gaps: list[str]) -> bool:
    """Whether the parts of the sentences of ``text`` (``gaps``: see
    :func:`~processors.sentences.sentences_and_gaps`) add up to reading it at once.

    The entities: each sentence but the last may be followed (:func:`_ends`), each but
    the first may follow (:func:`_follows`), every gap is spaces, tabs and line breaks,
    short enough that :func:`_starts_sentence` sees across it and across the opening
    quotes of the sentence after it. The scores: see :func:`_joined`.
    """
    last = len(parts) - 1
    for at, part in enumerate(parts):
        if (at < last and not part.ends) or (at and not part.follows):
            return False
    if not parts[last].norm:
        return False
    spaces = "".join(gaps)
    if spaces.strip(" \t\n"):
        return False
    if max([len(gap) + part.lead for gap, part in zip(gaps, parts, strict=True)]) > _GAP_ROOM:
        return False
    return _joined(text, parts, gaps)


def _joined(text: str, parts: list[_Part], gaps: list[str]) -> bool:
    """Whether ``normalise(text)`` is the parts' ``norm`` joined by their gaps (a space
    for whitespace, nothing for none).

    Known without normalising the text when it is ASCII (:func:`normalise` lower-cases
    it character by character and turns each run of whitespace into a space; the
    sentences are stripped), and when each sentence starts with a :data:`_STABLE`
    character (the gaps being ASCII): NFKC then normalises the text gap by gap and
    sentence by sentence, the other steps of :func:`normalise` go character by
    character but the last, which turns runs of whitespace into a space, and a
    sentence's first character normalises to no space, nor does its last (a clause
    end).
    """
    if text.isascii() or all([part.stable for part in parts]):
        return True
    pieces = [parts[0].norm]
    for gap, part in zip(gaps[1:], parts[1:], strict=True):
        pieces += (" " if gap else "", part.norm)
    return normalise(text) == "".join(pieces)


def score_turn(
    content: str,
    *,
    importance: float | None,
    sentiment: float | None,
    confidence: float | None,
    params: ScoringParams = DEFAULT_PARAMS,
) -> Scores:
    """Scores of one turn: each value the agent supplied wins, the rest are estimated.

    The text is scored only when at least one value is missing.
    """
    if importance is not None and sentiment is not None and confidence is not None:
        return Scores(importance, sentiment, confidence)
    return _supplied_win(score_text(content, params), importance, sentiment, confidence)


def analyse_turn(
    content: str,
    *,
    importance: float | None,
    sentiment: float | None,
    confidence: float | None,
    params: ScoringParams = DEFAULT_PARAMS,
) -> tuple[Scores, list[str]]:
    """``(score_turn(...), extract_entities(content))``, sharing the work."""
    if importance is not None and sentiment is not None and confidence is not None:
        # the analysis, not the entities alone: the summariser scores these sentences too
        return Scores(importance, sentiment, confidence), list(analysis(content, params)[1])
    estimate, found = analysis(content, params)
    if importance is None and sentiment is None and confidence is None:
        return estimate, list(found)
    return _supplied_win(estimate, importance, sentiment, confidence), list(found)


def _supplied_win(
    estimate: Scores, importance: float | None, sentiment: float | None, confidence: float | None
) -> Scores:
    return Scores(
        importance=estimate.importance if importance is None else importance,
        sentiment=estimate.sentiment if sentiment is None else sentiment,
        confidence=estimate.confidence if confidence is None else confidence,
    )


def _sentiment(raw: float, bangs: int, params: ScoringParams) -> float:
    """tanh of ``raw``, the summed, negation- and intensifier-adjusted cue polarities
    (:func:`_modifier`), amplified by ``bangs`` exclamation marks (at most three)."""
    if not raw:
        return 0.0  # what the clamped tanh of 0.0 is
    raw *= 1.0 + params.exclaim_sentiment * min(bangs, 3)
    return _clamp(math.tanh(params.sentiment_gain * raw), -1.0, 1.0)


def _importance(
    marked: frozenset[str],
    entities: int,
    length: float,
    exclaimed: bool,
    sentiment: float,
    p: ScoringParams,
) -> float:
    """Base + markers + entities + length + exclamation + arousal, in 1..10."""
    markers = min(reading(p).importance.sum_of(marked), p.marker_cap)
    named = min(p.entity_weight * entities, p.entity_cap)
    size = p.length_max * min(1.0, length / p.length_scale)
    exclaim = p.exclaim_importance if exclaimed else 0.0
    arousal = p.arousal_weight * abs(sentiment)
    total = p.importance_base + markers + named + size + exclaim + arousal
    return _clamp(total, 1.0, 10.0)


def _modifier(norm: str, start: int, cue: str, params: ScoringParams) -> float:
    """−negation_factor if the cue is negated, intensifier_boost if intensified, else 1.

    The scope is the same clause, just before the cue: the last ``negation_window``
    words for a Latin cue, the last ``negation_window`` characters (intensifiers
    such as 非常 / 特别 removed first) for a CJK cue.
    """
    clause = _CLAUSE_END.split(norm[max(0, start - 64) : start])[-1]
    if _CJK_CHAR.match(cue[0]):
        window = clause[-(params.negation_window + 1) :]
        plain = window
        if not reading(params).intensifier_chars.isdisjoint(window):
            for word in params.intensifiers:
                plain = plain.replace(word, "")
        negated = any(char in plain[-params.negation_window :] for char in params.negator_chars)
        intensified = plain != window
    else:
        words = _LATIN_WORD.findall(clause)[-params.negation_window :]
        read = reading(params)
        negators = read.negators
        negated = any(w in negators or w.endswith("n't") for w in words)
        intensified = not read.intensifiers.isdisjoint(words)
    if negated:
        return -params.negation_factor
    return params.intensifier_boost if intensified else 1.0


def _confidence(hedged: frozenset[str], asks: bool, params: ScoringParams) -> float:
    """Base + distinct hedge/assertion cues − question penalty, clamped."""
    shift = reading(params).confidence.sum_of(hedged)
    question = params.question_penalty if asks else 0.0
    value = params.confidence_base + shift - question
    return _clamp(value, params.confidence_min, params.confidence_max)


# --- episodes -----------------------------------------------------------------


def aggregate(scores: Sequence[Scores], params: ScoringParams = DEFAULT_PARAMS) -> Scores:
    """Scores of an episode from the scores of its turns.

    - importance = w · max + (1 − w) · mean, w = ``episode_peak_weight`` (0.7): one
      vital turn makes the episode important, a long dull tail dilutes it a little;
    - sentiment = Σ s·|s| / Σ |s|: the mean weighted by strength, so neutral turns
      do not water down a clearly felt one (0 when every turn is neutral);
    - confidence = plain mean.

    No turns gives importance 1, sentiment 0 and the base confidence.
    """
    importance, sentiment, confidence = aggregate_values(
        [s.importance for s in scores],
        [s.sentiment for s in scores],
        [s.confidence for s in scores],
        params,
    )
    return Scores(importance, sentiment, confidence)


def aggregate_values(
    importances: Sequence[float],
    sentiments: Sequence[float],
    confidences: Sequence[float],
    params: ScoringParams = DEFAULT_PARAMS,
) -> tuple[float, float, float]:
    """:func:`aggregate` of the turns whose scores are ``zip(importances, sentiments,
    confidences)``, as ``(importance, sentiment, confidence)``."""
    if not importances:
        return 1.0, 0.0, _clamp(params.confidence_base, 0.0, 1.0)
    peak = params.episode_peak_weight
    importance = peak * max(importances) + (1 - peak) * _mean(importances)
    strength = math.fsum([abs(s) for s in sentiments])
    felt = math.fsum([s * abs(s) for s in sentiments])
    return (
        _clamp(importance, 1.0, 10.0),
        _clamp(felt / strength if strength else 0.0, -1.0, 1.0),
        _clamp(_mean(confidences), 0.0, 1.0),
    )


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


# --- entities -------------------------------------------------------------------

_MONTHS = {
    "J": ("an(?:uary)?", "une?", "uly?"),
    "F": ("eb(?:ruary)?",),
    "M": ("ar(?:ch)?", "ay"),
    "A": ("pr(?:il)?", "ug(?:ust)?"),
    "S": ("ep(?:t(?:ember)?)?",),
    "O": ("ct(?:ober)?",),
    "N": ("ov(?:ember)?",),
    "D": ("ec(?:ember)?",),
}
"""English month names (full or abbreviated) by initial, as regexes of the rest."""


def _month(after_initial: str = "") -> str:
    """A regex for a month name and an optional dot; ``after_initial`` (a lookbehind)
    goes after its first letter, so the regex can start with one of the initials."""
    names = "|".join(
        f"{initial}{after_initial}(?:{'|'.join(rests)})" for initial, rests in _MONTHS.items()
    )
    return rf"(?:{names})\.?"


_MONTH = _month()
_MONTH_WORD = _month(r"(?<!\w.)")
"""A month name starting a word (``\b`` before it)."""
_UPPER = r"[A-Z\u00c0-\u00d6\u00d8-\u00de]"
_NAME_WORD = rf"(?<![\w'’-]){_UPPER}[^\W{CJK}]*(?:['’-][^\W{CJK}]+)*"
_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_STOP = "的了是和与跟我你他她它们很也都就吗呢吧啊呀哦嘛着过在"


def _han_run(low: int, high: int) -> str:
    """A regex for ``low``..``high`` Han characters that are not function characters."""
    return rf"(?:(?![{_STOP}])[{_HAN}]){{{low},{high}}}"


_DIGIT = re.compile(r"\d")
_ASCII_DIGIT = re.compile("[0-9]")
"""The same as :data:`_DIGIT` on ASCII text, and faster."""


def _guard(guard: str) -> re.Pattern[str] | None:
    """The guard regex, or ``None`` for a bare digit (checked once per text)."""
    return None if guard == _DIGIT.pattern else re.compile(guard)


_ENTITY_RULES: tuple[tuple[bool, bool, re.Pattern[str] | None, re.Pattern[str]], ...] = tuple(
    ("wide" in needs, "digit" in needs, _guard(guard), re.compile(pattern))
    for needs, guard, pattern in (
        # quoted spans: the group is the entity
        ("wide", "[「『“《]", r"[「『“《]([^「」『』“”《》\n]{1,40})[」』”》]"),
        # @handles and #tags
        ("", "[@#]", r"([@#](?<!\w.)(?:[^\W\d_][\w.-]*\w|[^\W\d_]))"),
        # dates and times (each needs a digit)
        ("digit", r"\d", rf"({_MONTH_WORD}\s+\d\d?(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?)"),
        (
            "digit",
            r"\d",
            rf"(\d(?<!\w\d)\d?(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}(?:,?\s+\d{{4}})?)",
        ),
        ("digit", r"\d", r"(\d\d{3}[-/.]\d{1,2}[-/.]\d{1,2})"),
        (
            "wide digit",
            "[年月]",
            r"(\d(?:\d{1,3}年\d{1,2}月(?:\d{1,2}[日号])?|\d?月(?:\d{1,2}[日号])?|\d{3}年))",
        ),
        (
            "digit",
            ":|[AaPp][Mm]",
            r"(\d(?:\d?:\d{2}(?::\d{2})?(?:\s?[AaPp]\.?[Mm]\.?)?|\d?\s?[AaPp][Mm]\b))",
        ),
        ("wide digit", "[点時时]", r"(\d\d?[点時时](?:\d{1,2}分|半)?)"),
        ("digit", "/", r"(\d\d?/\d{1,2}(?:/\d{2,4})?)"),
        # numbers, with currency or percent
        ("digit", r"\d", r"([$€£¥\d](?<![0-9A-Za-z_.].)(?:(?<=\d)|\d)\d*(?:[.,]\d+)*%?)"),
        # Chinese names and places after 叫 / 姓 / 在
        ("wide", "叫", rf"叫({_han_run(2, 3)})"),
        ("wide", "姓", rf"姓({_han_run(1, 2)})"),
        ("wide", "在", rf"在(?<![现正实存所自好].)({_han_run(2, 4)})"),
    )
)
r"""(wide, digit, guard, pattern): the pattern runs only when the text is not ASCII (if
``wide``: every wide guard is made of non-ASCII characters), holds a digit (if ``digit``:
the pattern cannot match without one) and its cheap guard is found in the text.

Each pattern starts by consuming one character of a class (``\d``, ``[@#]``, ...), its
lookbehind checked just after it (``\d(?<!\w\d)`` is ``\b\d``; ``\d\d?`` is
``\d{1,2}``): then the regex engine skips in C to the characters that can start a
match instead of trying the whole pattern at every position (several times faster on
long texts). The month rule puts its lookbehind after a month's initial.
``tests/unit/test_scoring_fast_paths.py`` checks every match against the plain
patterns."""
_NAMES = re.compile(rf"({_UPPER}(?<![\w'’-].)[^\W{CJK}]*(?:['’-][^\W{CJK}]+)*(?: {_NAME_WORD})*)")
"""Capitalised words and multiword names (cleaned by :func:`_names`): one
:data:`_NAME_WORD` then more after single spaces; the first one's lookbehind comes
after its capital, so that the regex engine can skip to the capitals."""
_CAPITAL = re.compile(_UPPER)
_WORDS = re.compile(r"\S+")
_FIRST_PERSON = frozenset({"i", "i'm", "i'll", "i've", "i'd", "i’m", "i’ll", "i’ve", "i’d"})
COMMON_STARTERS = frozenset(
    {
        "a", "an", "the", "this", "that", "these", "those", "it", "its", "it's", "i'm", "my",
        "mine", "we", "our", "you", "your", "he", "his", "she", "her", "they", "their", "there",
        "here", "what", "when", "where", "why", "how", "who", "whom", "which", "whose", "if",
        "then", "so", "and", "but", "or", "nor", "yet", "for", "because", "since", "as", "while",
        "although", "though", "after", "before", "until", "unless", "also", "just", "now", "today",
        "tonight", "tomorrow", "yesterday", "please", "remember", "note", "hi", "hello", "hey",
        "dear", "thanks", "thank", "ok", "okay", "yes", "yeah", "yep", "no", "nope", "sure", "well",
        "oh", "ah", "wow", "sorry", "let", "let's", "can", "could", "would", "should", "will",
        "shall", "may", "might", "must", "do", "does", "did", "don't", "doesn't", "didn't", "is",
        "are", "was", "were", "be", "been", "am", "have", "has", "had", "not", "never", "always",
        "maybe", "perhaps", "actually", "really", "however", "anyway", "besides", "first", "second",
        "next", "finally", "great", "good", "nice", "cool", "fine", "in", "on", "at", "by", "to",
        "from", "with", "about", "of", "some", "any", "all", "every", "each", "many", "much",
        "more", "most", "one", "two", "both", "either", "neither", "other", "another", "morning",
        "evening", "afternoon", "night"
    }
)  # fmt: skip


def extract_entities(text: str, limit: int = 10) -> list[str]:
    """Names, numbers, dates, handles, tags and quoted titles in ``text``.

    A deterministic heuristic, no model: capitalised (multi)words except first
    person and common sentence starters; numbers, dates and times in English and
    Chinese formats; ``@handles`` and ``#tags``; spans quoted with 「」『』“”《》;
    2-4 Han characters after 叫 / 姓 / 在. Overlapping candidates keep the one that
    starts first (the longest on ties). Results keep their surface form, are
    de-duplicated case-insensitively in first-seen order and cut to ``limit``.

    The candidates come in order and are read only until ``limit`` entities are
    found: most of a long text is never searched.
    """
    found: dict[str, str] = {}
    if limit > 0:
        for entity in _non_overlapping(_candidates(text)):
            found.setdefault(entity.casefold(), entity)
            if len(found) == limit:
                break
    return list(found.values())


_RULES_FOR: dict[tuple[bool, bool], tuple[tuple[re.Pattern[str] | None, re.Pattern[str]], ...]] = {
    (wide, digit): tuple(
        (guard, pattern)
        for needs_wide, needs_digit, guard, pattern in _ENTITY_RULES
        if (wide or not needs_wide) and (digit or not needs_digit)
    )
    for wide in (False, True)
    for digit in (False, True)
}
"""(guard, pattern) of the rules that can match, by (text not ASCII, text has a digit)."""


_Span = tuple[int, int, str]
"""``(start, start - end, entity)``: sorted, by start and then longest first."""


def _candidates(text: str) -> Iterator[_Span]:
    """Every pattern match, names already cleaned, sorted: each rule's matches come in
    order (the regex scans left to right), merged lazily."""
    wide = not text.isascii()
    digit = (_DIGIT if wide else _ASCII_DIGIT).search(text) is not None
    streams = [
        _matches(pattern, text)
        for guard, pattern in _RULES_FOR[wide, digit]
        if guard is None or guard.search(text)
    ]
    capital = _CAPITAL.search(text)
    if capital is not None:  # every name starts with a capital
        streams.append(_all_names(text, capital.start()))
    if len(text) <= _SORTED_CHARS:  # faster than merging, when there is little to read
        return iter(sorted(chain.from_iterable(streams)))
    return heapq.merge(*streams)


_SORTED_CHARS = 512


def _matches(pattern: re.Pattern[str], text: str) -> Iterator[_Span]:
    """The matches of an entity rule, the entity being its group, stripped."""
    for match in pattern.finditer(text):
        if inner := match.group(1).strip():
            start, end = match.span()
            yield start, start - end, inner


def _all_names(text: str, start: int) -> Iterator[_Span]:
    """The names from ``start`` on."""
    for match in _NAMES.finditer(text, start):
        yield from _names(text, match)


def _names(text: str, match: re.Match[str]) -> Iterator[_Span]:
    """Split a capitalised run at first-person words; drop a common sentence starter."""
    name = match.group()
    if " " not in name:  # one word, the usual case
        folded = name.casefold()
        if folded in _FIRST_PERSON:
            return
        if folded in COMMON_STARTERS and _starts_sentence(text, match.start()):
            return
        start, end = match.span()
        yield start, start - end, name
        return
    words = [(w.start(), w.end()) for w in _WORDS.finditer(text, match.start(), match.end())]
    first = text[words[0][0] : words[0][1]].casefold()
    if first in COMMON_STARTERS and _starts_sentence(text, words[0][0]):
        words = words[1:]
    run: list[tuple[int, int]] = []
    for start, end in [*words, (-1, -1)]:
        if start >= 0 and text[start:end].casefold() not in _FIRST_PERSON:
            run.append((start, end))
        elif run:
            yield run[0][0], run[0][0] - run[-1][1], text[run[0][0] : run[-1][1]]
            run = []


def _starts_sentence(text: str, position: int) -> bool:
    """Whether only opening quotes and spaces separate ``position`` from a sentence end."""
    head = text[max(0, position - 64) : position].rstrip(" \t\"'“‘([「『")
    if not head:
        return position <= 64
    return head[-1] in ".!?;:\n。！？；："


def _non_overlapping(spans: Iterator[_Span]) -> Iterator[str]:
    """Greedy in order (by start, longest first): drop spans overlapping one already kept."""
    kept_end = -1
    for start, shorter, entity in spans:
        if start >= kept_end:
            kept_end = start - shorter
            yield entity
