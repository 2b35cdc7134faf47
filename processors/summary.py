"""The default episode summariser: extractive, deterministic, English and Chinese.

It picks whole sentences of the episode, so it invents nothing, and it is a pure
function of the turns and :class:`~processors.state.ScoringParams`: a replay
summarises every episode exactly as the first run did. Its name is recorded in
``episode.closed`` (``summariser``) so a later model-made summary is told apart.
"""

from __future__ import annotations

import math
import re
from bisect import bisect
from collections.abc import Callable, Sequence
from itertools import compress, pairwise
from typing import Final

from processors.memo import Memo
from processors.scoring import CJK, DEFAULT_PARAMS, score_text, tokenize
from processors.sentences import iter_sentences as iter_sentences  # re-exported
from processors.sentences import remembered_sentences_and_gaps
from processors.sentences import split_sentences as split_sentences  # re-exported
from processors.state import ScoringParams

SUMMARISER_NAME = "extractive-v1"

_WIDE = re.compile(f"[{CJK}\u3000-\u303f\uff01-\uff0f\uff1a-\uff1f\u201c\u201d]")
_CJK_PAIR = re.compile(f"[{CJK}]{{2}}$")
_ELLIPSIS = "…"

_ENGLISH_STOPWORDS = frozenset(
    {
        "a", "an", "the", "and", "or", "but", "if", "then", "so", "of", "to", "in", "on", "at",
        "by", "for", "with", "from", "about", "as", "into", "over", "is", "are", "was", "were",
        "be", "been", "being", "am", "do", "does", "did", "have", "has", "had", "will", "would",
        "can", "could", "shall", "should", "may", "might", "must", "i", "me", "my", "mine", "we",
        "us", "our", "you", "your", "he", "him", "his", "she", "her", "it", "its", "they", "them",
        "their", "this", "that", "these", "those", "there", "here", "what", "which", "who", "whom",
        "when", "where", "why", "how", "not", "no", "yes", "ok", "okay", "sure", "thanks", "thank",
        "please", "hi", "hello", "hey", "oh", "ah", "well", "just", "also", "too", "very", "really",
        "all", "any", "some", "more", "most", "much", "many", "one", "it's", "i'm", "i'll", "i've",
        "don't", "let's", "got", "get"
    }
)  # fmt: skip
STOPWORDS = _ENGLISH_STOPWORDS | frozenset(
    "的了是我你他她它们在有和就不也都这那个吗呢吧啊呀哦嗯很还"
    "又要会能说去来到着过给让把被对与及或但而好一上下谢您哈"
)
"""Tokens that carry no topic: ignored when counting term frequencies. A CJK
bigram is ignored too when either of its characters is one of these."""


class _Sentence:
    """A sentence of an episode: where it is said, its text, terms and wide ends.

    A class of its own, not a named tuple: compiled, it is made and read natively
    (a named tuple's ``__new__`` is Python, its fields read by name)."""

    __slots__ = ("closes_wide", "opens_wide", "position", "terms", "text")

    def __init__(
        self, position: int, text: str, terms: frozenset[str], opens_wide: bool, closes_wide: bool
    ) -> None:
        self.position = position
        self.text = text
        self.terms = terms
        self.opens_wide = opens_wide
        """Whether the text starts with a wide character (see :func:`_join`)."""
        self.closes_wide = closes_wide
        """Whether it ends with one."""


def _sentence(position: int, piece: _Piece) -> _Sentence:
    """The sentence ``piece`` said at ``position``."""
    return _Sentence(position, piece[0], piece[1], piece[2], piece[3])


def summarise(
    turns: Sequence[tuple[str, str]],
    *,
    max_chars: int = 280,
    params: ScoringParams = DEFAULT_PARAMS,
) -> str:
    """An extractive summary of ``(role, content)`` turns, at most ``max_chars`` long.

    Each sentence scores ``summary_tf_weight`` · tf + ``summary_position_weight`` ·
    (1 − position / sentences) + ``summary_importance_weight`` · (importance − 1) / 9,
    where tf = Σ ln(frequency) over the sentence's distinct content tokens
    (:func:`tokenize` minus :data:`STOPWORDS`) / √(their number), a token's frequency
    being the number of distinct sentences of the episode that hold it (a sentence
    said again verbatim, like a stock reply, does not raise its own), scaled so
    the best sentence has 1, and importance comes from
    :func:`~processors.scoring.score_text`. Sentences without content tokens are
    left out unless nothing else is left. The best sentences are taken greedily
    (ties: earlier first), skipping any that would overflow ``max_chars`` or that
    repeat a chosen one (token Jaccard ≥ ``summary_redundancy``), then printed in
    their original order. If even the best sentence is too long, it is cut and ends
    with "…". Roles do not matter; empty input gives ``""``.
    """
    return summarise_texts([content for _, content in turns], max_chars=max_chars, params=params)


def summarise_texts(
    contents: Sequence[str], *, max_chars: int = 280, params: ScoringParams = DEFAULT_PARAMS
) -> str:
    """:func:`summarise` of turns whose contents are ``contents`` (roles do not matter):
    what the fold calls, without a ``(role, content)`` pair made a turn."""
    pieces = [piece for content in contents for piece in _pieces(content)]
    if not pieces or max_chars <= 0:
        return ""
    if _native_pick is not None:
        text, whole = _native_pick(pieces, max_chars, params, _importance)
    else:
        text, whole = reference_pick(pieces, max_chars, params)
    return text if whole else _truncate(text, max_chars)


def reference_pick(pieces: list[_Piece], max_chars: int, params: ScoringParams) -> tuple[str, bool]:
    """The sentences :func:`summarise` chooses among ``pieces`` (non-empty, the terms
    of each a function of its text; ``max_chars`` > 0), joined: ``(summary, True)``;
    or ``(best sentence, False)`` when none fits and the best is to be cut.

    ``processors._summary.pick`` (``processors/_summary.c``) does the same in C where
    it is built; this is its Python, which runs where it is not.
    """
    positions = _counted(pieces)
    count = positions[-1] + 1
    # a sentence said again scores less than its first saying (its position is later):
    # only first sayings can be chosen, but for a near fit (see _select)
    texts = [pieces[i][0] for i in positions]
    first = dict(zip(reversed(texts), reversed(positions), strict=True))
    firsts = [_sentence(i, pieces[i]) for i in sorted(first.values())]
    ranked = _ranked(firsts, params, count)
    redundancy = params.summary_redundancy
    chosen = _select(ranked, max_chars, redundancy, near_fits=len(first) < len(texts))
    if chosen is None:  # a first saying did not fit only by its gaps: read every saying
        ranked = _ranked([_sentence(i, pieces[i]) for i in positions], params, count)
        chosen = _select(ranked, max_chars, redundancy)
    if not chosen:
        return ranked[0].text, False
    return _join(chosen), True


def _importance(text: str, params: ScoringParams) -> float:
    """The importance of ``text`` (:func:`~processors.scoring.score_text`)."""
    return score_text(text, params).importance


def _counted(pieces: list[_Piece]) -> list[int]:
    """The positions of the sentences that count: those with content, or every one if
    none has (see :func:`summarise`)."""
    positions = list(compress(range(len(pieces)), [piece[1] for piece in pieces]))
    return positions or list(range(len(pieces)))


def _ranked(sentences: list[_Sentence], params: ScoringParams, count: int) -> list[_Sentence]:
    """``sentences`` best first (ties: earlier first), ``count`` sentences counting."""
    scores = _scores(sentences, params, count)
    return [s for _, _, s in sorted([(-scores[s.position], s.position, s) for s in sentences])]


def _sentences(turns: Sequence[tuple[str, str]]) -> list[_Sentence]:
    """Every sentence of every turn, numbered; contentless ones only if all are."""
    pieces = [piece for _, content in turns for piece in _pieces(content)]
    return [_sentence(i, pieces[i]) for i in _counted(pieces)] if pieces else []


_Piece = tuple[str, frozenset[str], bool, bool]
"""A :class:`_Sentence` but its position."""
_PIECES: Final[Memo[tuple[_Piece, ...]]] = Memo(size=16384, chars=1 << 22, longest=1 << 16)
"""The sentences of contents: a turn is summarised again with each compression of
working memory, at its episode's close (and its sentences, in its day's consolidation)."""
_TERMS: Final[Memo[frozenset[str]]] = Memo(size=65536, chars=1 << 22, longest=512)


def _pieces(content: str) -> tuple[_Piece, ...]:
    """The sentences of ``content`` (:func:`split_sentences`: the scorer's, remembered,
    :func:`~processors.sentences.remembered_sentences_and_gaps`) with their terms and
    wide ends, remembered (a pure function)."""
    found = _PIECES.get(content)
    if found is None:
        found = tuple(
            (text, _terms(text), _is_wide(text[0]), _is_wide(text[-1]))
            for text in remembered_sentences_and_gaps(content)[0]
        )
        _PIECES.put(content, found)
    return found


def _terms(text: str) -> frozenset[str]:
    """Distinct content tokens of ``text`` (remembered: a pure function)."""
    found = _TERMS.get(text)
    if found is None:
        tokens = set(tokenize(text))
        tokens -= STOPWORDS
        found = frozenset(t for t in tokens if len(t) != 2 or not _is_stop(t))
        _TERMS.put(text, found)
    return found


def _is_stop(token: str) -> bool:
    if token in STOPWORDS:
        return True
    return len(token) == 2 and bool(_CJK_PAIR.match(token)) and any(c in STOPWORDS for c in token)


def _scores(
    sentences: Sequence[_Sentence], params: ScoringParams, count: int | None = None
) -> dict[int, float]:
    """Position -> score of each sentence (see :func:`summarise`); ``count`` sentences
    count (by default, up to the last of ``sentences``): positions are scored against
    it. Each distinct text is scored once."""
    distinct = {s.text: s.terms for s in sentences}  # a repeated sentence is not a topic
    frequency: dict[str, int] = {}
    for terms in distinct.values():
        for term in terms:
            frequency[term] = frequency.get(term, 0) + 1
    logs = {term: _log(count) for term, count in frequency.items()}
    tf = {text: _tf(terms, logs) for text, terms in distinct.items()}
    top = max(tf.values()) or 1.0
    if count is None:
        count = sentences[-1].position + 1
    # the first and last terms of a score once per distinct text; each score is the
    # same floating-point operations in the same order as the formula's
    tf_weight, importance_weight = params.summary_tf_weight, params.summary_importance_weight
    topical = {text: tf_weight * tf[text] / top for text in distinct}
    weighty = {
        text: importance_weight * (score_text(text, params).importance - 1) / 9 for text in distinct
    }
    placed = params.summary_position_weight
    return {
        s.position: topical[s.text] + placed * (1 - s.position / count) + weighty[s.text]
        for s in sentences
    }


_LOGS = (0.0, *(math.log(count) for count in range(1, 1024)))
"""``math.log(count)`` of the frequencies below 1 024 (index 0 is never read)."""


def _log(count: int) -> float:
    """``math.log(count)``, ``count`` ≥ 1: read from :data:`_LOGS` when it holds it."""
    return _LOGS[count] if count < 1024 else math.log(count)


def _tf(terms: frozenset[str], logs: dict[str, float]) -> float:
    """Σ ln(frequency) over distinct terms / √(number of terms): 0 for unique words.

    ``logs`` holds ln(frequency) of every term.
    """
    if not terms:
        return 0.0
    return math.fsum(map(logs.__getitem__, terms)) / math.sqrt(len(terms))


def _position(sentence: _Sentence) -> int:
    return sentence.position


def _select(
    ranked: Sequence[_Sentence], max_chars: int, redundancy: float, *, near_fits: bool = False
) -> list[_Sentence] | None:
    """Greedy by rank: keep what fits in ``max_chars`` and is not a near repeat.

    The sentences kept are in their order; each candidate is put in its place among
    them and the length of their :func:`_join` updated by its gaps. With
    ``near_fits``, None when a candidate that fits with the narrowest join is left out
    by its gaps: a later saying of its text, placed elsewhere, might fit (only then
    may a saying that is not the first be chosen: a candidate left out for its length
    or as a repeat leaves its later sayings out too, the join only growing).
    """
    chosen: list[_Sentence] = []
    texts: set[str] = set()
    used = -1
    shortest = min(len(sentence.text) for sentence in ranked)
    for sentence in ranked:
        if shortest + used + 1 > max_chars:
            break  # no candidate fits even with the narrowest join
        if len(sentence.text) + used + 1 > max_chars:
            continue  # cannot fit even with the narrowest join
        if sentence.text in texts or _repeats(sentence.terms, chosen, redundancy):
            continue
        at = bisect(chosen, sentence.position, key=_position)
        length = max(used, 0) + len(sentence.text) + _gaps(chosen, at, sentence)
        if length <= max_chars:
            chosen.insert(at, sentence)
            texts.add(sentence.text)
            used = length
        elif near_fits:
            return None
    return chosen


def _repeats(terms: frozenset[str], chosen: Sequence[_Sentence], redundancy: float) -> bool:
    """Whether ``terms`` overlap those of a chosen sentence by Jaccard ≥ ``redundancy``
    (never when either has none)."""
    if not terms:
        return False
    size = len(terms)
    for other in chosen:
        if other.terms:
            shared = len(terms & other.terms)
            if shared / (size + len(other.terms) - shared) >= redundancy:
                return True
    return False


def _gaps(chosen: Sequence[_Sentence], at: int, sentence: _Sentence) -> int:
    """The characters that joining adds when ``sentence`` goes to ``chosen[at]``."""
    left = chosen[at - 1] if at else None
    right = chosen[at] if at < len(chosen) else None
    added = 0
    if left is not None:
        added += _gap(left, sentence)
    if right is not None:
        added += _gap(sentence, right)
        if left is not None:
            added -= _gap(left, right)
    return added


def _gap(left: _Sentence, right: _Sentence) -> int:
    """1 for the space between two sentences, 0 between two CJK sides."""
    return 0 if left.closes_wide and right.opens_wide else 1


def _join(sentences: Sequence[_Sentence]) -> str:
    """Sentences joined by a space, or by nothing between two CJK sides."""
    out = [sentences[0].text] if sentences else []
    for left, right in pairwise(sentences):
        out.append(f" {right.text}" if _gap(left, right) else right.text)
    return "".join(out)


def _is_wide(char: str) -> bool:
    """Whether ``char`` is CJK, or CJK or full-width punctuation (never ASCII); the
    regex's answer remembered by character (a match costs ten times a lookup)."""
    if char.isascii():
        return False
    wide = _WIDE_CHARS.get(char)
    if wide is None:
        if len(_WIDE_CHARS) >= 65536:
            _WIDE_CHARS.clear()
        wide = _WIDE_CHARS[char] = bool(_WIDE.match(char))
    return wide


_WIDE_CHARS: Final[dict[str, bool]] = {}
""":func:`_is_wide` of the characters met (bounded: cleared when full)."""


def _truncate(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` with a final "…", at a space when one is near."""
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars - 1]
    space = cut.rfind(" ")
    if space > max_chars // 2:
        cut = cut[:space]
    return cut.rstrip() + _ELLIPSIS


_native_pick: (
    Callable[
        [list[_Piece], int, ScoringParams, Callable[[str, ScoringParams], float]],
        tuple[str, bool],
    ]
    | None
)
try:
    from processors._summary import pick as _native_pick
except ImportError:  # installed without compiling (ENGRAM_PURE_PYTHON=1)
    _native_pick = None
