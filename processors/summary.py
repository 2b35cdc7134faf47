"""The default episode summariser: extractive, deterministic, English and Chinese.

It picks whole sentences of the episode, so it invents nothing, and it is a pure
function of the turns and :class:`~processors.scoring.ScoringParams`: a replay
summarises every episode exactly as the first run did. Its name is recorded in
``episode.closed`` (``summariser``) so a later model-made summary is told apart.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from processors.scoring import CJK, DEFAULT_PARAMS, ScoringParams, score_text, tokenize

SUMMARISER_NAME = "extractive-v1"

_BREAK = re.compile(
    r"(?<=[。！？；!?…])(?![。！？；!?…」』”’\"')）\]])\s*"  # after CJK or ! ? marks
    r"|(?<=\.)(?![.\d])\s+"  # after a full stop followed by space
    r"|\s*\n\s*"  # at line breaks
)
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


@dataclass(frozen=True)
class _Sentence:
    position: int
    text: str
    terms: frozenset[str]


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``, stripped, in order, punctuation kept.

    Boundaries: after ``。！？；!?…`` (closing quotes and repeated marks stay
    attached), after ``.`` followed by a space (so ``3.5`` and ``v1.2`` hold), and at
    line breaks. Empty pieces are dropped.
    """
    return [piece.strip() for piece in _BREAK.split(text) if piece and piece.strip()]


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
    sentences = _sentences(turns)
    if not sentences or max_chars <= 0:
        return ""
    scores = _scores(sentences, params)
    ranked = sorted(sentences, key=lambda s: (-scores[s.position], s.position))
    chosen = _select(ranked, max_chars, params.summary_redundancy)
    if not chosen:
        return _truncate(ranked[0].text, max_chars)
    return _join([s.text for s in sorted(chosen, key=lambda s: s.position)])


def _sentences(turns: Sequence[tuple[str, str]]) -> list[_Sentence]:
    """Every sentence of every turn, numbered; contentless ones only if all are."""
    texts = [sentence for _, content in turns for sentence in split_sentences(content)]
    found = [_Sentence(i, text, _terms(text)) for i, text in enumerate(texts)]
    with_content = [s for s in found if s.terms]
    return with_content or found


_TERMS: dict[str, frozenset[str]] = {}
"""Sentence -> :func:`_terms`: a sentence is summarised again with each compression of
working memory, at its episode's close and in its day's consolidation."""
_TERMS_SIZE = 4096
_TERMS_CHARS = 512


def _terms(text: str) -> frozenset[str]:
    """Distinct content tokens of ``text`` (remembered for short texts: a pure function)."""
    found = _TERMS.get(text)
    if found is None:
        tokens = set(tokenize(text))
        tokens -= STOPWORDS
        found = frozenset(t for t in tokens if len(t) != 2 or not _is_stop(t))
        if len(text) <= _TERMS_CHARS:
            if len(_TERMS) >= _TERMS_SIZE:
                _TERMS.clear()
            _TERMS[text] = found
    return found


def _is_stop(token: str) -> bool:
    if token in STOPWORDS:
        return True
    return len(token) == 2 and bool(_CJK_PAIR.match(token)) and any(c in STOPWORDS for c in token)


def _scores(sentences: Sequence[_Sentence], params: ScoringParams) -> dict[int, float]:
    """Position -> score of each sentence (see :func:`summarise`)."""
    distinct = {s.text: s.terms for s in sentences}  # a repeated sentence is not a topic
    frequency = Counter(term for terms in distinct.values() for term in terms)
    tf = {s.position: _tf(s.terms, frequency) for s in sentences}
    top = max(tf.values()) or 1.0
    count = sentences[-1].position + 1
    return {
        s.position: params.summary_tf_weight * tf[s.position] / top
        + params.summary_position_weight * (1 - s.position / count)
        + params.summary_importance_weight * (score_text(s.text, params).importance - 1) / 9
        for s in sentences
    }


def _tf(terms: frozenset[str], frequency: Counter[str]) -> float:
    """Σ ln(frequency) over distinct terms / √(number of terms): 0 for unique words."""
    if not terms:
        return 0.0
    return math.fsum(math.log(frequency[t]) for t in terms) / math.sqrt(len(terms))


def _select(ranked: Sequence[_Sentence], max_chars: int, redundancy: float) -> list[_Sentence]:
    """Greedy by rank: keep what fits in ``max_chars`` and is not a near repeat."""
    chosen: list[_Sentence] = []
    used = -1
    for sentence in ranked:
        if len(sentence.text) + used + 1 > max_chars:
            continue  # cannot fit even with the narrowest join
        if any(_repeats(sentence, c, redundancy) for c in chosen):
            continue
        candidate = sorted([*chosen, sentence], key=lambda s: s.position)
        length = len(_join([s.text for s in candidate]))
        if length <= max_chars:
            chosen, used = candidate, length
    return chosen


def _repeats(a: _Sentence, b: _Sentence, redundancy: float) -> bool:
    """Same text, or content tokens overlapping by Jaccard ≥ ``redundancy``."""
    if a.text == b.text:
        return True
    if not a.terms or not b.terms:
        return False
    return len(a.terms & b.terms) / len(a.terms | b.terms) >= redundancy


def _join(texts: Sequence[str]) -> str:
    """Sentences joined by a space, or by nothing between two CJK sides."""
    out = ""
    for text in texts:
        wide = bool(out) and bool(_WIDE.match(out[-1])) and bool(_WIDE.match(text[0]))
        out += text if wide or not out else " " + text
    return out


def _truncate(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` with a final "…", at a space when one is near."""
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars - 1]
    space = cut.rfind(" ")
    if space > max_chars // 2:
        cut = cut[:space]
    return cut.rstrip() + _ELLIPSIS
