"""Sentences of a text, English and Chinese: one splitter for the scorer and the summariser.

The summariser picks whole sentences; the scorer scores a text sentence by sentence
(:func:`processors.scoring.analysis`), so a sentence met again, alone or in another
text, is not read again. Both cut where :func:`split_sentences` cuts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_BREAK = re.compile(
    r"([。！？；!?….\n]"  # first the class, so that the regex engine skips to it
    r"(?:(?<=[。！？；!?…])(?![。！？；!?…」』”’\"')）\]])"  # a mark, not repeated or quoted
    r"|(?<=\.)(?=\s)"  # a full stop followed by space
    r"|(?<=\n)))"  # a line break
)
"""The last character of a sentence (a sentence may end with the text too)."""


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``, stripped, in order, punctuation kept.

    Boundaries: after ``。！？；!?…`` (closing quotes and repeated marks stay
    attached), after ``.`` followed by a space (so ``3.5`` and ``v1.2`` hold), and at
    line breaks. Empty pieces are dropped.
    """
    parts = _BREAK.split(text)  # text, end, text, end, ..., text
    parts.append("")
    return [s for s in map(str.strip, map(str.__add__, parts[::2], parts[1::2])) if s]


def iter_sentences(text: str) -> Iterator[str]:
    """:func:`split_sentences`, one at a time: ``text`` is read only as far as asked."""
    start = 0
    for end in _BREAK.finditer(text):
        if sentence := text[start : end.end()].strip():
            yield sentence
        start = end.end()
    if sentence := text[start:].strip():
        yield sentence


def sentences_and_gaps(text: str) -> tuple[list[str], list[str]]:
    """``(split_sentences(text), gaps)``: ``gaps[i]`` is the text before sentence ``i``
    and after the one before it (whitespace only, maybe empty; ``gaps[0]`` is what
    precedes the first sentence), so that ``text`` is the gaps and sentences
    interleaved, then the whitespace after the last sentence."""
    parts = _BREAK.split(text)  # text, end, text, end, ..., text
    parts.append("")
    pieces = list(map(str.__add__, parts[::2], parts[1::2]))
    if "\n" in text:
        return _with_line_breaks(pieces)
    # each piece but the last ends with its mark: only the last may be blank, and
    # only the first characters of a piece may be whitespace
    sentences = list(map(str.strip, pieces))
    if not sentences[-1]:
        del sentences[-1], pieces[-1]
    return sentences, [piece[: len(piece) - len(piece.lstrip())] for piece in pieces]


def _with_line_breaks(pieces: list[str]) -> tuple[list[str], list[str]]:
    """:func:`sentences_and_gaps` of the text cut into ``pieces`` (each a sentence and
    the whitespace around it, or whitespace only), for any text."""
    sentences: list[str] = []
    gaps: list[str] = []
    gap = ""
    for piece in pieces:
        sentence = piece.strip()
        if not sentence:
            gap += piece
            continue
        head = piece.find(sentence)  # the first non-space: its leading whitespace ends
        gaps.append(gap + piece[:head])
        sentences.append(sentence)
        gap = piece[head + len(sentence) :]
    return sentences, gaps
