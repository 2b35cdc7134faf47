"""The default extractive summariser: informative, short, in order, stable."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processors.scoring import ScoringParams
from processors.summary import SUMMARISER_NAME, split_sentences, summarise

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
