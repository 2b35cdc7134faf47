"""Hybrid recall, the pure half: tokens, sparse vectors, fusion and ranking."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from processors import recall
from processors.forgetting import (
    Curve,
    ForgettingParams,
    Trace,
    new_trace,
    reinforce,
    retention,
    weaken,
)
from processors.recall import (
    CJK_STOPWORDS,
    ENGLISH_STOPWORDS,
    Candidate,
    RecallWeights,
    ScoredMemory,
    candidate_retention,
    document_sparse,
    max_rrf,
    normalise,
    query_sparse,
    rank,
    rrf,
    score,
    stem,
    term_index,
    tokenize,
)

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
CURVES: tuple[Curve, ...] = ("exponential", "fsrs")
PARAMS = {curve: ForgettingParams(curve=curve) for curve in CURVES}
FORGETTING = PARAMS["exponential"]
WEIGHTS = RecallWeights()


# --- tokenizer -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The cats are running to the boxes!", ["cat", "run", "box"]),
        ("Alice's friends don't like it", ["alic", "friend", "lik"]),
        ("Alice\u2019s friends don\u2019t like it", ["alic", "friend", "lik"]),
        ("I'm sure you'll see we've", ["sur", "see"]),
        ("O'Neill rock'n'roll", ["oneill", "rocknroll"]),
        ("Hello, world!!! (test) -- foo_bar", ["hello", "world", "test", "foo", "bar"]),
        ("'quoted' words", ["quot", "word"]),
        ("pi is 3.14, costs 1,000 at 14:30 on 2024-06-01",
         ["pi", "3.14", "cost", "1,000", "14", "30", "2024", "06", "01"]),
        ("GPT4 v1.2", ["gpt4", "v1", "2"]),
        ("Straße café NAÏVE", ["strass", "café", "naïve"]),
        ("हिन्दी भाषा", ["हिन्दी", "भाषा"]),
    ],
)  # fmt: skip
def test_english_and_latin_words(text: str, expected: list[str]) -> None:
    assert tokenize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("上海", ["上海"]),
        ("我喜欢喝茶", ["我喜", "喜欢", "欢喝", "喝茶"]),
        ("茶", ["茶"]),
        ("的", []),
        ("好，的。了！茶", ["好", "茶"]),
        ("上海天气", ["上海", "海天", "天气"]),
        ("カタカナ", ["カタ", "タカ", "カナ"]),
        ("한국어 텍스트", ["한국", "국어", "텍스", "스트"]),
    ],
)
def test_cjk_runs_are_bigrams_and_lone_characters_unigrams(text: str, expected: list[str]) -> None:
    assert tokenize(text) == expected


def test_mixed_text_is_tokenised_piece_by_piece() -> None:
    assert tokenize("我在上海用Python写代码, running fast") == [
        "我在",
        "在上",
        "上海",
        "海用",
        "python",
        "写代",
        "代码",
        "run",
        "fast",
    ]


def test_document_side_adds_cjk_unigrams_but_not_stopwords() -> None:
    assert tokenize("我喜欢茶", cjk_unigrams=True) == ["我喜", "喜", "喜欢", "欢", "欢茶", "茶"]
    assert tokenize("的", cjk_unigrams=True) == []
    assert tokenize("hello 上海", cjk_unigrams=True) == ["hello", "上", "上海", "海"]


def test_full_width_characters_are_folded() -> None:
    assert tokenize("Ｈｅｌｌｏ，　ＷＯＲＬＤ　１２３！") == tokenize("hello, world 123!")
    assert tokenize("Ｈｅｌｌｏ") == ["hello"]
    assert tokenize("ｶﾀｶﾅ") == tokenize("カタカナ")
    assert tokenize("Ａｌｉｃｅ＇ｓ") == ["alic"]


@pytest.mark.parametrize("text", ["", " ", "\n\t ", "...!!!", "，。！？", "— ~ @ #", "the a of"])
def test_empty_punctuation_or_stopwords_only_gives_nothing(text: str) -> None:
    assert tokenize(text) == []
    assert document_sparse(text) == ([], [])
    assert query_sparse(text) == ([], [])


@pytest.mark.parametrize(
    "forms",
    [
        ("cat", "cats"),
        ("study", "studies", "studied", "studying"),
        ("run", "running"),
        ("stop", "stops", "stopped", "stopping"),
        ("box", "boxes"),
        ("make", "makes", "making"),
        ("class", "classes"),
        ("fall", "falls", "falling"),
        ("play", "plays", "played", "playing"),
        ("meeting", "meetings", "meet"),
    ],
)
def test_stemmer_conflates_regular_forms(forms: tuple[str, ...]) -> None:
    assert len({stem(form) for form in forms}) == 1, [stem(form) for form in forms]


@pytest.mark.parametrize("word", ["class", "status", "bus", "gas", "thing", "need", "42", "café"])
def test_stemmer_leaves_short_or_protected_words(word: str) -> None:
    assert stem(word) == word


def test_every_stopword_is_dropped() -> None:
    assert tokenize(" ".join(sorted(ENGLISH_STOPWORDS))) == []
    assert tokenize(" ".join(sorted(CJK_STOPWORDS))) == []


@given(st.text(max_size=80))
def test_tokens_are_clean_and_normalisation_is_idempotent(text: str) -> None:
    tokens = tokenize(text)
    assert all(token and not any(c.isspace() for c in token) for token in tokens)
    assert not [t for t in tokens if len(t) == 1 and t in CJK_STOPWORDS]
    assert tokenize(normalise(text)) == tokens
    assert tokenize(text) == tokens


# --- term indices ----------------------------------------------------------------

KNOWN_INDICES = {"hello": 1785136887, "上海": 1301043667, "": 309448485}


def test_term_index_has_known_values() -> None:
    assert {term: term_index(term) for term in KNOWN_INDICES} == KNOWN_INDICES


def test_term_index_and_vectors_are_the_same_in_another_process() -> None:
    code = (
        "from processors.recall import term_index, document_sparse\n"
        f"print([term_index(t) for t in {sorted(KNOWN_INDICES)!r}])\n"
        "print(document_sparse('我喜欢喝茶 cats and dogs running'))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == [
        str([KNOWN_INDICES[t] for t in sorted(KNOWN_INDICES)]),
        str(document_sparse("我喜欢喝茶 cats and dogs running")),
    ]


@given(st.text(max_size=30))
def test_term_index_is_a_31_bit_non_negative_int(term: str) -> None:
    assert 0 <= term_index(term) < 2**31
    assert term_index(term) == term_index(term)


# --- BM25 ------------------------------------------------------------------------


def weight(text: str, term: str, **bm25: float) -> float:
    indices, values = document_sparse(text, **bm25)
    return dict(zip(indices, values, strict=True))[term_index(term)]


def test_bm25_document_weight_has_the_formula_value() -> None:
    # len 3, norm = 1.2 * (0.25 + 0.75 * 3 / 32)
    norm = 1.2 * (0.25 + 0.75 * 3 / 32)
    assert weight("cat cat dog", "cat") == pytest.approx(2 * 2.2 / (2 + norm))
    assert weight("cat cat dog", "dog") == pytest.approx(2.2 / (1 + norm))
    assert weight("cat dog", "cat", avg_len=2.0) == pytest.approx(1.0)


def test_bm25_saturates_with_term_frequency() -> None:
    weights = [weight(" ".join(["cat"] * tf), "cat", b=0.0) for tf in range(1, 30)]
    gains = [after - before for before, after in itertools.pairwise(weights)]
    assert all(gain > 0 for gain in gains)
    assert all(later < earlier for earlier, later in itertools.pairwise(gains))
    assert weights[-1] < 1.2 + 1


def test_bm25_shrinks_with_document_length() -> None:
    filler = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "iota", "kappa"]
    weights = [weight(" ".join(["cat", *filler[:n]]), "cat") for n in range(len(filler))]
    assert all(later < earlier for earlier, later in itertools.pairwise(weights))
    assert weight("cat " + " ".join(filler), "cat", b=0.0) == pytest.approx(1.0)


def test_cjk_unigrams_are_indexed_but_do_not_count_in_length() -> None:
    assert term_index("茶") in document_sparse("我喜欢茶")[0]
    assert term_index("茶") in query_sparse("茶")[0]
    # two bigrams + two unigrams, as long as two English words
    assert weight("上海天", "上海") == pytest.approx(weight("shanghai city", "shanghai"))


def test_sparse_vectors_are_sorted_and_query_weights_are_one() -> None:
    indices, values = query_sparse("cats and dogs, cats again")
    assert indices == sorted({term_index("cat"), term_index("dog"), term_index("again")})
    assert values == [1.0, 1.0, 1.0]


def test_colliding_terms_are_summed(monkeypatch: pytest.MonkeyPatch) -> None:
    cat, dog = weight("cat dog dog", "cat"), weight("cat dog dog", "dog")
    monkeypatch.setattr(recall, "term_index", lambda term: 7)
    assert document_sparse("cat dog dog") == ([7], [dog + cat])
    assert query_sparse("cat dog") == ([7], [2.0])


@pytest.mark.parametrize("bm25", [{"k1": -1.0}, {"b": 1.5}, {"b": -0.1}, {"avg_len": 0.0}])
def test_bad_bm25_parameters_are_refused(bm25: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        document_sparse("cat", **bm25)


@given(st.text(max_size=120))
def test_sparse_vectors_are_well_formed(text: str) -> None:
    for indices, values in (document_sparse(text), query_sparse(text)):
        assert indices == sorted(set(indices))
        assert len(values) == len(indices)
        assert all(v > 0 and math.isfinite(v) for v in values)


# --- fusion ----------------------------------------------------------------------


def test_rrf_known_values() -> None:
    fused = rrf([["a", "b", "c"], ["b", "a"]], k=60)
    assert fused == {"a": 1 / 61 + 1 / 62, "b": 1 / 62 + 1 / 61, "c": 1 / 63}
    assert rrf([["a", "b"]], k=0) == {"a": 1.0, "b": 0.5}
    assert rrf([]) == {}
    assert rrf([[], []]) == {}


def test_rrf_counts_a_repeat_once_at_its_best_rank() -> None:
    assert rrf([["a", "a", "b"]], k=0) == {"a": 1.0, "b": 0.5}


def test_rrf_maximum_is_first_in_every_ranking() -> None:
    fused = rrf([["a", "b"], ["a", "c"]])
    assert fused["a"] == pytest.approx(max_rrf(2))
    assert max(fused.values()) <= max_rrf(2)


def test_rrf_refuses_negative_k() -> None:
    with pytest.raises(ValueError):
        rrf([["a"]], k=-1)


# --- scoring and ranking ---------------------------------------------------------


def cand(memory_id: str = "m", **changes: Any) -> Candidate:
    base = Candidate(
        id=memory_id,
        rrf=max_rrf(2, WEIGHTS.rrf_k) / 2,
        importance=5.0,
        strength=10.0,
        reinforcements=0,
        last_reinforced_at=NOW - timedelta(days=1),
        created_at=NOW - timedelta(days=1),
        layer="L2",
    )
    return replace(base, **changes)


def ranked(
    candidates: list[Candidate], weights: RecallWeights = WEIGHTS, k: int = 10
) -> list[ScoredMemory]:
    return rank(candidates, now=NOW, weights=weights, forgetting=FORGETTING, k=k)


def ids(scored: list[ScoredMemory]) -> list[str]:
    return [s.id for s in scored]


def test_score_parts_have_their_documented_values() -> None:
    memory = cand(importance=10.0, created_at=NOW - timedelta(days=7))
    scored = score(memory, now=NOW, weights=WEIGHTS, forgetting=FORGETTING)
    assert scored.relevance == pytest.approx(0.5)
    assert scored.retention == retention(
        Trace(strength_days=10.0, last_reinforced_at=NOW - timedelta(days=1)), NOW, FORGETTING
    )
    assert scored.retention == pytest.approx(math.exp(-0.1), abs=1e-6)
    assert scored.recency == pytest.approx(0.5)
    assert scored.importance == 1.0
    expected = (1.0 * 0.5 + 0.3 * scored.retention + 0.1 * 0.5 + 0.1 * 1.0) / 1.5
    assert scored.score == pytest.approx(expected)
    assert scored.rrf == memory.rrf


def test_relevance_is_normalised_and_capped() -> None:
    top = score(
        cand(rrf=max_rrf(2, WEIGHTS.rrf_k)), now=NOW, weights=WEIGHTS, forgetting=FORGETTING
    )
    over = score(cand(rrf=1.0), now=NOW, weights=WEIGHTS, forgetting=FORGETTING)
    none = score(cand(rrf=0.0), now=NOW, weights=WEIGHTS, forgetting=FORGETTING)
    assert (top.relevance, over.relevance, none.relevance) == (1.0, 1.0, 0.0)
    one_list = RecallWeights(rankings=1, rrf_k=0)
    assert score(cand(rrf=0.5), now=NOW, weights=one_list, forgetting=FORGETTING).relevance == 0.5


def test_more_relevant_wins_at_equal_everything_else() -> None:
    assert ids(ranked([cand("a", rrf=0.01), cand("b", rrf=0.02)])) == ["b", "a"]


def test_higher_retention_wins_at_equal_relevance() -> None:
    weak, strong = cand("a", strength=0.5), cand("b", strength=50.0)
    assert ids(ranked([weak, strong])) == ["b", "a"]
    stale = cand("a", last_reinforced_at=NOW - timedelta(days=20))
    assert ids(ranked([stale, cand("b")])) == ["b", "a"]


@pytest.mark.parametrize(
    ("part", "worse", "better"),
    [
        ("relevance", {"rrf": 0.001}, {"rrf": 0.03}),
        ("retention", {"strength": 0.1}, {"strength": 100.0}),
        ("recency", {"created_at": NOW - timedelta(days=90)}, {"created_at": NOW}),
        ("importance", {"importance": 1.0}, {"importance": 10.0}),
    ],
)
def test_a_zero_weight_removes_its_part(
    part: str, worse: dict[str, Any], better: dict[str, Any]
) -> None:
    # worse is "z", better "a": with the part weighted, better wins; without, the tie goes by id
    pair = [cand("z", **worse), cand("a", **better)]
    assert ids(ranked(pair)) == ["a", "z"]
    pair = [cand("a", **worse), cand("z", **better)]
    assert ids(ranked(pair)) == ["z", "a"]
    without = WEIGHTS.model_copy(update={part: 0.0})
    scores = ranked(pair, without)
    assert scores[0].score == scores[1].score
    assert ids(scores) == ["a", "z"]


def test_only_one_weight_makes_the_score_that_part() -> None:
    only = RecallWeights(relevance=0.0, retention=0.0, recency=0.0, importance=2.0)
    scored = score(cand(importance=7.0), now=NOW, weights=only, forgetting=FORGETTING)
    assert scored.score == pytest.approx(scored.importance) == pytest.approx(6 / 9)


def test_ties_are_broken_by_id() -> None:
    memories = [cand(memory_id) for memory_id in ["m2", "b", "m10", "a"]]
    assert ids(ranked(memories)) == ["a", "b", "m10", "m2"]
    assert ids(ranked(memories[::-1])) == ["a", "b", "m10", "m2"]


def test_rank_keeps_the_top_k() -> None:
    memories = [cand(str(i), rrf=i / 1000) for i in range(10)]
    assert ids(ranked(memories, k=3)) == ["9", "8", "7"]
    assert ranked(memories, k=0) == []
    assert len(ranked(memories, k=50)) == 10


@pytest.mark.parametrize("curve", CURVES)
@pytest.mark.parametrize("protected", [{"layer": "L3"}, {"promoted": True}])
def test_promoted_and_l3_memories_are_fully_retained(
    curve: Curve, protected: dict[str, Any]
) -> None:
    old = cand(strength=0.01, last_reinforced_at=NOW - timedelta(days=3000), **protected)
    scored = score(old, now=NOW, weights=WEIGHTS, forgetting=PARAMS[curve])
    assert scored.retention == 1.0
    plain = replace(old, layer="L2", promoted=False)
    assert score(plain, now=NOW, weights=WEIGHTS, forgetting=PARAMS[curve]).retention < 0.5


def test_a_memory_from_the_future_is_fully_retained_and_recent() -> None:
    soon = cand(created_at=NOW + timedelta(days=1), last_reinforced_at=NOW + timedelta(days=1))
    scored = score(soon, now=NOW, weights=WEIGHTS, forgetting=FORGETTING)
    assert (scored.retention, scored.recency) == (1.0, 1.0)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        score(cand(), now=datetime(2024, 6, 1), weights=WEIGHTS, forgetting=FORGETTING)
    with pytest.raises(ValueError, match="distinct"):
        ranked([cand("a"), cand("a")])
    with pytest.raises(ValueError):
        ranked([cand()], k=-1)
    bad_fields: list[dict[str, Any]] = [
        {"id": ""},
        {"rrf": -0.1},
        {"rrf": math.nan},
        {"importance": 0.5},
        {"importance": 11.0},
        {"strength": 0.0},
        {"strength": math.inf},
        {"reinforcements": -1},
        {"last_reinforced_at": datetime(2024, 1, 1)},
        {"created_at": datetime(2024, 1, 1)},
        {"layer": "L4"},
    ]
    for fields in bad_fields:
        with pytest.raises(ValueError):
            cand(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"relevance": 0.0, "retention": 0.0, "recency": 0.0, "importance": 0.0},
        {"relevance": -1.0},
        {"retention": math.inf},
        {"recency_half_life_days": 0.0},
        {"rankings": 0},
        {"rrf_k": -1},
        {"surprise": 1.0},
    ],
)
def test_bad_weights_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        RecallWeights.model_validate(fields)


# --- retention matches the forgetting module ------------------------------------

gaps = st.integers(min_value=0, max_value=120 * 86_400_000).map(
    lambda ms: timedelta(milliseconds=ms)
)


@given(
    curve=st.sampled_from(CURVES),
    importance=st.floats(min_value=1.0, max_value=10.0),
    steps=st.lists(st.tuples(st.sampled_from(["reinforce", "weaken"]), gaps), max_size=6),
    query_offset=st.integers(min_value=-3 * 86_400_000, max_value=400 * 86_400_000),
)
def test_candidate_retention_is_the_forgetting_curve(
    curve: Curve, importance: float, steps: list[tuple[str, timedelta]], query_offset: int
) -> None:
    params = PARAMS[curve]
    at = NOW
    trace = new_trace(importance, at, params)
    for op, gap in steps:
        at += gap
        trace = (reinforce if op == "reinforce" else weaken)(trace, at, params)
    clock = trace.last_reinforced_at
    if trace.card is not None and trace.card.last_review is not None:
        clock = trace.card.last_review  # under fsrs a lapse restarts the clock too
    now = at + timedelta(milliseconds=query_offset, microseconds=query_offset % 1000)
    expected = retention(trace, now, params)
    assert candidate_retention(trace.strength_days, clock, now, params) == expected
    memory = cand(strength=trace.strength_days, last_reinforced_at=clock)
    assert score(memory, now=now, weights=WEIGHTS, forgetting=params).retention == expected


# --- properties of rank ----------------------------------------------------------

moments = st.integers(min_value=-400 * 86_400, max_value=30 * 86_400).map(
    lambda s: NOW + timedelta(seconds=s)
)
candidates = st.builds(
    Candidate,
    id=st.text(min_size=1, max_size=6),
    rrf=st.floats(min_value=0.0, max_value=0.05),
    importance=st.floats(min_value=1.0, max_value=10.0),
    strength=st.floats(min_value=0.01, max_value=36_500.0),
    reinforcements=st.integers(min_value=0, max_value=50),
    last_reinforced_at=moments,
    created_at=moments,
    layer=st.sampled_from(["L1", "L2", "L3"]),
    promoted=st.booleans(),
)
weights = st.builds(
    lambda parts, half_life: RecallWeights(
        relevance=parts[0],
        retention=parts[1],
        recency=parts[2],
        importance=parts[3],
        recency_half_life_days=half_life,
    ),
    st.tuples(*[st.floats(min_value=0.0, max_value=1000.0)] * 4).filter(any),
    st.floats(min_value=0.01, max_value=365.0),
)
pools = st.lists(candidates, max_size=12, unique_by=lambda c: c.id)


@given(pools, st.data(), weights, st.sampled_from(CURVES), st.integers(0, 15))
def test_rank_is_deterministic_and_order_independent(
    pool: list[Candidate], data: st.DataObject, chosen: RecallWeights, curve: Curve, k: int
) -> None:
    params = PARAMS[curve]
    shuffled = data.draw(st.permutations(pool))
    first = rank(pool, now=NOW, weights=chosen, forgetting=params, k=k)
    assert rank(shuffled, now=NOW, weights=chosen, forgetting=params, k=k) == first
    assert rank(pool, now=NOW, weights=chosen, forgetting=params, k=k) == first
    assert len(first) == min(k, len(pool))
    keys = [(-s.score, s.id) for s in first]
    assert keys == sorted(keys)


@given(pools, weights, st.sampled_from(CURVES), st.integers(0, 15), moments)
def test_rank_is_the_top_k_of_every_score(
    pool: list[Candidate], chosen: RecallWeights, curve: Curve, k: int, now: datetime
) -> None:
    """Ranking scores every candidate once and builds the kept ones only: the same
    models, with the same values, as :func:`score` of each, sorted."""
    params = PARAMS[curve]
    every = [score(c, now=now, weights=chosen, forgetting=params) for c in pool]
    every.sort(key=lambda s: (-s.score, s.id))
    assert rank(pool, now=now, weights=chosen, forgetting=params, k=k) == every[:k]


@given(candidates, weights, st.sampled_from(CURVES), moments)
def test_scores_are_finite_and_in_range(
    memory: Candidate, chosen: RecallWeights, curve: Curve, now: datetime
) -> None:
    scored = score(memory, now=now, weights=chosen, forgetting=PARAMS[curve])
    parts = [scored.score, scored.relevance, scored.retention, scored.recency, scored.importance]
    assert all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in parts)
    assert min(parts[1:]) - 1e-9 <= scored.score <= max(parts[1:]) + 1e-9
    if memory.promoted or memory.layer == "L3":
        assert scored.retention == 1.0
