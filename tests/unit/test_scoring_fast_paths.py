"""The fast paths of the scorer give exactly what the plain definitions give."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import sys
import unicodedata

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.cues import CONFIDENCE_CUES, IMPORTANCE_MARKERS, INTENSIFIERS, NEGATORS, POLARITY
from processors.scoring import (
    _ASCII_DIGIT,
    _CAPITAL,
    _CJK_CHAR,
    _DIGIT,
    _ENTITY_RULES,
    _HAN,
    _RULES_FOR,
    _STABLE,
    _WIDE_PUNCTUATION,
    _WORD,
    DEFAULT_PARAMS,
    Lexicon,
    Scores,
    _adds_up,
    _all_names,
    _clamp,
    _matches,
    _modifier,
    _part,
    analyse,
    analyse_turn,
    analysis,
    extract_entities,
    normalise,
    reading,
    score_text,
    score_turn,
    word_spans,
)
from processors.sentences import sentences_and_gaps, split_sentences
from processors.state import ScoringParams

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
        reading(DEFAULT_PARAMS).importance,
        reading(DEFAULT_PARAMS).polarity,
        reading(DEFAULT_PARAMS).confidence,
    ):
        assert lexicon.latin is not None
        plain = _by_ngrams(lexicon)
        assert lexicon.hits(norm) == plain.hits(norm)
        assert lexicon.find(norm, words) == plain.hits(norm)
        assert lexicon.distinct_sum_of(norm, words) == plain.distinct_sum(norm)


def test_cues_that_are_not_plain_words_keep_the_ngram_lookup() -> None:
    assert reading(CUSTOM).polarity.latin is None  # "so-so", "c++"
    assert reading(CUSTOM).importance.latin is None  # "don't-forget"
    assert reading(ScoringParams(polarity={"ok ok": 0.3})).polarity.latin is not None
    norm = normalise("Meh, it was ok ok. So-so really; don't-forget the QQ群")
    assert [cue for _, cue, _ in reading(CUSTOM).polarity.hits(norm)] == ["meh", "ok ok"]
    assert [cue for _, cue, _ in reading(CUSTOM).importance.hits(norm)] == ["qq群"]


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


def _analysis_at_once(text: str, params: ScoringParams) -> tuple[Scores, tuple[str, ...]]:
    """:func:`analysis` as first written: the whole text read at once (the reference of
    the reading sentence by sentence)."""
    entities = tuple(extract_entities(text))
    norm = normalise(text)
    words = _WORD.findall(norm)
    cjk = 0 if norm.isascii() else len(_CJK_CHAR.findall(norm))
    if not words and not cjk:
        return Scores(1.0, 0.0, _clamp(params.confidence_base, 0.0, 1.0)), entities
    raw = 0.0
    for start, cue, weight in reading(params).polarity.hits(norm):
        raw += weight * _modifier(norm, start, cue, params)
    sentiment = 0.0
    if raw:
        raw *= 1.0 + params.exclaim_sentiment * min(norm.count("!"), 3)
        sentiment = _clamp(math.tanh(params.sentiment_gain * raw), -1.0, 1.0)
    length = len(words) + cjk / params.cjk_chars_per_word
    markers = min(reading(params).importance.distinct_sum(norm), params.marker_cap)
    named = min(params.entity_weight * len(entities), params.entity_cap)
    size = params.length_max * min(1.0, length / params.length_scale)
    exclaim = params.exclaim_importance if "!" in norm else 0.0
    arousal = params.arousal_weight * abs(sentiment)
    total = params.importance_base + markers + named + size + exclaim + arousal
    shift = reading(params).confidence.distinct_sum(norm)
    question = params.question_penalty if "?" in norm or "吗" in norm else 0.0
    confidence = _clamp(
        params.confidence_base + shift - question, params.confidence_min, params.confidence_max
    )
    return Scores(_clamp(total, 1.0, 10.0), sentiment, confidence), entities


EDGES = st.sampled_from(
    [
        ". ", "! ", "? ", "。", "！", "？", "；", "：", "…", ".\n", "\n", "\n\n", " \t ", "\r\n",
        "\u3000", "\xa0", "\x1f", "“", "”", "「", "」", "《", "》", "『", "』", '"', "(", "'",
        "Dr. ", "3", "42", "٣", "May", "March", "Mar. ", "of ", "am", "pm", "I", "The", "Bob",
        "Maybe", "@x", "#t", "$5", "5%", "叫王小明", "在北京", "¨", "\u0301", "\u3099", "ﬁ", "吗",
        " " * 62, "“" * 61, '"' * 70, "not ", "very ", "不", "很", "thank you", "don't",
    ]
)  # fmt: skip
"""Sentence ends, the gaps between sentences and what may read across them: digits and
months (dates), quotation marks, capitals and sentence starters, long runs of spaces
and opening quotes, combining marks, negators and intensifiers."""
SENTENCES = st.lists(st.one_of(PIECES, EDGES), max_size=50).map("".join)
MANY = st.lists(st.one_of(SENTENCES, TEXTS), min_size=2, max_size=30).map(" ".join)
"""Longer texts of many sentences (over 512 characters too: not remembered whole)."""
BROKEN = ScoringParams(polarity={"good.bad": 0.5, "nice": 0.4}, intensifiers=("so so",))
"""Params whose cues may span a clause end: texts are read at once."""


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(TEXTS, SENTENCES, MANY))
def test_a_text_read_by_sentences_is_the_text_read_at_once(text: str) -> None:
    for params in (DEFAULT_PARAMS, CUSTOM, BROKEN):
        expected = _analysis_at_once(text, params)
        assert analysis(text, params) == expected
        assert analysis(text, params.model_copy()) == expected  # nothing remembered
        for sentence in split_sentences(text):
            assert analysis(sentence, params) == _analysis_at_once(sentence, params)


def _adds_up_for(text: str, params: ScoringParams = DEFAULT_PARAMS) -> bool:
    """Whether ``text`` is read sentence by sentence."""
    sentences, gaps = sentences_and_gaps(text)
    parts = [_part(sentence, normalise(sentence), params) for sentence in sentences]
    return _adds_up(text, parts, gaps)


def test_texts_are_read_by_sentences() -> None:
    """The test above is not vacuous: the usual texts are cut, and where a rule reads
    across sentences they are not."""
    assert reading(DEFAULT_PARAMS).apart and reading(CUSTOM).apart and not reading(BROKEN).apart
    cut = "I love it. You hate it!  我很开心。“Quoted.” Then (Bob) came. 《三体》好！"
    assert len(split_sentences(cut)) == 5  # ."” ends no sentence
    assert _adds_up_for(cut) and _adds_up_for(cut, CUSTOM)
    for whole in (
        "We go in March. 3 of us.",  # a date across sentences
        "He said “Stop. Now.” and left.",  # a quote across sentences
        "Wait… May we?",  # "…" is not a sentence end for the names
        "Hi.\u3000May we?",  # nor an ideographic space
        "no end\nMay we",  # a line break alone
    ):
        assert not _adds_up_for(whole), whole


def _second_elements() -> set[str]:
    """Every character that composes with one before it (the second character of a
    canonical decomposition, Hangul vowel and trailing jamo)."""
    found = {chr(c) for c in range(0x1161, 0x1176)} | {chr(c) for c in range(0x11A8, 0x11C3)}
    for code in range(sys.maxunicode + 1):
        decomposition = unicodedata.decomposition(chr(code))
        if decomposition and not decomposition.startswith("<"):
            pieces = decomposition.split()
            if len(pieces) == 2:
                found.add(chr(int(pieces[1], 16)))
    return found


def test_stable_first_characters_leave_nfkc_a_boundary_before_them() -> None:
    """What :func:`_joined` assumes of a sentence's first character: a starter that
    composes with nothing before it, whose NFKC starts with such a starter, no space;
    and of whitespace (around sentences): the same, and NFKC keeps it whitespace."""
    second = _second_elements()

    def boundary_before(char: str) -> bool:
        first = unicodedata.normalize("NFKC", char)[:1]
        return (
            unicodedata.combining(char) == 0
            and char not in second
            and bool(first)
            and unicodedata.combining(first) == 0
            and first not in second
        )

    stable = [chr(c) for c in range(sys.maxunicode + 1) if _STABLE.match(chr(c))]
    assert len(stable) == 39_169  # the ranges of the class, whole
    for char in stable:
        assert boundary_before(char) and not unicodedata.normalize("NFKC", char)[0].isspace()
    for char in map(chr, range(sys.maxunicode + 1)):
        if char.isspace():
            assert boundary_before(char) and unicodedata.normalize("NFKC", char).isspace()
    for head in "a。.!Ｆ京《":  # and the same by example, after every kind of end
        for end in [*"a.!?;:。！？；：¨<=", "\u0301", "\u3099", "\u1100", "가"]:
            nfkc = functools.partial(unicodedata.normalize, "NFKC")
            assert nfkc(end + head + "\u0301x") == nfkc(end) + nfkc(head + "\u0301x")


@given(
    st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 0.0005, -0.0005, 1.0005, 2.5e-4])),
    st.sampled_from([(1.0, 10.0), (-1.0, 1.0), (0.0, 1.0), (-0.0, 0.0)]),
)
def test_a_remembered_rounding_is_the_rounding(value: float, bounds: tuple[float, float]) -> None:
    low, high = bounds
    expected = round(min(max(value, low), high), 3)
    for _ in range(2):  # the second time from memory
        got = _clamp(value, low, high)
        assert got == expected or (math.isnan(got) and math.isnan(expected))
        assert math.copysign(1.0, got) == math.copysign(1.0, expected)
