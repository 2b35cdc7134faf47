"""The default extractive summariser: informative, short, in order, stable."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processors.scoring import DEFAULT_PARAMS
from processors.sentences import remembered_sentences_and_gaps, sentences_and_gaps
from processors.state import ScoringParams
from processors.summary import (
    _WIDE,
    SUMMARISER_NAME,
    _log,
    _scores,
    _select,
    _Sentence,
    _sentences,
    _truncate,
    iter_sentences,
    split_sentences,
    summarise,
)

ENGLISH = [
    ("user", "Hi there."),
    ("assistant", "Hello! How can I help you today?"),
    ("user", "Remember that I am allergic to peanuts. Also I like jazz."),
    ("assistant", "Got it, I will remember that you are allergic to peanuts."),
    ("user", "ok thanks"),
]
CHINESE = [
    ("user", "你好。"),
    ("assistant", "你好！有什么可以帮你？"),
    ("user", "我下周要去京都旅行，帮我订京都的酒店。我对花生过敏，千万记住！"),
    ("assistant", "好的，我会帮你预订京都的酒店，并记住你对花生过敏。"),
    ("user", "谢谢"),
]
MIXED = [
    ("user", "I'm planning a trip to 京都 next week."),
    ("assistant", "好的！京都 is beautiful in autumn. 你想住哪里？"),
    ("user", "Somewhere near 京都站, my budget is ¥20000 per night."),
]
TRIP = [
    ("user", "I want to plan a trip to Kyoto in April."),
    ("assistant", "Kyoto in April has cherry blossoms."),
    ("user", "Book a hotel in Kyoto near the station for the April trip."),
    ("assistant", "Sure."),
    ("user", "The weather was nice yesterday."),
]
ROLES = st.sampled_from(["user", "assistant", "system", "tool"])
CONTENT = st.one_of(
    st.text(max_size=120),
    st.lists(
        st.sampled_from(
            ["我对花生过敏", "记住", "Kyoto", "remember", "。", "！", ". ", "?", "好的", "ok"]
        ),
        max_size=15,
    ).map("".join),
)
TURNS = st.lists(st.tuples(ROLES, CONTENT), max_size=8)


def _in_source_order(summary: str, turns: list[tuple[str, str]]) -> bool:
    source = " ".join(content for _, content in turns)
    positions = [source.find(s) for s in split_sentences(summary)]
    return all(p >= 0 for p in positions) and positions == sorted(positions)


def test_the_name_recorded_in_episode_closed() -> None:
    assert SUMMARISER_NAME == "extractive-v1"


def test_a_tight_budget_keeps_the_informative_sentence() -> None:
    assert summarise(ENGLISH, max_chars=40) == "Remember that I am allergic to peanuts."
    assert summarise(CHINESE, max_chars=20) == "我对花生过敏，千万记住！"


def test_greetings_and_acknowledgements_are_left_out() -> None:
    summary = summarise(ENGLISH)
    assert "Remember that I am allergic to peanuts." in summary
    assert "Hi there" not in summary
    assert "ok thanks" not in summary
    assert "你好。" not in summarise(CHINESE)
    assert not summarise(CHINESE).endswith("谢谢")


def test_a_near_repeat_is_not_picked_twice() -> None:
    summary = summarise(ENGLISH)
    assert "Got it, I will remember that you are allergic to peanuts." not in summary


def test_sentences_on_the_episode_topic_win() -> None:
    assert summarise(TRIP, max_chars=50) == "I want to plan a trip to Kyoto in April."
    assert "weather" not in summarise(TRIP, max_chars=80)


@pytest.mark.parametrize("turns", [ENGLISH, CHINESE, MIXED, TRIP])
@pytest.mark.parametrize("max_chars", [1, 10, 30, 60, 120, 280, 1000])
def test_budget_and_order_hold(turns: list[tuple[str, str]], max_chars: int) -> None:
    summary = summarise(turns, max_chars=max_chars)
    assert 0 < len(summary) <= max_chars
    assert summary.endswith("…") or _in_source_order(summary, turns)


def test_chinese_sentences_are_joined_without_spaces() -> None:
    summary = summarise(CHINESE, max_chars=40)
    assert summary == "我对花生过敏，千万记住！好的，我会帮你预订京都的酒店，并记住你对花生过敏。"


def test_mixed_input_keeps_both_scripts() -> None:
    summary = summarise(MIXED, max_chars=120)
    assert "京都" in summary
    assert "budget" in summary
    assert _in_source_order(summary, MIXED)


def test_a_single_long_sentence_is_cut_with_an_ellipsis() -> None:
    long = "Remember " + "that the hotel in Kyoto is booked " * 10 + "for April."
    summary = summarise([("user", long)], max_chars=50)
    assert len(summary) <= 50
    assert summary.endswith("…")
    assert long.startswith(summary[:-1])
    assert summarise([("user", "我对花生过敏千万记住" * 5)], max_chars=10) == "我对花生过敏千万记…"


@pytest.mark.parametrize(
    "turns", [[], [("user", "")], [("user", "   \n ")], [("tool", ""), ("assistant", " ")]]
)
def test_nothing_to_say_gives_empty(turns: list[tuple[str, str]]) -> None:
    assert summarise(turns) == ""


def test_zero_budget_gives_empty() -> None:
    assert summarise(ENGLISH, max_chars=0) == ""


def test_only_small_talk_is_still_summarised() -> None:
    assert summarise([("user", "ok"), ("assistant", "thanks")]) == "ok thanks"


def test_params_change_the_choice() -> None:
    by_position = ScoringParams(
        summary_tf_weight=0.0, summary_importance_weight=0.0, summary_position_weight=1.0
    )
    assert (
        summarise(TRIP, max_chars=40, params=by_position)
        == "I want to plan a trip to Kyoto in April."
    )
    assert summarise(ENGLISH, max_chars=40, params=by_position) == "How can I help you today?"


def test_ties_are_broken_by_position() -> None:
    turns = [("user", "Alpha beta gamma."), ("user", "Delta epsilon zeta.")]
    flat = ScoringParams(summary_position_weight=0.0)
    assert summarise(turns, max_chars=20, params=flat) == "Alpha beta gamma."


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("It costs 3.5 dollars. Really?! Yes...", ["It costs 3.5 dollars.", "Really?!", "Yes..."]),
        ("好的。我们走吧！你来吗？好；", ["好的。", "我们走吧！", "你来吗？", "好；"]),
        ("“太好了！”他说。\nnew line", ["“太好了！”他说。", "new line"]),
        ("no end mark", ["no end mark"]),
        ("", []),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


@given(TURNS, st.integers(0, 300))
def test_any_turns_give_a_short_stable_summary(turns: list[tuple[str, str]], limit: int) -> None:
    summary = summarise(turns, max_chars=limit)
    assert len(summary) <= limit
    assert summary == summarise(list(turns), max_chars=limit)
    has_text = any(content.strip() for _, content in turns)
    assert bool(summary) == (has_text and limit > 0)


_PLAIN_BREAK = re.compile(
    r"(?<=[。！？；!?…])(?![。！？；!?…」』”’\"')）\]])\s*"
    r"|(?<=\.)(?![.\d])\s+"
    r"|\s*\n\s*"
)
"""Sentence boundaries as first written (one whitespace-eating regex): the reference
of :func:`split_sentences`, which splits at the last character of each sentence."""
MARKED = st.lists(
    st.one_of(
        st.sampled_from(list("。！？；!?….\n \t\u3000」』”’\"')）]3a好")),
        st.sampled_from(["...", "v1.2", "3.5", " \n ", "\r\n", "Mr. X", "好。", "!?"]),
        st.text(max_size=4),
    ),
    max_size=30,
).map("".join)


@given(st.one_of(CONTENT, MARKED))
def test_split_sentences_is_the_plain_split(text: str) -> None:
    plain = [piece.strip() for piece in _PLAIN_BREAK.split(text) if piece and piece.strip()]
    assert split_sentences(text) == plain
    assert list(iter_sentences(text)) == plain


@given(st.one_of(CONTENT, MARKED))
def test_sentences_and_gaps_interleave_to_the_text(text: str) -> None:
    sentences, gaps = sentences_and_gaps(text)
    assert sentences == split_sentences(text)
    assert len(gaps) == len(sentences)
    assert all(not gap.strip() for gap in gaps)
    rebuilt = "".join(gap + sentence for gap, sentence in zip(gaps, sentences, strict=True))
    assert text.startswith(rebuilt)
    assert not text[len(rebuilt) :].strip()


def _plain_join(texts: list[str]) -> str:
    out = ""
    for text in texts:
        wide = bool(out) and bool(_WIDE.match(out[-1])) and bool(_WIDE.match(text[0]))
        out += text if wide or not out else " " + text
    return out


def _plain_select(ranked: list[_Sentence], max_chars: int, redundancy: float) -> list[_Sentence]:
    """The greedy choice as first written: sort the candidate in, join, measure."""
    chosen: list[_Sentence] = []
    used = -1
    for s in ranked:
        if len(s.text) + used + 1 > max_chars:
            continue
        if any(
            s.text == c.text
            or (
                s.terms
                and c.terms
                and len(s.terms & c.terms) / len(s.terms | c.terms) >= redundancy
            )
            for c in chosen
        ):
            continue
        candidate = sorted([*chosen, s], key=lambda x: x.position)
        length = len(_plain_join([x.text for x in candidate]))
        if length <= max_chars:
            chosen, used = candidate, length
    return chosen


SAID = st.lists(
    st.tuples(
        ROLES,
        st.lists(
            st.sampled_from(
                ["我对花生过敏。", "记住京都！", "Kyoto in April.", "remember the trip.", "好的。",
                 "ok", "「京都」is far.", "Book it 好吗？", "I like 京都。", "Sure.", "。", "\n"]
            ),
            max_size=10,
        ).map("".join),
    ),
    max_size=8,
)  # fmt: skip


@given(st.one_of(TURNS, SAID), st.integers(1, 120), st.sampled_from([0.2, 0.6, 1.0]))
def test_selection_is_the_plain_greedy_choice(
    turns: list[tuple[str, str]], limit: int, redundancy: float
) -> None:
    sentences = _sentences(turns)
    if not sentences:
        return
    scores = _scores(sentences, DEFAULT_PARAMS)
    ranked = sorted(sentences, key=lambda s: (-scores[s.position], s.position))
    chosen = _select(ranked, limit, redundancy)
    assert chosen == _plain_select(ranked, limit, redundancy)
    if chosen:
        joined = _plain_join([s.text for s in chosen])
        assert (
            summarise(
                turns,
                max_chars=limit,
                params=DEFAULT_PARAMS.model_copy(update={"summary_redundancy": redundancy}),
            )
            == joined
        )


def _summarise_as_first_written(
    turns: list[tuple[str, str]], max_chars: int, params: ScoringParams
) -> str:
    """:func:`summarise` as first written: every saying of every sentence ranked and
    offered to the greedy choice (the fast path ranks first sayings only)."""
    sentences = _sentences(turns)
    if not sentences or max_chars <= 0:
        return ""
    scores = _scores(sentences, params)
    ranked = sorted(sentences, key=lambda s: (-scores[s.position], s.position))
    chosen = _plain_select(ranked, max_chars, params.summary_redundancy)
    if not chosen:
        return _truncate(ranked[0].text, max_chars)
    return _plain_join([s.text for s in chosen])


SAID_AGAIN = st.lists(
    st.tuples(
        ROLES,
        st.lists(
            st.sampled_from(
                ["我对花生过敏。", "记住京都！", "好的。", "京都。", "Kyoto in April.", "ok.",
                 "remember the trip.", "I like 京都。", "Sure.", "A.", "。", "\n", " "]
            ),
            max_size=12,
        ).map("".join),
    ),
    max_size=10,
)  # fmt: skip
"""Turns that say the same sentences again, Chinese and English side by side (a
sentence placed between two Chinese ones costs two more characters than at their
end: the near fits)."""


@given(st.one_of(TURNS, SAID, SAID_AGAIN), st.integers(1, 90), st.sampled_from([0.2, 0.6, 1.0]))
def test_ranking_first_sayings_is_ranking_every_saying(
    turns: list[tuple[str, str]], limit: int, redundancy: float
) -> None:
    params = DEFAULT_PARAMS.model_copy(update={"summary_redundancy": redundancy})
    assert summarise(turns, max_chars=limit, params=params) == _summarise_as_first_written(
        turns, limit, params
    )


def test_a_near_fit_reads_every_saying() -> None:
    """The first saying of "Kyoto trip." sits between two Chinese sentences, which join
    without a space: there it costs two characters more than its length, one too many;
    its second saying, at the end, costs one, and is chosen."""
    turns = [("user", "我对花生过敏。Kyoto trip. 记住京都！Kyoto trip. ")]
    summary = summarise(turns, max_chars=24)
    assert summary == "我对花生过敏。记住京都！ Kyoto trip."
    assert summary == _summarise_as_first_written(turns, 24, DEFAULT_PARAMS)


def test_the_logs_of_frequencies_are_math_log() -> None:
    """The table of logs gives ``math.log``'s very floats, below it and above it."""
    assert all(_log(count) == math.log(count) for count in range(1, 3000))


@given(CONTENT)
def test_the_remembered_sentences_are_the_sentences(text: str) -> None:
    first = remembered_sentences_and_gaps(text)
    assert first == sentences_and_gaps(text)
    assert remembered_sentences_and_gaps(text) == first
