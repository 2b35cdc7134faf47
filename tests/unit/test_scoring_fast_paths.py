"""The fast paths of the scorer give exactly what the plain definitions give."""

from __future__ import annotations

import dataclasses
import re
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from processors.scoring import (
    _ASCII_DIGIT,
    _CAPITAL,
    _DIGIT,
    _ENTITY_RULES,
    _HAN,
    _RULES_FOR,
    _WIDE_PUNCTUATION,
    CONFIDENCE_CUES,
    DEFAULT_PARAMS,
    IMPORTANCE_MARKERS,
    INTENSIFIERS,
    NEGATORS,
    POLARITY,
    Lexicon,
    ScoringParams,
    _all_names,
    _matches,
    analyse,
    analyse_turn,
    extract_entities,
    normalise,
    score_text,
    score_turn,
    word_spans,
)

CUES = sorted({*IMPORTANCE_MARKERS, *POLARITY, *CONFIDENCE_CUES, *NEGATORS, *INTENSIFIERS})
PIECES = st.one_of(
    st.sampled_from(CUES),
    st.sampled_from([c.upper() for c in CUES] + [c.title() for c in CUES]),
    st.sampled_from(
        [" ", "  ", ", ", "。", "，", "！", "!", "?", "'", "’", "-", "_", "\n", "\t", "\u3000"]
    ),
    st.sampled_from(["「", "」", "《", "》", "@", "#", "I", "I'm", "Kyoto", "New York"]),
    st.sampled_from(["10:30am", "3 pm", "2024-06-01", "March 3rd", "$12.50", "45%", "5/6"]),
    st.sampled_from(["我叫王小明", "住在北京", "6月1日", "3点半", "ＡＢＣ", "１２", "ﬁ", "ß"]),
    st.text(max_size=12),
    st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x4FFF), max_size=6),
)
TEXTS = st.one_of(st.text(max_size=200), st.lists(PIECES, max_size=30).map("".join))
CUSTOM = ScoringParams(
    polarity={"meh": -0.5, "so-so": 0.2, "c++": 0.4, "ok ok": 0.3, "好": 0.3},
    importance_markers={"pizza": 4.0, "don't-forget": 2.0, "qq群": 1.0},
    negators=("nah",),
    intensifiers=("mega", "超"),
)
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})


def _reference_normalise(text: str) -> str:
    folded = unicodedata.normalize("NFKC", text).casefold().translate(_APOSTROPHES)
    return re.sub(r"\s+", " ", folded).strip()


def _by_ngrams(lexicon: Lexicon) -> Lexicon:
    """The same lexicon without its whole-word regex: the word n-gram lookup."""
    return dataclasses.replace(lexicon, latin=None)


@given(TEXTS)
def test_normalise_is_the_plain_definition(text: str) -> None:
    assert normalise(text) == _reference_normalise(text)


def test_punctuation_replaced_before_nfkc_is_its_decomposition() -> None:
    for wide, narrow in _WIDE_PUNCTUATION:  # so NFKC gives the same with or without it
        assert unicodedata.normalize("NFKD", wide) == narrow
        assert len(narrow) == 1 and narrow.isascii()


@given(TEXTS)
def test_analyse_is_score_text_and_extract_entities(text: str) -> None:
    for params in (DEFAULT_PARAMS, CUSTOM):
        assert analyse(text, params) == (score_text(text, params), extract_entities(text))


@given(
    TEXTS,
    st.none() | st.floats(1.0, 10.0),
    st.none() | st.floats(-1.0, 1.0),
    st.none() | st.floats(0.0, 1.0),
)
def test_analyse_turn_is_score_turn_and_extract_entities(
    text: str, importance: float | None, sentiment: float | None, confidence: float | None
) -> None:
    given_scores = {"importance": importance, "sentiment": sentiment, "confidence": confidence}
    assert analyse_turn(text, **given_scores) == (
        score_turn(text, **given_scores),
        extract_entities(text),
    )


GLUED = st.lists(
    st.one_of(
        st.sampled_from(CUES),
        st.sampled_from(["é", "ß", "д", "ı", "٣", "_", "'", "’", "ʼ", "x", "1", "京", " ", "-"]),
    ),
    max_size=20,
).map("".join)
"""Cues glued to letters, digits and apostrophes, ASCII or not: the word boundaries."""


@given(st.one_of(TEXTS, GLUED))
def test_whole_word_regex_finds_what_the_ngram_lookup_finds(text: str) -> None:
    norm = normalise(text)
    words = [norm[a:b] for a, b in word_spans(norm)]
    for lexicon in (
        DEFAULT_PARAMS.importance_lexicon,
        DEFAULT_PARAMS.polarity_lexicon,
        DEFAULT_PARAMS.confidence_lexicon,
    ):
        assert lexicon.latin is not None
        plain = _by_ngrams(lexicon)
        assert lexicon.hits(norm) == plain.hits(norm)
        assert lexicon.find(norm, words) == plain.hits(norm)
        assert lexicon.distinct_sum_of(norm, words) == plain.distinct_sum(norm)


def test_cues_that_are_not_plain_words_keep_the_ngram_lookup() -> None:
    assert CUSTOM.polarity_lexicon.latin is None  # "so-so", "c++"
    assert CUSTOM.importance_lexicon.latin is None  # "don't-forget"
    assert ScoringParams(polarity={"ok ok": 0.3}).polarity_lexicon.latin is not None
    norm = normalise("Meh, it was ok ok. So-so really; don't-forget the QQ群")
    assert [cue for _, cue, _ in CUSTOM.polarity_lexicon.hits(norm)] == ["meh", "ok ok"]
    assert [cue for _, cue, _ in CUSTOM.importance_lexicon.hits(norm)] == ["qq群"]


def _han_run(low: int, high: int) -> str:
    stop = "的了是和与跟我你他她它们很也都就吗呢吧啊呀哦嘛着过在"
    return rf"(?:(?![{stop}])[{_HAN}]){{{low},{high}}}"


_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
PLAIN_ENTITY_PATTERNS = [
    r"[「『“《]([^「」『』“”《》\n]{1,40})[」』”》]",
    r"(?<!\w)([@#][^\W\d_][\w.-]*\w|[@#][^\W\d_])",
    rf"\b({_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?)",
    rf"\b(\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}(?:,?\s+\d{{4}})?)",
    r"(\d{4}[-/.]\d{1,2}[-/.]\d{1,2})",
    r"((?:\d{2,4}年)?\d{1,2}月(?:\d{1,2}[日号])?|\d{4}年)",
    r"(\d{1,2}:\d{2}(?::\d{2})?(?:\s?[AaPp]\.?[Mm]\.?)?|\d{1,2}\s?[AaPp][Mm]\b)",
    r"(\d{1,2}[点時时](?:\d{1,2}分|半)?)",
    r"(\d{1,2}/\d{1,2}(?:/\d{2,4})?)",
    r"((?<![0-9A-Za-z_.])[$€£¥]?\d+(?:[.,]\d+)*%?)",
    rf"叫({_han_run(2, 3)})",
    rf"姓({_han_run(1, 2)})",
    rf"(?<![现正实存所自好])在({_han_run(2, 4)})",
]
"""The entity rules as first written (lookbehinds first): the reference of the
rewritten patterns, which start with a character class so the engine can skip."""
DATE_PIECES = st.lists(
    st.one_of(
        PIECES,
        st.sampled_from(list("0123456789年月日号点時时分半$€£¥%.,:/-_ aApPmM@#\n现在北京上海叫姓")),
        st.sampled_from(["Jan", "January", "May", "Sept", "Dec.", "of", "st", "th", "am", "p.m."]),
        st.sampled_from(["x", "a5", "_3", "٣", "５", "2024年", "12月", "3点", "'s", "—", "’"]),
    ),
    max_size=40,
).map("".join)


@given(st.one_of(TEXTS, DATE_PIECES))
def test_entity_patterns_match_what_the_plain_patterns_match(text: str) -> None:
    assert len(_ENTITY_RULES) == len(PLAIN_ENTITY_PATTERNS)
    for (_, _, _, pattern), plain in zip(_ENTITY_RULES, PLAIN_ENTITY_PATTERNS, strict=True):
        found = [(m.span(), m.span(1)) for m in pattern.finditer(text)]
        assert found == [(m.span(), m.span(1)) for m in re.finditer(plain, text)], plain


def _every_entity(text: str, limit: int) -> list[str]:
    """:func:`extract_entities` as first written: every candidate of every rule, sorted,
    the overlapping ones dropped, de-duplicated, then cut to ``limit``."""
    wide = not text.isascii()
    digit = (_DIGIT if wide else _ASCII_DIGIT).search(text) is not None
    spans = [
        span
        for guard, pattern in _RULES_FOR[wide, digit]
        if guard is None or guard.search(text)
        for span in _matches(pattern, text)
    ]
    if (capital := _CAPITAL.search(text)) is not None:
        spans += _all_names(text, capital.start())
    found: dict[str, str] = {}
    kept_end = -1
    for start, shorter, entity in sorted(spans):
        if start >= kept_end:
            kept_end = start - shorter
            found.setdefault(entity.casefold(), entity)
    return list(found.values())[: max(limit, 0)]


LONG = st.lists(st.one_of(TEXTS, DATE_PIECES), min_size=1, max_size=12).map(" ".join)
"""Texts over 512 characters too, whose candidates are merged lazily, not sorted."""


@given(st.one_of(TEXTS, DATE_PIECES, LONG), st.integers(-1, 12))
def test_entities_are_the_first_of_every_candidate(text: str, limit: int) -> None:
    assert extract_entities(text, limit) == _every_entity(text, limit)
