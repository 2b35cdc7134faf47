"""``processors._text``: the C extension that cuts a text into its sentences and counts
its estimated tokens gives what its Python references (``processors.sentences``,
``processors.working``) give, on any text."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors import sentences, working
from processors.sentences import (
    iter_sentences,
    reference_sentences_and_gaps,
    reference_split_sentences,
    sentences_and_gaps,
    split_sentences,
)
from processors.working import estimate_tokens, reference_estimate_tokens

PURE = os.environ.get("ENGRAM_PURE_PYTHON") == "1"
pytestmark = pytest.mark.skipif(PURE, reason="ENGRAM_PURE_PYTHON=1: no C extension built")

ENDS = "。！？；!?….\n"
HOLDS = "」』”’\"')）]"
SPACES = " \t\r\f\v\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2028\u2029\u202f\u205f\u3000"
"""Every kind of whitespace ``str.isspace`` sees, beside the usual ones."""
NEAR = "3a好,;:-(\u200b\ufeff😀\U00020000"
"""Characters that are none of the above (a zero-width space is not whitespace)."""

MARKED = st.lists(
    st.one_of(
        st.sampled_from(list(ENDS + HOLDS + SPACES + NEAR)),
        st.sampled_from(["...", "v1.2", "3.5", " \n ", "\r\n", "Mr. X", "好。", "!?", "。」"]),
        st.text(max_size=4),
    ),
    max_size=40,
).map("".join)
TEXTS = st.one_of(MARKED, st.text(max_size=200))


@given(TEXTS)
@settings(max_examples=600)
def test_the_c_split_is_the_reference(text: str) -> None:
    assert split_sentences(text) == reference_split_sentences(text)
    assert list(iter_sentences(text)) == reference_split_sentences(text)


@given(TEXTS)
@settings(max_examples=600)
def test_the_c_sentences_and_gaps_are_the_reference(text: str) -> None:
    assert sentences_and_gaps(text) == reference_sentences_and_gaps(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ([], [])),
        ("   ", ([], [])),
        ("Hi.  Then\n\n  more!」 Done…", (["Hi.", "Then", "more!」 Done…"], ["", "  ", "\n\n  "])),
        ("好。好！！对？", (["好。", "好！！", "对？"], ["", "", ""])),
        ("v1.2 is 3.5. Next", (["v1.2 is 3.5.", "Next"], ["", " "])),
        ("end.\u3000next", (["end.", "next"], ["", "\u3000"])),
        ("Go!] Now", (["Go!] Now"], [""])),
        ("wide\U00020000!x", (["wide\U00020000!", "x"], ["", ""])),
    ],
)
def test_examples(text: str, expected: tuple[list[str], list[str]]) -> None:
    assert sentences_and_gaps(text) == expected == reference_sentences_and_gaps(text)
    assert split_sentences(text) == expected[0]


def test_the_c_functions_are_the_ones_called() -> None:
    """Where the extension is built, the module's functions call it (not the reference)."""
    assert sentences._native_split is not None and sentences._native_gaps is not None
    assert sentences._native_split.__module__ == "processors._text"
    assert working._native_tokens is not None
    assert working._native_tokens.__module__ == "processors._text"


def test_the_c_tokens_are_the_reference_on_every_code_point() -> None:
    """Every code point (surrogates too), four times over, counts as the reference
    counts it (4 tokens if it is of :data:`~processors.working.CJK`, else 1); and in
    runs of 4 096 different ones."""
    wrong = [
        hex(point)
        for point in range(0x110000)
        if estimate_tokens(chr(point) * 4) != reference_estimate_tokens(chr(point) * 4)
    ]
    assert not wrong
    for start in range(0, 0x110000, 4096):
        text = "".join(map(chr, range(start, min(start + 4096, 0x110000))))
        assert estimate_tokens(text) == reference_estimate_tokens(text), hex(start)
        # the same characters in a four-byte string (one astral character makes it one)
        wider = text + "\U0001f600"
        assert estimate_tokens(wider) == reference_estimate_tokens(wider), hex(start)


@pytest.mark.parametrize("length", [32767, 32768, 32769, 65535, 65536, 65537, 200_003])
def test_the_c_tokens_count_long_wide_texts(length: int) -> None:
    """Two-byte texts are counted in chunks of 16-bit counts: texts of only wide
    characters around and beyond the chunk's and the count's limits."""
    for text in ("我" * length, ("我" * 3 + "a") * (length // 4) + "ä"):
        assert estimate_tokens(text) == reference_estimate_tokens(text)
    assert estimate_tokens("我" * length) == length


@given(TEXTS)
def test_the_c_tokens_are_the_reference(text: str) -> None:
    assert estimate_tokens(text) == reference_estimate_tokens(text)


NATIVE: list[Callable[[str], object]] = []
if not PURE:
    from processors import _text

    NATIVE = [_text.split_sentences, _text.sentences_and_gaps, _text.estimate_tokens]


@pytest.mark.parametrize("function", NATIVE, ids=lambda f: getattr(f, "__name__", "?"))
def test_a_text_is_required(function: Callable[[object], object]) -> None:
    with pytest.raises(TypeError, match="takes a str, not bytes"):
        function(b"Hi. There")


@pytest.mark.parametrize("function", NATIVE, ids=lambda f: getattr(f, "__name__", "?"))
def test_no_reference_is_leaked(function: Callable[[str], object]) -> None:
    text = "One. Two! 三。 " * 20
    before = sys.getrefcount(text)
    for _ in range(100):
        function(text)
    assert sys.getrefcount(text) == before
