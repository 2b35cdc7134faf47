"""The default scorer: tokens, importance / sentiment / confidence, entities, episodes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from processors.cues import CONFIDENCE_CUES, IMPORTANCE_MARKERS, POLARITY
from processors.scoring import Scores, aggregate, extract_entities, score_text, score_turn, tokenize
from processors.state import ScoringParams

CUES = sorted({*IMPORTANCE_MARKERS, *POLARITY, *CONFIDENCE_CUES, "不", "not", "非常", "very"})
PIECES = st.one_of(
    st.sampled_from(CUES),
    st.sampled_from([" ", ", ", "。", "！", "!", "?", "「", "」", "《", "》", "@", "#", "\n"]),
    st.text(max_size=12),
    st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x4FFF), max_size=6),
    st.from_regex(r"[A-Z][a-z]{1,6}|\d{1,4}[-:/年月]\d{1,2}", fullmatch=True),
)
TEXTS = st.one_of(st.text(max_size=200), st.lists(PIECES, max_size=30).map("".join))
SCORES = st.builds(
    Scores,
    importance=st.floats(1.0, 10.0),
    sentiment=st.floats(-1.0, 1.0),
    confidence=st.floats(0.0, 1.0),
)


def _in_range(scores: Scores) -> bool:
    return (
        1.0 <= scores.importance <= 10.0
        and -1.0 <= scores.sentiment <= 1.0
        and 0.0 <= scores.confidence <= 1.0
    )


def _three_decimals(scores: Scores) -> bool:
    values = (scores.importance, scores.sentiment, scores.confidence)
    return all(round(v, 3) == v for v in values)


# --- tokenize -------------------------------------------------------------------


def test_cjk_runs_give_unigrams_and_bigrams_in_reading_order() -> None:
    assert tokenize("我想去京都") == ["我", "我想", "想", "想去", "去", "去京", "京", "京都", "都"]


def test_latin_words_are_lowercased_and_punctuation_dropped() -> None:
    assert tokenize("Hello, World!") == ["hello", "world"]


def test_mixed_text_keeps_words_numbers_and_cjk_grams() -> None:
    assert tokenize("I'm flying to 京都 on 2024-06-01 at 14:30 (3.5h)") == [
        "i'm", "flying", "to", "京", "京都", "都", "on", "2024-06-01", "at", "14:30", "3.5", "h",
    ]  # fmt: skip


def test_full_width_curly_and_underscored_forms_are_normalised() -> None:
    assert tokenize("Ｈｅｌｌｏ　ＷＯＲＬＤ１２") == ["hello", "world12"]
    assert tokenize("don’t snake_case") == ["don't", "snake", "case"]
    assert tokenize("京。都") == ["京", "都"]  # punctuation ends a CJK run


@pytest.mark.parametrize("text", ["", "   ", "!?。，、…", "---"])
def test_text_without_words_has_no_tokens(text: str) -> None:
    assert tokenize(text) == []


@given(TEXTS)
def test_tokens_are_non_empty_words_and_deterministic(text: str) -> None:
    tokens = tokenize(text)
    assert tokens == tokenize(text)
    assert all(token and not any(c.isspace() for c in token) for token in tokens)
    assert all(token == token.casefold() for token in tokens if token.isascii())


@given(st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), max_size=20))
def test_a_han_run_of_n_characters_gives_2n_minus_1_tokens(run: str) -> None:
    tokens = tokenize(run)
    assert len(tokens) == max(2 * len(run) - 1, 0)
    assert tokens[::2] == list(run)


# --- score_text -----------------------------------------------------------------


def test_an_allergy_to_remember_is_more_important_than_ok() -> None:
    allergy = score_text("I'm allergic to peanuts, remember this")
    assert allergy.importance > score_text("ok").importance + 3
    assert allergy.importance >= 7


def test_chinese_markers_raise_importance() -> None:
    assert score_text("我对花生过敏，一定要记住！").importance > 8
    assert score_text("好的").importance < 3
    assert score_text("下周五是我妈妈的生日").importance > score_text("下周五我们吃饭").importance


def test_names_numbers_and_exclamation_raise_importance() -> None:
    plain = score_text("we met at the cafe").importance
    assert score_text("we met Alice at the cafe at 10:30").importance > plain
    assert score_text("we met at the cafe!").importance > plain


def test_length_raises_importance_up_to_a_cap() -> None:
    short, longer = score_text("the cafe"), score_text(" ".join(["the cafe"] * 20))
    assert longer.importance > short.importance
    assert score_text(" ".join(["the cafe"] * 200)).importance == longer.importance


@pytest.mark.parametrize(
    "text",
    ["我非常讨厌排队", "不喜欢", "我不喜欢这个", "太糟糕了", "这让我很失望",
     "I hate queues", "This is terrible", "not good", "I don't like it", "I am so angry"],
)  # fmt: skip
def test_negative_texts(text: str) -> None:
    assert score_text(text).sentiment < -0.2


@pytest.mark.parametrize(
    "text",
    ["太好了，谢谢你", "我特别喜欢京都", "非常满意", "不错", "I love it!", "Great, thanks!",
     "This is not bad at all", "我很开心"],
)  # fmt: skip
def test_positive_texts(text: str) -> None:
    assert score_text(text).sentiment > 0.2


@pytest.mark.parametrize("text", ["ok", "好的", "The meeting is at noon.", "明天下午开会", ""])
def test_neutral_texts(text: str) -> None:
    assert score_text(text).sentiment == 0.0


def test_negation_flips_and_intensifiers_strengthen() -> None:
    assert score_text("喜欢").sentiment > 0 > score_text("不喜欢").sentiment
    assert score_text("good").sentiment > 0 > score_text("not good").sentiment
    assert score_text("非常讨厌").sentiment < score_text("讨厌").sentiment < 0
    assert score_text("very happy").sentiment > score_text("happy").sentiment > 0


def test_negation_stops_at_the_clause() -> None:
    assert score_text("No, I love it").sentiment > 0
    assert score_text("不，我喜欢").sentiment > 0


def test_strong_feeling_raises_importance() -> None:
    assert score_text("我非常讨厌排队").importance > score_text("我在排队").importance


@pytest.mark.parametrize(
    ("hedged", "plain"),
    [
        ("Maybe it will rain tomorrow, I think", "It will rain tomorrow"),
        ("I'm not sure the shop opens at nine", "The shop opens at nine"),
        ("明天可能会下雨", "明天会下雨"),
        ("他大概也许会来", "他会来"),
    ],
)
def test_hedges_lower_confidence(hedged: str, plain: str) -> None:
    assert score_text(hedged).confidence < score_text(plain).confidence


def test_default_confidence_and_assertions() -> None:
    assert score_text("The shop opens at nine").confidence == pytest.approx(0.7)
    assert score_text("The shop definitely opens at nine").confidence > 0.7
    assert score_text("他肯定会来").confidence > score_text("他会来").confidence
    assert score_text("不确定他会来").confidence < score_text("他会来").confidence
    assert score_text("Does the shop open at nine?").confidence < 0.7


@given(TEXTS)
def test_scores_stay_in_range_and_rounded_for_any_text(text: str) -> None:
    scores = score_text(text)
    assert _in_range(scores)
    assert _three_decimals(scores)
    assert score_text(text) == scores


def test_scores_are_stable_numbers() -> None:
    """Pinned values: a change here changes every replayed episode (bump the config)."""
    assert score_text("I'm allergic to peanuts, remember this") == Scores(7.3, 0.0, 0.7)
    assert score_text("太好了，谢谢你") == Scores(3.493, 0.862, 0.7)


def test_params_tune_the_scorer() -> None:
    params = ScoringParams(polarity={"meh": -0.5}, importance_markers={"pizza": 4.0})
    assert score_text("meh", params).sentiment < 0
    assert score_text("I hate it", params).sentiment == 0.0
    assert score_text("pizza tonight", params).importance > score_text("pizza tonight").importance


def test_params_are_frozen_and_closed() -> None:
    params = ScoringParams()
    with pytest.raises(ValidationError):
        params.importance_base = 5.0  # type: ignore[misc]  # frozen: assignment is refused
    with pytest.raises(ValidationError):
        ScoringParams(unknown=1.0)  # type: ignore[call-arg]  # extra fields are refused
    with pytest.raises(ValidationError):
        ScoringParams(polarity={"meh": -2.0})
    assert ScoringParams() == params
    assert ScoringParams.model_validate_json(params.model_dump_json()) == params


@pytest.mark.parametrize(
    ("importance", "sentiment", "confidence"),
    [(0.5, 0.0, 0.5), (11.0, 0.0, 0.5), (5.0, -1.5, 0.5), (5.0, 0.0, 1.2), (float("nan"), 0, 0)],
)
def test_scores_refuse_out_of_range_values(
    importance: float, sentiment: float, confidence: float
) -> None:
    with pytest.raises(ValueError):
        Scores(importance, sentiment, confidence)


# --- score_turn -----------------------------------------------------------------


def test_agent_supplied_values_win() -> None:
    text = "I'm allergic to peanuts, remember this"
    assert score_turn(text, importance=2.0, sentiment=-0.9, confidence=0.3) == Scores(
        2.0, -0.9, 0.3
    )


def test_missing_values_are_estimated() -> None:
    text = "太好了，谢谢你"
    estimate = score_text(text)
    mixed = score_turn(text, importance=9.5, sentiment=None, confidence=None)
    assert mixed == Scores(9.5, estimate.sentiment, estimate.confidence)
    assert score_turn(text, importance=None, sentiment=None, confidence=None) == estimate


@given(
    TEXTS,
    st.none() | st.floats(1.0, 10.0),
    st.none() | st.floats(-1.0, 1.0),
    st.none() | st.floats(0.0, 1.0),
)
def test_each_supplied_value_wins_for_any_text(
    text: str, importance: float | None, sentiment: float | None, confidence: float | None
) -> None:
    scores = score_turn(text, importance=importance, sentiment=sentiment, confidence=confidence)
    assert _in_range(scores)
    assert importance is None or scores.importance == importance
    assert sentiment is None or scores.sentiment == sentiment
    assert confidence is None or scores.confidence == confidence


# --- extract_entities -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("My sister Alice lives in New York since 2019.", ["Alice", "New York", "2019"]),
        ("I met Bob and I told Alice about the Eiffel Tower.", ["Bob", "Alice", "Eiffel Tower"]),
        ("The flight is on June 5, 2024 at 3pm.", ["June 5, 2024", "3pm"]),
        ("ping @bob_smith about #travel at 14:30", ["@bob_smith", "#travel", "14:30"]),
        ("帮我把这些 PDF 里的发票金额汇总一下", ["PDF"]),
        ("我叫李明，住在上海，喜欢《三体》和「京都」。", ["李明", "上海", "三体", "京都"]),
        ("2024年6月1日下午3点半见", ["2024年6月1日", "3点半"]),
        ("花了¥500，增长20%", ["¥500", "20%"]),
        ("ok, sounds good", []),
        ("", []),
    ],
)
def test_entities(text: str, expected: list[str]) -> None:
    assert extract_entities(text) == expected


def test_sentence_initial_common_words_are_not_names() -> None:
    assert extract_entities("Hello. Remember Alice? Yesterday Bob called.") == ["Alice", "Bob"]
    assert extract_entities("I think so. Then I left.") == []


def test_entities_are_deduplicated_in_first_seen_order_and_limited() -> None:
    text = "Alice met Bob. Then alice met Carol, Dave and Erin in Kyoto."
    assert extract_entities(text) == ["Alice", "Bob", "Carol", "Dave", "Erin", "Kyoto"]
    assert extract_entities(text, limit=2) == ["Alice", "Bob"]
    assert extract_entities(text, limit=0) == []


@given(TEXTS, st.integers(0, 12))
def test_entities_are_distinct_substrings_for_any_text(text: str, limit: int) -> None:
    entities = extract_entities(text, limit)
    assert entities == extract_entities(text, limit)
    assert len(entities) <= limit
    assert all(entity and entity in text for entity in entities)
    assert len({e.casefold() for e in entities}) == len(entities)


# --- aggregate ------------------------------------------------------------------


def test_episode_importance_blends_peak_and_mean() -> None:
    turns = [Scores(2.0, 0.0, 0.7), Scores(9.0, -0.8, 0.9), Scores(1.0, 0.2, 0.5)]
    episode = aggregate(turns)
    assert episode.importance == pytest.approx(0.7 * 9.0 + 0.3 * 4.0)
    assert episode.sentiment == pytest.approx((-0.64 + 0.04) / 1.0)
    assert episode.confidence == pytest.approx(0.7)


def test_neutral_turns_do_not_dilute_a_felt_one() -> None:
    felt = [Scores(3.0, 0.9, 0.7)] + [Scores(2.0, 0.0, 0.7)] * 9
    assert aggregate(felt).sentiment == pytest.approx(0.9)
    assert aggregate([Scores(3.0, 0.0, 0.7)] * 3).sentiment == 0.0


def test_empty_episode_is_neutral() -> None:
    assert aggregate([]) == Scores(1.0, 0.0, 0.7)


@given(st.lists(SCORES, min_size=1, max_size=20), st.data())
def test_aggregate_is_bounded_and_order_free(scores: list[Scores], data: st.DataObject) -> None:
    episode = aggregate(scores)
    assert _in_range(episode)
    assert _three_decimals(episode)
    assert aggregate(data.draw(st.permutations(scores))) == episode
    importances = [s.importance for s in scores]
    mean = sum(importances) / len(importances)
    assert mean - 1e-3 <= episode.importance <= max(importances) + 1e-3
    confidences = [s.confidence for s in scores]
    assert min(confidences) - 1e-3 <= episode.confidence <= max(confidences) + 1e-3
