"""Sentences of a text, English and Chinese: one splitter for the scorer and the summariser.

The summariser picks whole sentences; the scorer scores a text sentence by sentence
(:func:`processors.scoring.analysis`), so a sentence met again, alone or in another
text, is not read again. Both cut where :func:`split_sentences` cuts.

:func:`split_sentences` and :func:`sentences_and_gaps` run in C where the extension
``processors._text`` is built (``processors/_text.c``, beside the mypyc ones: one pass a
text, where the regex split and a list operation a piece took 38k of the 245k
instructions an event of the processors bench's rich workload, 8k in C);
:func:`reference_split_sentences` and :func:`reference_sentences_and_gaps` are their
Python, which runs where it is not (``ENGRAM_PURE_PYTHON=1``).
``tests/unit/test_text_native.py`` holds the two to each other.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Final

from processors.memo import Memo

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
    line breaks. Empty pieces are dropped. A new list each call.
    """
    if _native_split is not None:
        return _native_split(text)
    return reference_split_sentences(text)


def sentences_and_gaps(text: str) -> tuple[list[str], list[str]]:
    """``(split_sentences(text), gaps)``: ``gaps[i]`` is the text before sentence ``i``
    and after the one before it (whitespace only, maybe empty; ``gaps[0]`` is what
    precedes the first sentence), so that ``text`` is the gaps and sentences
    interleaved, then the whitespace after the last sentence. New lists each call."""
    if _native_gaps is not None:
        return _native_gaps(text)
    return reference_sentences_and_gaps(text)


def remembered_sentences_and_gaps(text: str) -> tuple[list[str], list[str]]:
    """:func:`sentences_and_gaps`, remembered by text (a pure function): the scorer
    reads a turn's text as it comes (:func:`~processors.scoring.analysis`), the
    summariser cuts the same text into its sentences when its episode closes or its
    working memory is compressed. The lists are shared: they must not be changed."""
    found = _SPLITS.get(text)
    if found is None:
        found = sentences_and_gaps(text)
        _SPLITS.put(text, found)
    return found


_SPLITS: Final[Memo[tuple[list[str], list[str]]]] = Memo(size=16384, chars=1 << 22, longest=1 << 16)
"""The sentences and gaps of texts, the oldest forgotten first."""


def reference_split_sentences(text: str) -> list[str]:
    """:func:`split_sentences` in Python."""
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


def reference_sentences_and_gaps(text: str) -> tuple[list[str], list[str]]:
    """:func:`sentences_and_gaps` in Python."""
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


_native_split: Callable[[str], list[str]] | None
_native_gaps: Callable[[str], tuple[list[str], list[str]]] | None
try:
    from processors._text import sentences_and_gaps as _native_gaps
    from processors._text import split_sentences as _native_split
except ImportError:  # installed without compiling (ENGRAM_PURE_PYTHON=1)
    _native_split = _native_gaps = None
