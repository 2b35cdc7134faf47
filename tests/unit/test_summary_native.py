"""``processors._summary``: the C extension that ranks and chooses an episode's
sentences gives what its Python reference (``processors.summary.reference_pick``)
gives, on drawn pieces and on the pieces of drawn turns, and refuses what it cannot
read with a clear error."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors import summary
from processors.scoring import DEFAULT_PARAMS
from processors.state import ScoringParams
from processors.summary import _importance, _Piece, _pieces, reference_pick

PURE = os.environ.get("ENGRAM_PURE_PYTHON") == "1"
pytestmark = pytest.mark.skipif(PURE, reason="ENGRAM_PURE_PYTHON=1: no C extension built")

if not PURE:
    from processors._summary import pick

TERMS = st.frozensets(st.sampled_from(["kyoto", "april", "peanut", "jazz", "hotel", "京都"]))
SAYINGS = st.lists(
    st.tuples(
        st.text(alphabet="ab 好。", min_size=1, max_size=40),
        TERMS,
        st.booleans(),
        st.booleans(),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda saying: saying[0],
)
"""Distinct texts, each with its terms (a function of the text) and wide ends."""
WEIGHT = st.floats(min_value=0.0, max_value=3.0)
PARAMS = st.builds(
    ScoringParams,
    summary_tf_weight=WEIGHT,
    summary_position_weight=WEIGHT,
    summary_importance_weight=WEIGHT,
    summary_redundancy=st.floats(min_value=0.01, max_value=1.0),
)


@st.composite
def episodes(draw: st.DrawFn) -> list[_Piece]:
    """Pieces of an episode: its sayings, some said again (as stock replies are)."""
    sayings = draw(SAYINGS)
    order = draw(st.lists(st.integers(0, len(sayings) - 1), min_size=1, max_size=30))
    return [sayings[i] for i in order]


@given(episodes(), st.integers(1, 200), PARAMS)
@settings(max_examples=800)
def test_the_c_choice_is_the_reference(
    pieces: list[_Piece], max_chars: int, params: ScoringParams
) -> None:
    assert pick(pieces, max_chars, params, _importance) == reference_pick(pieces, max_chars, params)


SENTENCE = st.sampled_from(
    [
        "I want to visit Kyoto in April.",
        "Remember that I am allergic to peanuts!",
        "ok.",
        "Thanks.",
        "我对花生过敏，千万记住！",
        "好的。",
        "京都的酒店订好了。",
        "Book a hotel near Kyoto station for April?",
        "The jazz bar near the hotel opens at nine.",
    ]
)
TURNS = st.lists(st.lists(SENTENCE, min_size=1, max_size=4).map(" ".join), max_size=12)


@given(TURNS, st.integers(1, 400), PARAMS)
@settings(max_examples=400)
def test_the_c_choice_is_the_reference_on_turns(
    turns: list[str], max_chars: int, params: ScoringParams
) -> None:
    pieces = [piece for content in turns for piece in _pieces(content)]
    if pieces:
        assert pick(pieces, max_chars, params, _importance) == reference_pick(
            pieces, max_chars, params
        )


def test_summarise_runs_the_c_choice() -> None:
    assert summary._native_pick is pick


def test_a_near_fit_reads_every_saying_in_c() -> None:
    # "Hi." first said where its join would cost a space, again where it would not
    pieces: list[_Piece] = [
        ("Hi.", frozenset({"hi"}), False, False),
        ("好。", frozenset({"好"}), True, True),
        ("你好。", frozenset({"你"}), True, True),
        ("Hi.", frozenset({"hi"}), False, False),
    ]
    for max_chars in range(1, 12):
        assert pick(pieces, max_chars, DEFAULT_PARAMS, _importance) == reference_pick(
            pieces, max_chars, DEFAULT_PARAMS
        )


def test_the_best_sentence_is_given_to_be_cut_when_none_fits() -> None:
    pieces: list[_Piece] = [("A long sentence about Kyoto.", frozenset({"kyoto"}), False, False)]
    assert pick(pieces, 5, DEFAULT_PARAMS, _importance) == ("A long sentence about Kyoto.", False)


@pytest.mark.parametrize(
    ("pieces", "max_chars", "error", "message"),
    [
        ([], 10, ValueError, "no pieces"),
        ([("a", frozenset(), False, False)], 0, ValueError, "max_chars is above 0"),
        ([("a", frozenset())], 10, TypeError, "a piece is a tuple"),
        ([("a", {"x"}, False, False)], 10, TypeError, "its terms a frozenset"),
        ([(b"a", frozenset(), False, False)], 10, TypeError, "a piece's text is a str"),
        ([("a", frozenset({1}), False, False)], 10, TypeError, "a piece's terms are str"),
        ([("", frozenset(), False, False)], 10, ValueError, "a piece's text is not empty"),
    ],
)
def test_what_cannot_be_read_is_refused(
    pieces: list[Any], max_chars: int, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        pick(pieces, max_chars, DEFAULT_PARAMS, _importance)


def test_an_importance_that_fails_fails_the_call() -> None:
    def broken(text: str, params: ScoringParams) -> float:
        raise RuntimeError("no importance for " + text)

    pieces: list[_Piece] = [("Kyoto.", frozenset({"kyoto"}), False, False)]
    with pytest.raises(RuntimeError, match=r"no importance for Kyoto\."):
        pick(pieces, 10, DEFAULT_PARAMS, broken)


def test_a_limit_beyond_any_size_is_no_limit() -> None:
    pieces: list[_Piece] = [
        ("Kyoto in April.", frozenset({"kyoto", "april"}), False, False),
        ("Peanuts!", frozenset({"peanut"}), False, False),
    ]
    assert pick(pieces, 10**30, DEFAULT_PARAMS, _importance) == reference_pick(
        pieces, 10**30, DEFAULT_PARAMS
    )
