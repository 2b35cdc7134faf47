"""The vector projection of memories: one protocol, two stores, one contract suite.

``VectorIndex`` is the seam; ``EdgeIndex`` (Qdrant Edge, in-process, the embedded
default) and ``ClientIndex`` (qdrant-client: a Qdrant server in production, local
mode in tests) implement it and are held to ``tests/integration/test_vector_index.py``.

Guarantees of every implementation:

- **Idempotent by point id** (the memory id, a UUID). ``upsert`` replaces the whole
  point (vectors and payload), like Qdrant's upsert: applying a batch twice equals
  applying it once. ``set_dense`` and ``set_payload`` touch only what they name, and
  ids that do not exist are skipped without error (a redelivered update for a memory
  that is not there yet, or any more, changes nothing).
- **Durable when a write returns**: Edge has applied it and appended it to its
  write-ahead log, which is replayed on load, so it survives a killed process
  (Edge does not fsync per write: a machine crash can lose the last writes unless
  ``EdgeIndex(root, sync=True)``, which flushes to disk after every write call);
  the client waited for the server (``wait=True``), or local mode committed it to
  sqlite.
- **Ordered**: writes of one handle apply in call order.
- **Erasable**: ``erase(agent_id, user_id)`` deletes a subject's points of an agent
  by filter in every version (live, kept, being rebuilt); once erased, again is a no-op.
- **Isolated**: every read is filtered by a ``Scope`` that the sink turns into a
  Qdrant filter itself (``scope_conditions``). ``agent_id`` always matches exactly;
  there is no way to pass a raw filter in, and no read without an agent.

Both also implement ``HybridSearch``: a recall's dense and sparse searches as one
batch (Edge's ``query_batch``, qdrant-client's ``query_batch_points``), with exactly
the answers of the two searches made one after the other.

Points carry a named dense vector ``"dense"`` (cosine) and a named sparse vector
``"sparse"`` with the IDF modifier: the projection stores term frequencies on the
document side, the store multiplies by IDF at query time, so BM25-style scoring
happens inside Qdrant. The IDF corpus of a sparse search is the tenant (the agent,
and the user when the scope names one), so one agent's scores never depend on
another agent's memories.

Versions (blue/green rebuilds): collections are ``memories_v{n}``; the live one is
named by the alias ``memories`` (client) or by ``live.json`` in the Edge root (Edge
has no aliases: one shard is one directory). Reads always go to the live version;
writes go to the live version, or to the version chosen with ``use_version(n)``
until it is swapped live.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import math
import os
import re
import shutil
import threading
import uuid
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import numpy as np
import qdrant_edge as qe

from sinks.edge_process import ShardProcess
from sinks.edge_shard import DENSE, SPARSE, ShardWriter, WirePoint, check_dims

if TYPE_CHECKING:
    from qdrant_client import QdrantClient
    from qdrant_client import models as qm
else:

    class _Models(ModuleType):
        """``qdrant_client.models``, imported when first used: only a
        :class:`ClientIndex` needs qdrant-client, which takes over a second to import,
        and ``engram up`` on Qdrant Edge (the default) and the commands that open its
        index never use one."""

        def __getattr__(self, name: str) -> Any:
            from qdrant_client import models

            return getattr(models, name)

    qm = _Models("qdrant_client.models")

ALIAS = "memories"
POINTER = "live.json"
KEYWORD_FIELDS = ("agent_id", "user_id", "session_id", "layer")
FLOAT_FIELDS = ("importance",)
BOOL_FIELDS = ("forgotten", "invalidated", "promoted")
_VERSION_NAME = re.compile(r"^memories_v([1-9][0-9]*)$")


def collection_name(version: int) -> str:
    """``memories_v{n}``: the name of version ``n`` (a collection, or an Edge directory)."""
    if version < 1:
        raise ValueError(f"versions start at 1, got {version}")
    return f"memories_v{version}"


def _version_of(name: str) -> int | None:
    match = _VERSION_NAME.match(name)
    return int(match.group(1)) if match else None


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class SparseVector:
    """Term ids (e.g. hashed tokens, any language) with their document-side weights.

    Indices are unique and fit in 32 bits; ``values`` has one weight per index.
    """

    indices: list[int]
    values: list[float]

    def __post_init__(self) -> None:
        if len(self.indices) != len(self.values):
            raise ValueError("a sparse vector needs one value per index")
        if len(set(self.indices)) != len(self.indices):
            raise ValueError("sparse vector indices must be unique")
        if self.indices and not (min(self.indices) >= 0 and max(self.indices) < 2**32):
            raise ValueError("sparse vector indices must fit in 32 bits")

    @classmethod
    def vouched(cls, indices: list[int], values: list[float]) -> SparseVector:
        """A sparse vector from the BM25 weights of :mod:`processors.recall` (computed
        by :func:`~processors.recall.document_sparse`, or recorded and vouched for by
        :func:`streams.vectors.recorded_terms`): indices ascending and in ``[0, 2**32)``,
        one value each, so the checks of ``__post_init__`` are skipped. They were a
        fifth of a vector rebuild's reading time (a set, a min and a max per text)."""
        vector = object.__new__(cls)
        object.__setattr__(vector, "indices", indices)
        object.__setattr__(vector, "values", values)
        return vector


@dataclass(frozen=True)
class Point:
    """One memory: ``id`` is the memory id (a UUID, kept in canonical form).

    ``dense`` may be missing (the embedding arrives later, see ``set_dense``);
    ``payload`` must name a non-empty ``agent_id``, or no scope could ever read it.
    """

    id: str
    dense: list[float] | None
    sparse: SparseVector | None
    payload: dict[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", canonical_id(self.id))
        agent = self.payload.get("agent_id")
        if not isinstance(agent, str) or not agent:
            raise ValueError(f"point {self.id}: payload needs a non-empty agent_id")


@dataclass(frozen=True)
class Hit:
    """A point read back: id, score (0.0 for ``get``) and its whole payload."""

    id: str
    score: float
    payload: dict[str, Any]


@dataclass(frozen=True)
class Scope:
    """Whose memories a read may see. ``agent_id`` is mandatory and matched exactly.

    ``user_id`` narrows to one user; ``layers`` to some layers ("L2", "L3");
    ``min_importance`` keeps importance >= the bound. Forgotten and invalidated
    memories are left out unless ``include_forgotten``.
    """

    agent_id: str
    user_id: str | None = None
    layers: tuple[str, ...] | None = None
    min_importance: float | None = None
    include_forgotten: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.agent_id, str) or not self.agent_id:
            raise ValueError("a scope needs a non-empty agent_id")
        if self.user_id is not None and (not isinstance(self.user_id, str) or not self.user_id):
            raise ValueError("user_id must be a non-empty string or None")
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(self.layers))
            if not self.layers or not all(isinstance(x, str) for x in self.layers):
                raise ValueError("layers must be a non-empty tuple of strings or None")
        if self.min_importance is not None and not math.isfinite(self.min_importance):
            raise ValueError("min_importance must be a finite number or None")


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def canonical_id(value: str) -> str:
    """The canonical string of a UUID (ValueError if ``value`` is not one); a string
    already canonical is returned as it is (what ``str(uuid.UUID(value))`` gives)."""
    if type(value) is str and _CANONICAL_UUID.fullmatch(value):
        return value
    try:
        return str(uuid.UUID(value))
    except (ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"point ids are UUID strings, got {value!r}") from error


# --------------------------------------------------------------------------- filters


@dataclass(frozen=True)
class Equals:
    """Payload ``key`` equals ``value`` (keyword or bool)."""

    key: str
    value: str | bool


@dataclass(frozen=True)
class AnyOf:
    """Payload ``key`` is one of ``values``."""

    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class AtLeast:
    """Payload ``key`` >= ``bound``."""

    key: str
    bound: float


Condition = Equals | AnyOf | AtLeast


def tenant_conditions(scope: Scope) -> tuple[Condition, ...]:
    """The tenant of a scope: its agent, and its user when it names one."""
    agent: tuple[Condition, ...] = (Equals("agent_id", scope.agent_id),)
    return agent if scope.user_id is None else (*agent, Equals("user_id", scope.user_id))


def scope_conditions(scope: Scope) -> tuple[Condition, ...]:
    """Every condition of a scope, all required (AND): the only filter reads ever use."""
    conditions = list(tenant_conditions(scope))
    if not scope.include_forgotten:
        conditions += [Equals("forgotten", False), Equals("invalidated", False)]
    if scope.layers is not None:
        conditions.append(AnyOf("layer", scope.layers))
    if scope.min_importance is not None:
        conditions.append(AtLeast("importance", float(scope.min_importance)))
    return tuple(conditions)


# --------------------------------------------------------------------------- protocol


class VectorWriter(Protocol):
    """The writes of a vector store (every :class:`VectorIndex` is one), as the
    projection applies them: see :class:`VectorIndex` for each call's contract."""

    def upsert(self, points: Sequence[Point]) -> None: ...
    def set_dense(self, items: Sequence[tuple[str, list[float]]]) -> None: ...
    def set_payload(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None: ...
    def erase(self, agent_id: str, user_id: str | None) -> int: ...


class VectorIndex(Protocol):
    """The vector projection store. See the module docstring for the guarantees."""

    def ensure(self, dims: int) -> None:
        """Create the live version if there is none (dense cosine ``dims``, sparse with
        IDF, payload indexes); if there is one, check its dense size (ValueError)."""

    def upsert(self, points: Sequence[Point]) -> None:
        """Insert or replace whole points (last one wins for a repeated id)."""

    def set_dense(self, items: Sequence[tuple[str, list[float]]]) -> None:
        """Set the dense vector of existing points; unknown ids are skipped."""

    def set_payload(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Merge the given keys into the payload of existing points; unknown ids are
        skipped; other keys and the vectors are kept."""

    def search_dense(self, vector: list[float], scope: Scope, limit: int) -> list[Hit]:
        """Top ``limit`` points of the scope by cosine similarity, best first. Points
        without a dense vector are never returned."""

    def search_sparse(self, vector: SparseVector, scope: Scope, limit: int) -> list[Hit]:
        """Top ``limit`` points of the scope by IDF-weighted dot product, best first,
        with the tenant of the scope as the IDF corpus."""

    def get(self, ids: Sequence[str], scope: Scope) -> list[Hit]:
        """The points among ``ids`` that lie inside the scope, in the order asked."""

    def count(self, scope: Scope) -> int:
        """Exact number of points inside the scope."""

    def erase(self, agent_id: str, user_id: str | None) -> int:
        """Delete every point of ``agent_id`` whose ``user_id`` is ``user_id`` (None: the
        points without a user), in every version (live, kept or being rebuilt); return
        how many went. Idempotent: once erased, a second call deletes nothing (0)."""

    def optimize(self) -> None:
        """Build search indexes (HNSW). Slow: a maintenance step, never a request."""

    def live_version(self) -> int:
        """The version reads go to (LookupError before the first ``ensure``)."""

    def versions(self) -> list[int]:
        """Every version that exists, ascending."""

    def create_version(self, dims: int | None = None) -> int:
        """A new, empty, not-live version (dims default to the live one's)."""

    def use_version(self, version: int | None) -> None:
        """Send this handle's writes to ``version``; None follows the live version."""

    def swap(self, version: int) -> None:
        """Make ``version`` live atomically; reads move to it at once."""

    def drop_version(self, version: int) -> None:
        """Delete a version (ValueError for the live one or this handle's write
        target; a version that does not exist is a no-op)."""

    def pinned(self, version: int) -> VectorIndex:
        """A twin of this handle whose writes go to ``version`` (its reads still go to
        the live one): a rebuild fills a version through it while this handle keeps
        serving. It shares the store and the locks of this handle: never close it."""

    def points(self, version: int | None = None) -> list[Point]:
        """Every point of ``version`` (the live one by default) with its vectors and
        payload, in id order: for comparisons and audits, not for requests."""

    def close(self) -> None:
        """Release the store; idempotent. The handle is unusable afterwards."""


@runtime_checkable
class LendsVersions(Protocol):
    """An index that can hand a version's writes to another process and take them
    back (:meth:`EdgeIndex.lend`): a rebuild's writes then leave the reading process."""

    def lend(self, version: int) -> VectorWriter: ...
    def reclaim(self, version: int) -> None: ...


@runtime_checkable
class HybridSearch(Protocol):
    """An index that runs a recall's dense and sparse searches as one request."""

    def search_hybrid(
        self, dense: list[float], sparse: SparseVector | None, scope: Scope, limit: int
    ) -> tuple[list[Hit], list[Hit]]:
        """Exactly ``(search_dense(dense, scope, limit), search_sparse(sparse, scope,
        limit))``, with ``[]`` for the sparse half when ``sparse`` is None; one batch
        (one pass over the store, one round trip to a server)."""
        ...


# --------------------------------------------------------------------------- locking


class SharedLock:
    """Many holders in shared mode, or one in exclusive mode.

    A waiting exclusive holder stops new shared holders, so it cannot starve. Not
    reentrant: public methods take it, private helpers assume it is held.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                if not self._shared:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            while self._exclusive or self._shared:
                self._cond.wait()
            self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


_check_dims = check_dims


def _check_limit(limit: int) -> None:
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")


def _unique_ids(ids: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(canonical_id(i) for i in ids))


def _in_order(ids: list[str], hits: dict[str, Hit]) -> list[Hit]:
    return [hits[i] for i in ids if i in hits]


# --------------------------------------------------------------------------- Qdrant Edge


def _edge_condition(condition: Condition) -> qe.FieldCondition:
    match condition:
        case Equals(key, bool() as flag):
            # qdrant-edge-py 0.9.0 turns a Python bool in MatchValue into an integer,
            # which never matches a bool payload; numpy.bool_ is not an int, so it
            # arrives as a bool (the contract suite checks the forgotten filter).
            exact_bool: Any = np.bool_(flag)  # not a bool to mypy, exactly one to Edge
            return qe.FieldCondition(key, match=qe.MatchValue(exact_bool))
        case Equals(key, str() as word):
            return qe.FieldCondition(key, match=qe.MatchValue(word))
        case AnyOf(key, values):
            return qe.FieldCondition(key, match=qe.MatchAny(list(values)))
        case AtLeast(key, bound):
            return qe.FieldCondition(key, range=qe.RangeFloat(gte=bound))
    raise TypeError(f"unknown condition {condition!r}")


def _edge_filter(conditions: Sequence[Condition], ids: Sequence[str] = ()) -> qe.Filter:
    must: list[Any] = [_edge_condition(c) for c in conditions]
    if ids:
        must.insert(0, qe.HasIdCondition(set(ids)))
    return qe.Filter(must=must)


def _edge_dense_request(vector: list[float], scope: Scope, limit: int) -> qe.QueryRequest:
    """Top ``limit`` of the scope by cosine, with payloads."""
    return qe.QueryRequest(
        limit=limit,
        query=qe.Query.Nearest(list(vector), using=DENSE),
        filter=_edge_filter(scope_conditions(scope)),
        with_payload=True,
        with_vector=False,
    )


def _edge_sparse_request(vector: SparseVector, scope: Scope, limit: int) -> qe.QueryRequest:
    """Top ``limit`` of the scope by IDF-weighted dot product (the tenant is the IDF
    corpus), with payloads."""
    corpus = qe.IdfParams(corpus=_edge_filter(tenant_conditions(scope)))
    return qe.QueryRequest(
        limit=limit,
        query=qe.Query.Nearest(qe.SparseVector(vector.indices, vector.values), using=SPARSE),
        filter=_edge_filter(scope_conditions(scope)),
        params=qe.SearchParams(idf=corpus),
        with_payload=True,
        with_vector=False,
    )


def _edge_config(dims: int) -> qe.EdgeConfig:
    return qe.EdgeConfig(
        vectors={DENSE: qe.EdgeVectorParams(size=dims, distance=qe.Distance.Cosine)},
        sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
    )


def _edge_indexes() -> dict[str, Any]:
    indexes: dict[str, Any] = {"agent_id": qe.KeywordIndexParams(is_tenant=True)}
    indexes |= {name: qe.PayloadSchemaType.Keyword for name in KEYWORD_FIELDS[1:]}
    indexes |= {name: qe.PayloadSchemaType.Float for name in FLOAT_FIELDS}
    return indexes | {name: qe.PayloadSchemaType.Bool for name in BOOL_FIELDS}


def wire_point(point: Point) -> WirePoint:
    """``point`` as :class:`~sinks.edge_shard.ShardWriter` takes it (no copies)."""
    sparse = point.sparse
    if sparse is None:
        return point.id, point.dense, None, None, point.payload
    return point.id, point.dense, sparse.indices, sparse.values, point.payload


def _edge_hit(point: qe.ScoredPoint | qe.Record, score: float) -> Hit:
    """``point.payload`` is a new dict at every read (converted from Rust), so it is
    the hit's own without a copy."""
    return Hit(str(point.id), score, point.payload or {})


def _point_of(point_id: Any, vectors: Any, payload: dict[str, Any] | None) -> Point:
    """A ``Point`` from a record read back from either store."""
    named: dict[str, Any] = vectors if isinstance(vectors, dict) else {}
    dense, sparse = named.get(DENSE), named.get(SPARSE)
    return Point(
        id=str(point_id),
        dense=[float(x) for x in dense] if dense is not None else None,
        sparse=SparseVector(list(sparse.indices), [float(x) for x in sparse.values])
        if sparse is not None
        else None,
        payload=dict(payload or {}),
    )


def _by_id(point: Point) -> str:
    return point.id


def write_json_atomically(path: Path, value: Any) -> None:
    """Replace ``path`` with ``value`` as JSON so readers see the old or the new file,
    never a torn one, and the new one survives a crash once this returns."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump(value, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class LentVersion:
    """The writes of an Edge version lent to a writer process (:meth:`EdgeIndex.lend`):
    a :class:`VectorWriter` whose calls go to the process, one request each, in call
    order. ``erase`` deletes in this version only (the live handle's ``erase`` reaches
    every version, this one included)."""

    def __init__(self, process: ShardProcess) -> None:
        self.process = process

    def upsert(self, points: Sequence[Point]) -> None:
        if points:
            self.process.write([("upsert", [wire_point(p) for p in points])])

    def set_dense(self, items: Sequence[tuple[str, list[float]]]) -> None:
        if items:
            self.process.write([("dense", [(canonical_id(i), v) for i, v in items])])

    def set_payload(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        if items:
            self.process.write([("payload", [(canonical_id(i), p) for i, p in items])])

    def erase(self, agent_id: str, user_id: str | None) -> int:
        return self.process.write([("erase", [(agent_id, user_id)])])[0]


class EdgeIndex:
    """``VectorIndex`` on Qdrant Edge shards under one root directory.

    Layout: ``root/memories_v{n}/`` is one Edge shard per version, ``root/live.json``
    (``{"version": n}``, replaced atomically) names the live one, ``root/.lock`` is
    held while the handle is open: one process owns a root (Edge itself refuses a
    second opener of a shard directory).

    Native in Edge: points without a named vector, partial vector updates
    (``update_vectors``), the sparse IDF modifier with a per-query IDF corpus, payload
    updates by filter (so unknown ids are skipped). Emulated: aliases (the pointer
    file) and skipping unknown ids in ``set_dense`` (read which ids exist, update
    those; Edge raises on an unknown id).

    ``sync=True`` flushes the shard to disk after every write call (survives a
    machine crash, not only a killed process; about +25 ms per batch of 512 at 512
    dims).

    Thread-safety: one handle may be shared by threads. The shard engine is
    internally synchronized, so reads run alongside writes; writes are serialized
    by a lock (call order = apply order), and version changes and ``close`` wait for
    running calls and hold back new ones. ``optimize`` holds the GIL for its whole
    run (tens of seconds at 50k points): run it in a maintenance step or another
    process, never in a request path.

    Lending (rebuilds): :meth:`lend` hands a version that is not live to a writer
    process (:mod:`sinks.edge_process`), which alone has its shard open until
    :meth:`reclaim` (or :meth:`swap`) takes it back; meanwhile this handle neither
    reads nor pins it, and ``erase`` reaches it through the writer process.
    """

    def __init__(self, root: str | os.PathLike[str], *, sync: bool = False) -> None:
        self._root = Path(root)
        self._sync = sync
        self._root.mkdir(parents=True, exist_ok=True)
        self._lock_file = (self._root / ".lock").open("a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as error:
            self._lock_file.close()
            raise RuntimeError(f"{self._root} is open in another EdgeIndex") from error
        self._state = SharedLock()
        self._writes = threading.Lock()
        self._shards: dict[int, qe.EdgeShard] = {}
        self._dims: dict[int, int] = {}
        self._lent: dict[int, ShardProcess] = {}
        self._live: int | None = None
        self._target: int | None = None
        self._closed = False
        pointer = self._root / POINTER
        try:
            if pointer.exists():
                self._live = int(json.loads(pointer.read_text(encoding="utf-8"))["version"])
                self._open(self._live)
        except BaseException:
            self._lock_file.close()
            raise

    # -- versions

    def _path(self, version: int) -> Path:
        return self._root / collection_name(version)

    def _exists(self, version: int) -> bool:
        return (self._path(version) / "edge_config.json").exists()

    def _open(self, version: int) -> qe.EdgeShard:
        if version in self._lent:
            raise RuntimeError(f"version {version} is lent to a writer process")
        if version not in self._shards:
            if not self._exists(version):
                raise LookupError(f"version {version} does not exist in {self._root}")
            config = json.loads((self._path(version) / "edge_config.json").read_text())
            self._dims[version] = int(config["vectors"][DENSE]["size"])
            self._shards[version] = qe.EdgeShard.load(str(self._path(version)))
        return self._shards[version]

    def _create(self, dims: int) -> int:
        if dims < 1:
            raise ValueError(f"dims must be >= 1, got {dims}")
        version = max(self._on_disk(), default=0) + 1
        shard = qe.EdgeShard.create(str(self._path(version)), _edge_config(dims))
        for name, schema in _edge_indexes().items():
            shard.update(qe.UpdateOperation.create_field_index(name, schema))
        self._shards[version], self._dims[version] = shard, dims
        return version

    def _on_disk(self) -> list[int]:
        found = (_version_of(p.name) for p in self._root.iterdir() if p.is_dir())
        return sorted(v for v in found if v is not None)

    def _point_to(self, version: int) -> None:
        write_json_atomically(self._root / POINTER, {"version": version})
        self._live = version
        if self._target == version:
            self._target = None

    def _live_version(self) -> int:
        if self._closed:
            raise RuntimeError("the index is closed")
        if self._live is None:
            raise LookupError(f"no live version in {self._root}: call ensure(dims) first")
        return self._live

    def _reader(self) -> tuple[qe.EdgeShard, int]:
        live = self._live_version()
        return self._shards[live], self._dims[live]

    def _writer(self) -> ShardWriter:
        version = self._live_version() if self._target is None else self._target
        return self._shard_writer(version)

    def _shard_writer(self, version: int) -> ShardWriter:
        return ShardWriter(self._shards[version], self._dims[version], sync=self._sync)

    def ensure(self, dims: int) -> None:
        with self._state.exclusive():
            if self._closed:
                raise RuntimeError("the index is closed")
            if self._live is None:
                self._point_to(self._create(dims))
                return
            if self._dims[self._live] != dims:
                raise ValueError(f"live version has {self._dims[self._live]} dims, not {dims}")
            shard, have = self._shards[self._live], self._shards[self._live].info()
            for name, schema in _edge_indexes().items():
                if name not in have.payload_schema:
                    shard.update(qe.UpdateOperation.create_field_index(name, schema))

    def live_version(self) -> int:
        with self._state.shared():
            return self._live_version()

    def versions(self) -> list[int]:
        with self._state.shared():
            return [v for v in self._on_disk() if self._exists(v)]

    def create_version(self, dims: int | None = None) -> int:
        with self._state.exclusive():
            return self._create(self._dims[self._live_version()] if dims is None else dims)

    def use_version(self, version: int | None) -> None:
        with self._state.exclusive():
            self._live_version()
            if version is not None:
                self._open(version)
            self._target = version

    def swap(self, version: int) -> None:
        """See :class:`VectorIndex`; a lent version is reclaimed first (:meth:`reclaim`)."""
        with self._state.exclusive():
            if self._closed:
                raise RuntimeError("the index is closed")
            self._reclaim(version)
            self._open(version)
            self._point_to(version)

    def lend(self, version: int) -> LentVersion:
        """Hand the writes of ``version`` to a writer process that opens its shard
        (:mod:`sinks.edge_process`) and return them: ``version`` must exist and be
        neither live, nor a handle's write target, nor lent already (ValueError).
        Until :meth:`reclaim`, :meth:`swap` or :meth:`drop_version`, this handle does
        not read or pin it (RuntimeError); ``erase`` reaches it through the process.
        A version lent when its process dies (this one killed, say) is an orphan on
        disk like any version that was being built."""
        with self._state.exclusive():
            if version in (self._live_version(), self._target) or version in self._lent:
                raise ValueError(f"version {version} is live, the write target or lent")
            self._open(version)
            self._shards.pop(version).close()
            process = ShardProcess(self._path(version), self._dims[version], sync=self._sync)
            self._lent[version] = process
        return LentVersion(process)

    def reclaim(self, version: int) -> None:
        """Take ``version`` back from its writer process: the process flushes, closes
        the shard and exits, and this handle opens it again; a version that is not
        lent is left as it is. Raises ShardProcessGone if the process had died (the
        version may miss writes: drop it)."""
        with self._state.exclusive():
            self._reclaim(version)
            self._open(version)

    def _reclaim(self, version: int) -> None:
        process = self._lent.pop(version, None)
        if process is not None:
            process.close()

    def pinned(self, version: int) -> EdgeIndex:
        with self._state.exclusive():
            self._live_version()
            self._open(version)
        twin = copy.copy(self)  # same shards, dims and locks; its own write target
        twin._target = version
        return twin

    def points(self, version: int | None = None) -> list[Point]:
        if version is not None and version not in self._shards:
            with self._state.exclusive():
                self._open(version)
        with self._state.shared():
            shard = self._shards[self._live_version() if version is None else version]
            records: list[Any] = []
            offset: Any = None
            while True:
                request = qe.ScrollRequest(
                    offset=offset, limit=1024, with_payload=True, with_vector=True
                )
                page, offset = shard.scroll(request)
                records += page
                if offset is None:
                    break
        return sorted((_point_of(r.id, r.vector or {}, r.payload) for r in records), key=_by_id)

    def drop_version(self, version: int) -> None:
        """See :class:`VectorIndex`; a lent version's writer process is ended first."""
        with self._state.exclusive():
            if version in (self._live_version(), self._target):
                raise ValueError(f"version {version} is live or the write target")
            process = self._lent.pop(version, None)
            if process is not None:
                process.kill()
            shard = self._shards.pop(version, None)
            if shard is not None:
                shard.close()
            self._dims.pop(version, None)
            shutil.rmtree(self._path(version), ignore_errors=True)

    # -- writes

    def upsert(self, points: Sequence[Point]) -> None:
        if not points:
            return
        with self._state.shared(), self._writes:
            self._writer().upsert([wire_point(p) for p in points])

    def set_dense(self, items: Sequence[tuple[str, list[float]]]) -> None:
        if not items:
            return
        with self._state.shared(), self._writes:
            self._writer().set_dense([(canonical_id(i), v) for i, v in items])

    def set_payload(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        if not items:
            return
        with self._state.shared(), self._writes:
            self._writer().set_payload([(canonical_id(i), p) for i, p in items])

    def erase(self, agent_id: str, user_id: str | None) -> int:
        """See :class:`VectorIndex`: every version, lent ones through their process."""
        with self._state.exclusive():
            for version in self._on_disk():
                if self._exists(version) and version not in self._lent:
                    self._open(version)
        erased = 0
        with self._state.shared(), self._writes:
            for version in sorted(self._shards):
                erased += self._shard_writer(version).erase(agent_id, user_id)
            for process in self._lent.values():
                erased += process.write([("erase", [(agent_id, user_id)])])[0]
        return erased

    def optimize(self) -> None:
        with self._state.shared(), self._writes:
            live = self._live_version()
            for version in sorted({live, self._target or live}):
                self._shards[version].optimize()

    # -- reads

    def search_dense(self, vector: list[float], scope: Scope, limit: int) -> list[Hit]:
        _check_limit(limit)
        request = _edge_dense_request(vector, scope, limit)
        with self._state.shared():
            shard, dims = self._reader()
            _check_dims(vector, dims)
            return [_edge_hit(p, p.score) for p in shard.query(request)]

    def search_sparse(self, vector: SparseVector, scope: Scope, limit: int) -> list[Hit]:
        _check_limit(limit)
        request = _edge_sparse_request(vector, scope, limit)
        with self._state.shared():
            shard, _ = self._reader()
            return [_edge_hit(p, p.score) for p in shard.query(request)]

    def search_hybrid(
        self, dense: list[float], sparse: SparseVector | None, scope: Scope, limit: int
    ) -> tuple[list[Hit], list[Hit]]:
        """See :class:`HybridSearch`: Edge's ``query_batch``, one planned pass."""
        _check_limit(limit)
        requests = [_edge_dense_request(dense, scope, limit)]
        if sparse is not None:
            requests.append(_edge_sparse_request(sparse, scope, limit))
        with self._state.shared():
            shard, dims = self._reader()
            _check_dims(dense, dims)
            found = shard.query_batch(qe.QueryBatchRequest(requests))
        hits = [[_edge_hit(p, p.score) for p in points] for points in found]
        return hits[0], hits[1] if sparse is not None else []

    def get(self, ids: Sequence[str], scope: Scope) -> list[Hit]:
        wanted = _unique_ids(ids)
        if not wanted:
            return []
        request = qe.ScrollRequest(
            limit=len(wanted),
            filter=_edge_filter(scope_conditions(scope), wanted),
            with_payload=True,
            with_vector=False,
        )
        with self._state.shared():
            shard, _ = self._reader()
            records, _ = shard.scroll(request)
        return _in_order(wanted, {str(r.id): _edge_hit(r, 0.0) for r in records})

    def count(self, scope: Scope) -> int:
        request = qe.CountRequest(exact=True, filter=_edge_filter(scope_conditions(scope)))
        with self._state.shared():
            shard, _ = self._reader()
            return shard.count(request)

    def close(self) -> None:
        with self._state.exclusive():
            if self._closed:
                return
            self._closed = True
            for process in self._lent.values():
                process.kill()
            self._lent.clear()
            for shard in self._shards.values():
                shard.close()
            self._shards.clear()
            self._lock_file.close()


# --------------------------------------------------------------------------- qdrant-client


def _client_condition(condition: Condition) -> qm.FieldCondition:
    match condition:
        case Equals(key, value):
            return qm.FieldCondition(key=key, match=qm.MatchValue(value=value))
        case AnyOf(key, values):
            return qm.FieldCondition(key=key, match=qm.MatchAny(any=list(values)))
        case AtLeast(key, bound):
            return qm.FieldCondition(key=key, range=qm.Range(gte=bound))
    raise TypeError(f"unknown condition {condition!r}")


def _client_filter(conditions: Sequence[Condition], ids: Sequence[str] = ()) -> qm.Filter:
    must: list[qm.Condition] = [_client_condition(c) for c in conditions]
    if ids:
        must.insert(0, qm.HasIdCondition(has_id=list(ids)))
    return qm.Filter(must=must)


def _client_indexes() -> dict[str, qm.PayloadSchemaType | qm.KeywordIndexParams]:
    keyword = qm.KeywordIndexParams(type=qm.KeywordIndexType.KEYWORD, is_tenant=True)
    indexes: dict[str, qm.PayloadSchemaType | qm.KeywordIndexParams] = {"agent_id": keyword}
    indexes |= {name: qm.PayloadSchemaType.KEYWORD for name in KEYWORD_FIELDS[1:]}
    indexes |= {name: qm.PayloadSchemaType.FLOAT for name in FLOAT_FIELDS}
    return indexes | {name: qm.PayloadSchemaType.BOOL for name in BOOL_FIELDS}


def _client_point(point: Point) -> qm.PointStruct:
    vectors: dict[str, Any] = {}
    if point.dense is not None:
        vectors[DENSE] = list(point.dense)
    if point.sparse is not None:
        sparse = point.sparse
        vectors[SPARSE] = qm.SparseVector(indices=list(sparse.indices), values=list(sparse.values))
    return qm.PointStruct(id=point.id, vector=vectors, payload=dict(point.payload))


def _client_dense_request(vector: list[float], scope: Scope, limit: int) -> qm.QueryRequest:
    """Top ``limit`` of the scope by cosine, with payloads."""
    return qm.QueryRequest(
        query=list(vector),
        using=DENSE,
        filter=_client_filter(scope_conditions(scope)),
        limit=limit,
        with_payload=True,
    )


def _client_sparse_request(vector: SparseVector, scope: Scope, limit: int) -> qm.QueryRequest:
    """Top ``limit`` of the scope by IDF-weighted dot product (the tenant is the IDF
    corpus), with payloads."""
    corpus = qm.IdfCorpusParams(corpus=_client_filter(tenant_conditions(scope)))
    return qm.QueryRequest(
        query=qm.SparseVector(indices=list(vector.indices), values=list(vector.values)),
        using=SPARSE,
        filter=_client_filter(scope_conditions(scope)),
        params=qm.SearchParams(idf=corpus),
        limit=limit,
        with_payload=True,
    )


def _client_hit(point: qm.ScoredPoint | qm.Record, score: float) -> Hit:
    return Hit(str(point.id), score, dict(point.payload or {}))


def is_local(client: QdrantClient) -> bool:
    """Whether ``client`` runs in local mode (``path=`` or ``":memory:"``)."""
    options = client.init_options
    return bool(options.get("path")) or options.get("location") == ":memory:"


class ClientIndex:
    """``VectorIndex`` through qdrant-client: a Qdrant server, or local mode in tests.

    Native: points without a named vector, partial vector updates
    (``update_vectors``), the sparse IDF modifier with a per-query IDF corpus
    (``SearchParams.idf``), aliases (``memories`` → ``memories_v{n}``, swapped in one
    atomic request), payload updates by filter (unknown ids are skipped). Emulated:
    skipping unknown ids in ``set_dense`` (read which exist, update those).

    Reads name the alias, so the server resolves it per request and a swap made by
    any process is seen at once; writes name the alias too unless ``use_version``
    pinned a version. ``optimize`` is a no-op: the server indexes in the background
    and local mode has no index.

    Thread-safety: a server client is shared by threads as it is (httpx is
    thread-safe); a local-mode client is not thread-safe, so every call of this
    handle is serialized by a lock when ``is_local(client)``.
    """

    def __init__(self, client: QdrantClient, *, name: str = ALIAS) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", name):
            raise ValueError(f"collection base name {name!r}: lowercase letters, digits, _")
        self._alias = name
        self._client = client
        self._serialize = is_local(client)
        self._lock = threading.RLock()
        self._target: int | None = None
        self._dims: dict[str, int] = {}
        self._has_alias = False

    def _collection(self, version: int) -> str:
        """``{name}_v{n}``, the collection of version ``n``."""
        if version < 1:
            raise ValueError(f"versions start at 1, got {version}")
        return f"{self._alias}_v{version}"

    def _version_of(self, collection: str) -> int | None:
        prefix = f"{self._alias}_v"
        tail = collection[len(prefix) :] if collection.startswith(prefix) else ""
        return int(tail) if tail.isdigit() and not tail.startswith("0") else None

    def _guard(self) -> contextlib.AbstractContextManager[Any]:
        return self._lock if self._serialize else contextlib.nullcontext()

    def _live(self) -> str:
        """The alias, once it is known to exist (LookupError before ``ensure``)."""
        if not self._has_alias:
            self._live_version()
            self._has_alias = True
        return self._alias

    # -- versions

    def _aliased(self) -> int | None:
        for alias in self._client.get_aliases().aliases:
            if alias.alias_name == self._alias:
                return self._version_of(alias.collection_name)
        return None

    def _live_version(self) -> int:
        version = self._aliased()
        if version is None:
            raise LookupError(f"no alias {self._alias!r}: call ensure(dims) first")
        self._has_alias = True
        return version

    def _versions(self) -> list[int]:
        names = (c.name for c in self._client.get_collections().collections)
        return sorted(v for v in map(_version_of, names) if v is not None)

    def _dims_of(self, name: str) -> int:
        if name not in self._dims:
            vectors = self._client.get_collection(name).config.params.vectors
            if not isinstance(vectors, dict) or DENSE not in vectors:
                raise RuntimeError(f"collection {name!r} has no dense vector {DENSE!r}")
            self._dims[name] = vectors[DENSE].size
        return self._dims[name]

    def _create(self, dims: int) -> int:
        if dims < 1:
            raise ValueError(f"dims must be >= 1, got {dims}")
        version = max(self._versions(), default=0) + 1
        name = self._collection(version)
        self._client.create_collection(
            name,
            vectors_config={DENSE: qm.VectorParams(size=dims, distance=qm.Distance.COSINE)},
            sparse_vectors_config={SPARSE: qm.SparseVectorParams(modifier=qm.Modifier.IDF)},
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Payload indexes have no effect")
            for field_name, schema in _client_indexes().items():
                self._client.create_payload_index(name, field_name, schema, wait=True)
        self._dims[name] = dims
        return version

    def _point_alias(self, version: int) -> None:
        change: list[qm.AliasOperations] = []
        if self._aliased() is not None:
            change.append(
                qm.DeleteAliasOperation(delete_alias=qm.DeleteAlias(alias_name=self._alias))
            )
        create = qm.CreateAlias(collection_name=self._collection(version), alias_name=self._alias)
        change.append(qm.CreateAliasOperation(create_alias=create))
        self._client.update_collection_aliases(change)
        self._dims.pop(self._alias, None)
        if self._target == version:
            self._target = None

    def _write_name(self) -> str:
        return self._live() if self._target is None else self._collection(self._target)

    def ensure(self, dims: int) -> None:
        with self._lock:
            if self._aliased() is None:
                self._point_alias(self._create(dims))
            elif self._dims_of(self._alias) != dims:
                raise ValueError(f"live version has {self._dims_of(self._alias)} dims, not {dims}")

    def live_version(self) -> int:
        with self._guard():
            return self._live_version()

    def versions(self) -> list[int]:
        with self._guard():
            return self._versions()

    def create_version(self, dims: int | None = None) -> int:
        with self._lock:
            return self._create(self._dims_of(self._live()) if dims is None else dims)

    def use_version(self, version: int | None) -> None:
        with self._lock:
            if version is not None and version not in self._versions():
                raise LookupError(f"version {version} does not exist")
            self._target = version

    def swap(self, version: int) -> None:
        with self._lock:
            if version not in self._versions():
                raise LookupError(f"version {version} does not exist")
            self._point_alias(version)

    def drop_version(self, version: int) -> None:
        with self._lock:
            if version in (self._live_version(), self._target):
                raise ValueError(f"version {version} is live or the write target")
            self._client.delete_collection(self._collection(version))
            self._dims.pop(self._collection(version), None)

    def pinned(self, version: int) -> ClientIndex:
        with self._lock:
            if version not in self._versions():
                raise LookupError(f"version {version} does not exist")
        twin = copy.copy(self)  # same client, lock and dims cache; its own write target
        twin._target = version
        return twin

    def points(self, version: int | None = None) -> list[Point]:
        records: list[qm.Record] = []
        offset: Any = None
        with self._guard():
            name = self._live() if version is None else self._collection(version)
            while True:
                page, offset = self._client.scroll(
                    name, limit=1024, offset=offset, with_payload=True, with_vectors=True
                )
                records += page
                if offset is None:
                    break
        return sorted((_point_of(r.id, r.vector, r.payload) for r in records), key=_by_id)

    # -- writes

    def upsert(self, points: Sequence[Point]) -> None:
        if not points:
            return
        with self._guard():
            name = self._write_name()
            for point in points:
                if point.dense is not None:
                    _check_dims(point.dense, self._dims_of(name))
            self._client.upsert(name, [_client_point(p) for p in points], wait=True)

    def set_dense(self, items: Sequence[tuple[str, list[float]]]) -> None:
        if not items:
            return
        with self._guard():
            name = self._write_name()
            for _, vector in items:
                _check_dims(vector, self._dims_of(name))
            ids = _unique_ids([i for i, _ in items])
            records = self._client.retrieve(name, ids, with_payload=False, with_vectors=False)
            known = {str(r.id) for r in records}
            updates = [
                qm.PointVectors(id=pid, vector={DENSE: list(vector)})
                for pid, vector in ((canonical_id(i), v) for i, v in items)
                if pid in known
            ]
            if updates:
                self._client.update_vectors(name, updates, wait=True)

    def set_payload(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        if not items:
            return
        operations: list[qm.UpdateOperation] = [
            qm.SetPayloadOperation(
                set_payload=qm.SetPayload(
                    payload=dict(payload), filter=_client_filter((), [canonical_id(point_id)])
                )
            )
            for point_id, payload in items
        ]
        with self._guard():
            self._client.batch_update_points(self._write_name(), operations, wait=True)

    def erase(self, agent_id: str, user_id: str | None) -> int:
        user: qm.Condition = (
            qm.IsNullCondition(is_null=qm.PayloadField(key="user_id"))
            if user_id is None
            else _client_condition(Equals("user_id", user_id))
        )
        owned = qm.Filter(must=[_client_condition(Equals("agent_id", agent_id)), user])
        erased = 0
        with self._lock:
            names = (c.name for c in self._client.get_collections().collections)
            for version in sorted(v for v in map(self._version_of, names) if v is not None):
                name = self._collection(version)
                found = self._client.count(name, count_filter=owned, exact=True).count
                if found:
                    selector = qm.FilterSelector(filter=owned)
                    self._client.delete(name, points_selector=selector, wait=True)
                erased += found
        return erased

    def optimize(self) -> None:
        """A no-op: the server builds its indexes itself; local mode has none."""

    # -- reads

    def search_dense(self, vector: list[float], scope: Scope, limit: int) -> list[Hit]:
        _check_limit(limit)
        return self._search([_client_dense_request(vector, scope, limit)], vector)[0]

    def search_sparse(self, vector: SparseVector, scope: Scope, limit: int) -> list[Hit]:
        _check_limit(limit)
        return self._search([_client_sparse_request(vector, scope, limit)], None)[0]

    def search_hybrid(
        self, dense: list[float], sparse: SparseVector | None, scope: Scope, limit: int
    ) -> tuple[list[Hit], list[Hit]]:
        """See :class:`HybridSearch`: ``query_batch_points``, one round trip."""
        _check_limit(limit)
        requests = [_client_dense_request(dense, scope, limit)]
        if sparse is not None:
            requests.append(_client_sparse_request(sparse, scope, limit))
        hits = self._search(requests, dense)
        return hits[0], hits[1] if sparse is not None else []

    def _search(
        self, requests: list[qm.QueryRequest], dense: list[float] | None
    ) -> list[list[Hit]]:
        """The hits of each request, run as one batch on the live version; the size of
        ``dense`` (when given) is checked against the live version first."""
        with self._guard():
            live = self._live()
            if dense is not None:
                _check_dims(dense, self._dims_of(live))
            responses = self._client.query_batch_points(live, requests)
        return [[_client_hit(p, p.score) for p in response.points] for response in responses]

    def get(self, ids: Sequence[str], scope: Scope) -> list[Hit]:
        wanted = _unique_ids(ids)
        if not wanted:
            return []
        with self._guard():
            records, _ = self._client.scroll(
                self._live(),
                scroll_filter=_client_filter(scope_conditions(scope), wanted),
                limit=len(wanted),
                with_payload=True,
            )
        return _in_order(wanted, {str(r.id): _client_hit(r, 0.0) for r in records})

    def count(self, scope: Scope) -> int:
        with self._guard():
            result = self._client.count(
                self._live(), count_filter=_client_filter(scope_conditions(scope)), exact=True
            )
        return result.count

    def close(self) -> None:
        with self._guard():
            self._client.close()


# --------------------------------------------------------------------------- opening


ACCEPTED_URLS = ("edge:///abs/path", "local:///abs/path", "http://host:port", "https://host:port")


def open_index(url: str, *, api_key: str | None = None, name: str = ALIAS) -> VectorIndex:
    """A ``VectorIndex`` for a URL.

    ``edge:///abs/path`` → ``EdgeIndex`` (the embedded default); ``local:///abs/path``
    → ``ClientIndex`` on qdrant-client local mode; ``http://…`` / ``https://…`` →
    ``ClientIndex`` on a Qdrant server. Anything else → ValueError.

    ``name`` keeps several indexes apart (engram uses one per embedding model): the
    alias and collection prefix on a server or in local mode, a subdirectory of the
    root for Edge.
    """
    parts = urlsplit(url)
    if parts.scheme in ("http", "https", "local"):
        from qdrant_client import QdrantClient
    if parts.scheme in ("http", "https") and parts.netloc:
        return ClientIndex(QdrantClient(url=url, api_key=api_key), name=name)
    if parts.scheme in ("edge", "local") and not parts.netloc and parts.path.startswith("/"):
        if parts.scheme == "edge":
            return EdgeIndex(Path(parts.path) / name)
        client = QdrantClient(path=parts.path, force_disable_check_same_thread=True)
        return ClientIndex(client, name=name)
    raise ValueError(f"unsupported vector store URL {url!r}; use one of {', '.join(ACCEPTED_URLS)}")
