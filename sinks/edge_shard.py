"""The write half of one Qdrant Edge shard, in the shapes both of its owners use.

:class:`sinks.vectors.EdgeIndex` writes its shards through :class:`ShardWriter` in
its own process; :mod:`sinks.edge_process` runs the same writer in a child process
that owns a version being rebuilt. One code path for both, so a point written
either way is the same point.

Imports nothing but ``qdrant_edge``: a child starts in a tenth of a second
(``sinks.vectors`` imports ``qdrant_client``, over a second).

Inputs are plain values, already checked by the caller: point ids in canonical
UUID form (:func:`sinks.vectors.canonical_id`), payloads as JSON-like dicts, an
upsert as a :data:`WirePoint` tuple.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import qdrant_edge as qe

DENSE = "dense"
SPARSE = "sparse"

WirePoint = tuple[str, list[float] | None, list[int] | None, list[float] | None, dict[str, Any]]
"""A whole point: id, dense vector (or None), sparse indices and values (or None),
payload."""


def check_dims(vector: Sequence[float], dims: int) -> None:
    """ValueError unless ``vector`` has ``dims`` dimensions."""
    if len(vector) != dims:
        raise ValueError(f"dense vector has {len(vector)} dimensions, the collection {dims}")


def edge_point(point: WirePoint) -> qe.Point:
    """Edge's point: its constructor converts the lists and the payload into values of
    its own (no copies needed; a copy of a 512-float list costs more than it seems)."""
    point_id, dense, indices, values, payload = point
    vectors: dict[str, Any] = {}
    if dense is not None:
        vectors[DENSE] = dense
    if indices is not None and values is not None:
        vectors[SPARSE] = qe.SparseVector(indices, values)
    return qe.Point(point_id, vectors, payload)


def has_id(point_id: str) -> qe.Filter:
    """The point ``point_id`` alone."""
    return qe.Filter(must=[qe.HasIdCondition({point_id})])


def owned(agent_id: str, user_id: str | None) -> qe.Filter:
    """Points of ``agent_id`` whose user is ``user_id`` (None: no user)."""
    agent = qe.FieldCondition("agent_id", match=qe.MatchValue(agent_id))
    user = (
        qe.IsNullCondition("user_id")
        if user_id is None
        else qe.FieldCondition("user_id", match=qe.MatchValue(user_id))
    )
    return qe.Filter(must=[agent, user])


class ShardWriter:
    """Writes to one Edge shard with dense vectors of ``dims``; ``sync`` flushes to
    disk after every call. Not locked: the owner serializes calls (call order is
    apply order). Semantics are :class:`sinks.vectors.VectorIndex`'s writes."""

    def __init__(self, shard: qe.EdgeShard, dims: int, *, sync: bool = False) -> None:
        self.shard = shard
        self.dims = dims
        self.sync = sync

    def apply(self, operations: Sequence[qe.UpdateOperation]) -> None:
        """Apply ``operations`` in order (then flush, when ``sync``)."""
        for operation in operations:
            self.shard.update(operation)
        if self.sync and operations:
            self.shard.flush()

    def upsert(self, points: Sequence[WirePoint]) -> None:
        """Insert or replace whole points (last one wins for a repeated id)."""
        if not points:
            return
        for point in points:
            if point[1] is not None:
                check_dims(point[1], self.dims)
        self.apply([qe.UpdateOperation.upsert_points([edge_point(p) for p in points])])

    def set_dense(self, items: Sequence[tuple[str, list[float]]]) -> None:
        """Set the dense vector of the points that exist; unknown ids are skipped
        (Edge raises on them: read which exist first)."""
        if not items:
            return
        for _, vector in items:
            check_dims(vector, self.dims)
        ids: list[qe.PointId] = list(dict.fromkeys(point_id for point_id, _ in items))
        known = {str(r.id) for r in self.shard.retrieve(ids, False, False)}
        updates = [qe.PointVectors(i, {DENSE: list(v)}) for i, v in items if i in known]
        if updates:
            self.apply([qe.UpdateOperation.update_vectors(updates)])

    def set_payload(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Merge each dict into its point's payload (by filter: unknown ids skipped)."""
        if items:
            self.apply(
                [
                    qe.UpdateOperation.set_payload_by_filter(has_id(point_id), dict(payload))
                    for point_id, payload in items
                ]
            )

    def erase(self, agent_id: str, user_id: str | None) -> int:
        """Delete the points of ``agent_id`` whose user is ``user_id``; how many went."""
        selector = owned(agent_id, user_id)
        found: int = self.shard.count(qe.CountRequest(exact=True, filter=selector))
        if found:
            self.apply([qe.UpdateOperation.delete_points_by_filter(selector)])
        return found
