"""Hybrid recall: dense and sparse candidates, fused, re-weighted by retention.

:meth:`Recaller.recall` embeds the query (the index's model), asks the vector
store for the best dense and the best sparse (BM25-style) candidates of the
agent — the store builds the filter from a :class:`Scope`, so no query reaches
another agent's points; both searches go as one batch when the store is a
:class:`~sinks.vectors.HybridSearch` — fuses the two rankings by reciprocal rank
fusion, then re-weights each candidate by its retention R at the time of the
query, its recency and its importance (:class:`RecallWeights`). Ties break by
memory id, so equal stores give equal answers.

The caller records the recall as a ``memory.recalled`` event (see
:func:`recalled_event`); the forgetting processor turns it into reinforcement.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from engram.results import RecalledMemory
from processors import MemoryConfig
from processors.recall import Candidate, RecallWeights, query_sparse, rank, rrf
from schemas import MemoryRecalled
from schemas.derived import Layer
from sinks.embedding import Embedder
from sinks.vectors import Hit, HybridSearch, Scope, SparseVector, VectorIndex

LAYERS = ("L2", "L3")


class Recaller:
    """Hybrid, retention-weighted recall over one :class:`VectorIndex`.

    ``candidates`` is how many points each of the dense and sparse searches
    returns before fusion (at least ``k``). ``query_cache`` is how many recent query
    vectors are kept (0: none), so a query asked again (an agent polling the same
    question, a task description recalled every turn) is not embedded again: an
    embedder gives the same text the same vector bit for bit, so the answers are the
    same with or without the cache. Thread-safe.
    """

    def __init__(
        self,
        index: VectorIndex,
        embedder: Embedder,
        *,
        config: MemoryConfig | None = None,
        weights: RecallWeights | None = None,
        candidates: int = 50,
        query_cache: int = 0,
    ) -> None:
        if query_cache < 0:
            raise ValueError("query_cache must be 0 or more")
        self.index = index
        self.embedder = embedder
        self.config = config or MemoryConfig()
        self.weights = weights or RecallWeights()
        self.candidates = candidates
        self.query_cache = query_cache
        self._vectors: OrderedDict[str, list[float]] = OrderedDict()
        self._vectors_lock = threading.Lock()

    def recall(
        self,
        query: str,
        *,
        agent_id: str,
        user_id: str | None = None,
        k: int = 10,
        layers: Sequence[str] | None = None,
        min_importance: float | None = None,
        weights: RecallWeights | None = None,
        include_forgotten: bool = False,
        now: datetime | None = None,
    ) -> list[RecalledMemory]:
        """The ``k`` best memories of ``agent_id`` (and ``user_id``) for ``query``.

        Raises ``ValueError`` for an empty agent id, ``k`` outside 1..1000, an
        unknown layer or a naive ``now``.
        """
        if not 1 <= k <= 1000:
            raise ValueError("k must be between 1 and 1000")
        if layers is not None and any(layer not in LAYERS for layer in layers):
            raise ValueError(f"layers must be among {', '.join(LAYERS)}")
        now = now or datetime.now(UTC)
        if now.tzinfo is None:
            raise ValueError("now must be an aware datetime")
        scope = Scope(
            agent_id=agent_id,
            user_id=user_id,
            layers=tuple(layers) if layers is not None else None,
            min_importance=min_importance,
            include_forgotten=include_forgotten,
        )
        limit = max(self.candidates, k)
        dense, sparse = self._search(query, scope, limit)
        return self._ranked(dense, sparse, now, weights or self.weights, k)

    def _search(self, query: str, scope: Scope, limit: int) -> tuple[list[Hit], list[Hit]]:
        """The dense and the sparse candidates of ``query`` in ``scope`` (no sparse ones
        when the query has no index terms): one batch when the index can run both
        searches together (:class:`HybridSearch`), else one search after the other."""
        vector = self._query_vector(query)
        indices, values = query_sparse(query)
        terms = SparseVector(indices=indices, values=values) if indices else None
        if isinstance(self.index, HybridSearch):
            return self.index.search_hybrid(vector, terms, scope, limit)
        dense = self.index.search_dense(vector, scope, limit)
        return dense, [] if terms is None else self.index.search_sparse(terms, scope, limit)

    def _query_vector(self, query: str) -> list[float]:
        """The query's vector, from the cache of recent queries when it is there (the
        searches only read it)."""
        if not self.query_cache:
            return self.embedder.embed_query(query)
        with self._vectors_lock:
            vector = self._vectors.get(query)
            if vector is not None:
                self._vectors.move_to_end(query)
                return vector
        vector = self.embedder.embed_query(query)
        with self._vectors_lock:
            self._vectors[query] = vector
            while len(self._vectors) > self.query_cache:
                self._vectors.popitem(last=False)
        return vector

    def _ranked(
        self,
        dense: list[Hit],
        sparse: list[Hit],
        now: datetime,
        weights: RecallWeights,
        k: int,
    ) -> list[RecalledMemory]:
        fused = rrf([[h.id for h in dense], [h.id for h in sparse]], k=weights.rrf_k)
        payloads = {h.id: h.payload for h in [*sparse, *dense]}
        fsrs = self.config.forgetting.curve == "fsrs"
        clock = "last_review_at" if fsrs else "last_reinforced_at"
        candidates = [
            _candidate(memory_id, fused[memory_id], payloads[memory_id], clock)
            for memory_id in fused
        ]
        ranked = rank(candidates, now=now, weights=weights, forgetting=self.config.forgetting, k=k)
        return [_recalled(scored, payloads[scored.id]) for scored in ranked]


def _when(ms: Any) -> datetime:
    return datetime.fromtimestamp(int(ms) / 1000, tz=UTC)


def _candidate(memory_id: str, fused: float, payload: dict[str, Any], clock: str) -> Candidate:
    """``clock`` names the payload field retention counts from: the last reinforcement
    (exponential curve) or the last review, a weakening included (FSRS). A memory never
    reinforced has its clock at its creation: that datetime is made once."""
    created_ms = payload["created_at"]
    created = _when(created_ms)
    clock_ms = payload.get(clock, payload["last_reinforced_at"])
    return Candidate(
        id=memory_id,
        rrf=fused,
        importance=float(payload["importance"]),
        strength=float(payload["strength"]),
        reinforcements=int(payload.get("reinforcements", 0)),
        last_reinforced_at=created if clock_ms == created_ms else _when(clock_ms),
        created_at=created,
        layer=cast(Layer, payload["layer"]),
        promoted=bool(payload.get("promoted", False)),
    )


def _recalled(scored: Any, payload: dict[str, Any]) -> RecalledMemory:
    return RecalledMemory(
        memory_id=scored.id,
        text=str(payload.get("text", "")),
        layer=str(payload["layer"]),
        kind=str(payload.get("kind", "")),
        score=scored.score,
        relevance=scored.relevance,
        retention=scored.retention,
        recency=scored.recency,
        importance=float(payload["importance"]),
        strength=float(payload["strength"]),
        reinforcements=int(payload.get("reinforcements", 0)),
        forgotten=bool(payload.get("forgotten", False)),
        session_id=payload.get("session_id"),
        user_id=payload.get("user_id"),
        created_at=_when(payload["created_at"]),
        last_reinforced_at=_when(payload["last_reinforced_at"]),
        sources=list(payload.get("sources", [])),
    )


def recalled_event(
    query: str,
    agent_id: str,
    memories: Sequence[RecalledMemory],
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    at: datetime | None = None,
) -> MemoryRecalled:
    """The ``memory.recalled`` event that records a recall (what was returned, with
    which scores) so the forgetting processor reinforces what was recalled."""
    return MemoryRecalled(
        event_id=uuid.uuid4(),
        agent_id=agent_id,
        user_id=user_id,
        session_id=session_id,
        occurred_at=at or datetime.now(UTC),
        body={
            "query": query,
            "memory_ids": [m.memory_id for m in memories],
            "scores": [round(m.score, 6) for m in memories],
        },
    )
