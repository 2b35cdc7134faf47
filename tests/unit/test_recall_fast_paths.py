"""The fast tokenizer and BM25 weights give exactly what the plain definitions give.

The reference below is the implementation :mod:`processors.recall` had before its
fast paths (one regex with an alternation per word character, a generator of
terms, every term sorted before it is hashed). The sparse vectors already stored
were made by it, so the fast one must agree with it term for term and bit for bit.
"""

from __future__ import annotations

import re
import struct
import sys
import unicodedata
from collections import Counter
from collections.abc import Iterator, Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processors import recall
from processors.recall import (
    CJK,
    ENGLISH_STOPWORDS,
    SparseVector,
    _cjk_terms,
    _mark_code_points,
    _unclitic,
    document_sparse,
    normalise,
    query_sparse,
    stem,
    tokenize,
)

# --- the reference ------------------------------------------------------------------
# (the CJK runs' terms, the clitics and the combining marks are the module's own: the
# fast paths left them)

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\uff07": "'"})

_MARKS = "".join(re.escape(chr(c)) for c in _mark_code_points())
REFERENCE_CHAR = rf"(?:[^\W_{CJK}]|[{_MARKS}])"
REFERENCE_PATTERN = re.compile(
    rf"(?P<cjk>[{CJK}]+)|(?P<num>\d+(?:[.,]\d+)+)|(?P<word>{REFERENCE_CHAR}+(?:'{REFERENCE_CHAR}+)*)"
)


def reference_normalise(text: str) -> str:
    if text.isascii():
        return text.lower()
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return folded.translate(_APOSTROPHES)


def reference_terms(text: str, *, cjk_unigrams: bool) -> Iterator[tuple[str, bool]]:
    for match in REFERENCE_PATTERN.finditer(reference_normalise(text)):
        if match.lastgroup == "cjk":
            yield from _cjk_terms(match.group(), unigrams=cjk_unigrams)
        elif match.lastgroup == "num":
            yield match.group(), False
        else:
            word = _unclitic(match.group())
            if word not in ENGLISH_STOPWORDS:
                yield stem(word), False


def reference_tokenize(text: str, *, cjk_unigrams: bool = False) -> list[str]:
    return [term for term, _ in reference_terms(text, cjk_unigrams=cjk_unigrams)]


def reference_document_sparse(
    text: str, *, k1: float = 1.2, b: float = 0.75, avg_len: float = 32.0
) -> SparseVector:
    terms = list(reference_terms(text, cjk_unigrams=True))
    length = sum(1 for _, extra in terms if not extra)
    norm = k1 * (1.0 - b + b * length / avg_len)
    tf = Counter(term for term, _ in terms)
    return _reference_vector({term: n * (k1 + 1.0) / (n + norm) for term, n in tf.items()})


def reference_query_sparse(text: str) -> SparseVector:
    return _reference_vector(dict.fromkeys(reference_tokenize(text), 1.0))


def _reference_vector(weights: Mapping[str, float]) -> SparseVector:
    merged: dict[int, float] = {}
    for term in sorted(weights):
        index = recall.term_index(term)  # looked up at call time, as the fast path does
        merged[index] = merged.get(index, 0.0) + weights[term]
    indices = sorted(merged)
    return indices, [merged[i] for i in indices]


def bits(vector: SparseVector) -> tuple[list[int], list[bytes]]:
    """A sparse vector with its values as their IEEE 754 bytes: equal means bit for bit."""
    return vector[0], [struct.pack("<d", value) for value in vector[1]]


# --- texts ----------------------------------------------------------------------------

PIECES = st.one_of(
    st.sampled_from([" ", "  ", ", ", ".", "。", "，", "！", "?", "'", "’", "‘", "ʼ", "＇"]),
    st.sampled_from(["_", "\n", "-", "\t", "\u3000"]),
    st.sampled_from(["don't", "Alice's", "we'll", "o'neill", "rock'n'roll", "'tis", "cats'"]),
    st.sampled_from(["3.5", "1,000", "14:30", "2024-06-01", "v1.2.3", "12,5.7", "٣.٥", "１２３"]),
    st.sampled_from(["running", "Stopped", "STUDIES", "the", "and", "I", "boxes", "ﬁne"]),
    st.sampled_from(["上海天气", "我喜欢茶", "的", "下周三下午3点半要开会", "カタカナ", "ｶﾀｶﾅ"]),
    st.sampled_from(["한국어", "नमस्ते", "مرحبا", "café", "cafe\u0301", "Ｈｅｌｌｏ", "Straße"]),
    st.sampled_from(["𠀀𠀁", "𝐀𝐁𝐂", "x\u20dd"]),
    st.sampled_from(["😀", "👍🏽", "🇯🇵", "❤️", "test😀case", "a😀b", "\U000e0041", "\u200d"]),
    st.text(max_size=12),
    st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x4FFF), max_size=6),
    st.text(alphabet=st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF), max_size=3),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=8),
)
TEXTS = st.one_of(st.text(max_size=200), st.lists(PIECES, max_size=40).map("".join))


# --- the same answers -------------------------------------------------------------------


@pytest.fixture(autouse=True, scope="module")
def _patterns_built() -> None:
    """Build the token patterns (~0.1 s, more on a busy machine) before the property
    tests, so that their first example does not run into Hypothesis's deadline."""
    recall._token_patterns()


def test_a_word_character_is_what_it_was_at_every_code_point() -> None:
    codes = [c for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    every = "".join(map(chr, codes))
    fast = {c for start, stop in recall._word_ranges() for c in range(start, stop + 1)}
    plain = {ord(char) for char in "".join(re.findall(f"{REFERENCE_CHAR}+", every))}
    assert fast == plain


@given(TEXTS)
def test_normalise_is_what_it_was(text: str) -> None:
    assert normalise(text) == reference_normalise(text)


@given(TEXTS)
def test_tokens_are_what_they_were(text: str) -> None:
    assert tokenize(text) == reference_tokenize(text)
    assert tokenize(text, cjk_unigrams=True) == reference_tokenize(text, cjk_unigrams=True)


@given(TEXTS)
def test_document_and_query_vectors_are_what_they_were_bit_for_bit(text: str) -> None:
    assert bits(document_sparse(text)) == bits(reference_document_sparse(text))
    assert bits(query_sparse(text)) == bits(reference_query_sparse(text))


@given(
    TEXTS,
    st.floats(0, 3),
    st.floats(0, 1),
    st.floats(0.5, 500),
)
def test_other_bm25_parameters_give_what_they_gave(
    text: str, k1: float, b: float, avg_len: float
) -> None:
    fast = document_sparse(text, k1=k1, b=b, avg_len=avg_len)
    assert bits(fast) == bits(reference_document_sparse(text, k1=k1, b=b, avg_len=avg_len))


@given(TEXTS)
def test_colliding_terms_are_summed_as_they_were(text: str) -> None:
    index = recall.term_index
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(recall, "term_index", lambda term: index(term) % 5)
        assert bits(document_sparse(text)) == bits(reference_document_sparse(text))
        assert bits(query_sparse(text)) == bits(reference_query_sparse(text))


@given(st.lists(PIECES, max_size=40).map("".join))
def test_the_basic_plane_pattern_agrees_with_the_full_one(text: str) -> None:
    basic_only = "".join(char for char in normalise(text) if ord(char) <= 0xFFFF)
    full, basic = recall._token_patterns()
    assert basic.findall(basic_only) == full.findall(basic_only)
