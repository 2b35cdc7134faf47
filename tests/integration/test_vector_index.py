"""The contract of ``VectorIndex``, held against every implementation on real stores:
Qdrant Edge shards and qdrant-client local mode, each in a temp directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from qdrant_client import QdrantClient

from sinks.vectors import (
    ClientIndex,
    EdgeIndex,
    Hit,
    HybridSearch,
    Point,
    Scope,
    SparseVector,
    VectorIndex,
    open_index,
)

pytestmark = pytest.mark.integration
DIMS = 8
NAMESPACE = uuid.UUID("6f1c2a4e-0000-4000-8000-000000000000")
CRAFTED = ("*", "a ", "A", "a' OR 1=1", "a' OR 1=1 --", '{"$ne": null}', "a" * 5000)

Opener = Callable[[], VectorIndex]


@pytest.fixture(params=["edge", "client"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens a handle on the same store every time it is called."""
    path = tmp_path / str(request.param)
    if request.param == "edge":
        return lambda: EdgeIndex(path)
    return lambda: ClientIndex(QdrantClient(path=str(path)))


@pytest.fixture
def index(opener: Opener) -> Iterator[VectorIndex]:
    store = opener()
    store.ensure(DIMS)
    yield store
    store.close()


def mid(name: str) -> str:
    return str(uuid.uuid5(NAMESPACE, name))


def dense(*weights: float) -> list[float]:
    return [*weights, *[0.0] * (DIMS - len(weights))]


def axis(i: int) -> list[float]:
    return [1.0 if d == i else 0.0 for d in range(DIMS)]


def terms(*words: str) -> SparseVector:
    """Words hashed to term ids, one count each: any script is just integers."""
    ids = sorted({zlib.crc32(w.encode()) for w in words})
    return SparseVector(ids, [1.0] * len(ids))


def payload(agent: str = "a", **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "agent_id": agent,
        "user_id": "u1",
        "session_id": "s1",
        "layer": "L2",
        "kind": "episode",
        "importance": 5.0,
        "sentiment": 0.0,
        "strength": 1.0,
        "reinforcements": 0,
        "last_reinforced_at": 1_790_000_000_000,
        "created_at": 1_790_000_000_000,
        "forgotten": False,
        "invalidated": False,
        "promoted": False,
        "text": "",
        "sources": [],
    }
    return base | fields


def point(name: str, vector: list[float] | None, words: tuple[str, ...], **fields: Any) -> Point:
    text = " ".join(words)
    sparse = terms(*words) if words else None
    return Point(mid(name), vector, sparse, payload(text=text, sources=[name], **fields))


MEMORIES = (
    point("kyoto", axis(0), ("kyoto", "april", "cherry", "blossoms")),
    point("ryokan", axis(1), ("ryokan", "gion", "vegetarian")),
    point("peanut", axis(2), ("peanut", "allergy")),
    point("花生", axis(3), ("我", "对", "花生", "过敏")),
    point("散步", axis(4), ("今天", "天气", "散步")),
)


def ids_of(hits: list[Hit]) -> list[str]:
    return [h.id for h in hits]


def snapshot(store: VectorIndex, scope: Scope) -> tuple[int, list[Hit]]:
    return store.count(scope), store.get([p.id for p in MEMORIES], scope)


A = Scope("a")


def test_upsert_then_search_finds_the_point(index: VectorIndex) -> None:
    index.upsert(MEMORIES)
    for i, memory in enumerate(MEMORIES):
        hits = index.search_dense(axis(i), A, 3)
        assert hits[0].id == memory.id
        assert hits[0].payload == memory.payload
        assert hits[0].score == pytest.approx(1.0)
    found = index.search_sparse(terms("cherry", "blossoms"), A, 3)
    assert ids_of(found) == [mid("kyoto")]
    assert found[0].score > 0


def test_chinese_and_english_terms_are_just_integers(index: VectorIndex) -> None:
    index.upsert(MEMORIES)
    assert ids_of(index.search_sparse(terms("花生"), A, 5)) == [mid("花生")]
    assert ids_of(index.search_sparse(terms("peanut"), A, 5)) == [mid("peanut")]
    mixed = ids_of(index.search_sparse(terms("花生", "peanut", "散步"), A, 5))
    assert sorted(mixed) == sorted([mid("花生"), mid("peanut"), mid("散步")])


def test_rare_terms_weigh_more_than_common_ones(index: VectorIndex) -> None:
    """The IDF modifier is on: a term in every document scores less than a rare one."""
    common = [point(f"c{i}", None, ("common", f"own{i}")) for i in range(6)]
    rare = point("rare", None, ("common", "rare"))
    index.upsert([*common, rare])
    hits = index.search_sparse(terms("common", "rare"), A, 10)
    assert hits[0].id == rare.id
    assert hits[0].score > 2 * hits[1].score


HYBRID_SCOPES = (
    A,
    Scope("a", user_id="u2"),
    Scope("a", layers=("L3",)),
    Scope("a", min_importance=6.0),
    Scope("a", include_forgotten=True),
    Scope("b"),
)


@pytest.mark.parametrize("scope", HYBRID_SCOPES, ids=repr)
def test_a_hybrid_search_is_the_two_searches_at_once(index: VectorIndex, scope: Scope) -> None:
    """``search_hybrid`` (one batch) answers exactly what ``search_dense`` and
    ``search_sparse`` answer one after the other, in every scope: the same points,
    payloads and scores, the tenant's IDF corpus included."""
    assert isinstance(index, HybridSearch)
    others = [
        point("u2", axis(0), ("kyoto", "cherry"), user_id="u2", importance=7.0),
        point("l3", axis(1), ("cherry", "trip"), layer="L3", promoted=True),
        point("gone", axis(0), ("kyoto",), forgotten=True),
        point("b-kyoto", axis(0), ("kyoto", "cherry"), agent="b"),
        point("b-late", None, ("kyoto",), agent="b"),
    ]
    index.upsert([*MEMORIES, *others])
    query, words = dense(0.9, 0.3, 0.1), terms("kyoto", "cherry", "花生")
    for limit in (1, 3, 10):
        both = index.search_hybrid(query, words, scope, limit)
        assert both == (
            index.search_dense(query, scope, limit),
            index.search_sparse(words, scope, limit),
        )
    assert index.search_hybrid(query, None, scope, 10) == (index.search_dense(query, scope, 10), [])


def test_a_hybrid_search_checks_its_arguments(index: VectorIndex) -> None:
    assert isinstance(index, HybridSearch)
    index.upsert(MEMORIES)
    with pytest.raises(ValueError, match="limit"):
        index.search_hybrid(axis(0), terms("kyoto"), A, 0)
    with pytest.raises(ValueError, match="dimensions"):
        index.search_hybrid([1.0, 0.0], terms("kyoto"), A, 3)


def test_upserting_a_batch_twice_equals_upserting_it_once(index: VectorIndex) -> None:
    index.upsert(MEMORIES)
    once = snapshot(index, A)
    index.upsert(MEMORIES)
    assert snapshot(index, A) == once
    assert once[0] == len(MEMORIES)


def test_upsert_replaces_the_whole_point(index: VectorIndex) -> None:
    index.upsert(MEMORIES)
    changed = point("kyoto", axis(5), ("osaka",), importance=9.0)
    index.upsert([changed])
    assert index.get([changed.id], A)[0].payload == changed.payload
    assert index.search_dense(axis(5), A, 1)[0].id == changed.id
    assert index.search_sparse(terms("cherry"), A, 5) == []


def test_set_payload_merges_and_skips_unknown_ids(index: VectorIndex) -> None:
    index.upsert(MEMORIES)
    target = MEMORIES[0]
    merged = {"strength": 2.5, "reinforcements": 1}
    index.set_payload([(target.id, merged), (mid("nope"), {"x": 1})])
    [hit] = index.get([target.id], A)
    assert hit.payload == target.payload | merged
    assert index.search_dense(axis(0), A, 1)[0].id == target.id
    assert ids_of(index.search_sparse(terms("kyoto"), A, 5)) == [target.id]
    assert index.count(Scope("a", include_forgotten=True)) == len(MEMORIES)


def test_set_dense_makes_a_sparse_only_point_findable(index: VectorIndex) -> None:
    late = point("late", None, ("embedding", "later"))
    index.upsert([*MEMORIES, late])
    assert late.id not in ids_of(index.search_dense(axis(6), A, 10))
    index.set_dense([(late.id, axis(6)), (mid("nope"), axis(6))])
    hits = index.search_dense(axis(6), A, 10)
    assert hits[0].id == late.id
    assert hits[0].payload == late.payload
    assert ids_of(index.search_sparse(terms("later"), A, 5)) == [late.id]
    assert index.count(A) == len(MEMORIES) + 1


def test_forgotten_and_invalidated_points_leave_recall(index: VectorIndex) -> None:
    kept = point("kept", axis(0), ("memory",))
    forgotten = point("forgotten", axis(0), ("memory",), forgotten=True)
    invalidated = point("invalidated", axis(0), ("memory",), invalidated=True)
    index.upsert([kept, forgotten, invalidated])
    every = Scope("a", include_forgotten=True)
    ids = [kept.id, forgotten.id, invalidated.id]
    assert ids_of(index.search_dense(axis(0), A, 10)) == [kept.id]
    assert ids_of(index.search_sparse(terms("memory"), A, 10)) == [kept.id]
    assert ids_of(index.get(ids, A)) == [kept.id]
    assert index.count(A) == 1
    assert sorted(ids_of(index.search_dense(axis(0), every, 10))) == sorted(ids)
    assert sorted(ids_of(index.search_sparse(terms("memory"), every, 10))) == sorted(ids)
    assert ids_of(index.get(ids, every)) == ids
    assert index.count(every) == 3
    index.set_payload([(kept.id, {"forgotten": True})])
    assert index.search_dense(axis(0), A, 10) == []
    assert index.count(A) == 0


def test_scope_narrows_by_user_layer_and_importance(index: VectorIndex) -> None:
    index.upsert(
        [
            point("u1-l2", axis(0), ("x",), user_id="u1", layer="L2", importance=3.0),
            point("u1-l3", axis(0), ("x",), user_id="u1", layer="L3", importance=9.0),
            point("u2-l2", axis(0), ("x",), user_id="u2", layer="L2", importance=7.0),
            point("nobody", axis(0), ("x",), user_id=None, layer="L2", importance=5.0),
        ]
    )

    def found(scope: Scope) -> set[str]:
        return set(ids_of(index.search_dense(axis(0), scope, 10)))

    assert found(A) == {mid("u1-l2"), mid("u1-l3"), mid("u2-l2"), mid("nobody")}
    assert found(Scope("a", user_id="u1")) == {mid("u1-l2"), mid("u1-l3")}
    assert found(Scope("a", user_id="u2")) == {mid("u2-l2")}
    assert found(Scope("a", layers=("L3",))) == {mid("u1-l3")}
    assert found(Scope("a", min_importance=5.0)) == {mid("u1-l3"), mid("u2-l2"), mid("nobody")}
    assert found(Scope("a", user_id="u1", layers=("L2", "L3"), min_importance=4)) == {mid("u1-l3")}
    assert index.count(Scope("a", user_id="u2")) == 1
    assert set(ids_of(index.search_sparse(terms("x"), Scope("a", user_id="u1"), 10))) == {
        mid("u1-l2"),
        mid("u1-l3"),
    }


@pytest.mark.parametrize("other", CRAFTED)
def test_an_agent_never_sees_another_agents_points(index: VectorIndex, other: str) -> None:
    index.upsert(MEMORIES)
    for scope in (Scope(other), Scope(other, include_forgotten=True)):
        assert index.search_dense(axis(0), scope, 10) == []
        assert index.search_sparse(terms("kyoto", "花生"), scope, 10) == []
        assert index.get([p.id for p in MEMORIES], scope) == []
        assert index.count(scope) == 0


def test_agents_with_look_alike_ids_stay_apart(index: VectorIndex) -> None:
    index.upsert(MEMORIES)
    twins = [point(f"twin{i}", axis(0), ("kyoto",), agent=agent) for i, agent in enumerate(CRAFTED)]
    index.upsert(twins)
    for twin in twins:
        scope = Scope(twin.payload["agent_id"])
        assert ids_of(index.search_dense(axis(0), scope, 10)) == [twin.id]
        assert ids_of(index.search_sparse(terms("kyoto"), scope, 10)) == [twin.id]
        assert ids_of(index.get([p.id for p in [*MEMORIES, *twins]], scope)) == [twin.id]
        assert index.count(scope) == 1
    assert index.count(A) == len(MEMORIES)


def test_a_scope_needs_an_agent() -> None:
    for bad in ("", None):
        with pytest.raises(ValueError):
            Scope(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Scope("a", user_id="")
    with pytest.raises(ValueError):
        Scope("a", layers=())


def test_bad_input_is_a_value_error(index: VectorIndex) -> None:
    with pytest.raises(ValueError):
        Point("not-a-uuid", None, None, payload())
    with pytest.raises(ValueError):
        Point(mid("x"), None, None, payload(agent=""))
    with pytest.raises(ValueError):
        SparseVector([1, 1], [1.0, 2.0])
    with pytest.raises(ValueError):
        index.upsert([point("short", [1.0, 0.0], ())])
    with pytest.raises(ValueError):
        index.set_dense([(mid("kyoto"), [1.0])])
    with pytest.raises(ValueError):
        index.search_dense([1.0], A, 3)
    with pytest.raises(ValueError):
        index.search_dense(axis(0), A, 0)
    with pytest.raises(ValueError):
        index.get(["not-a-uuid"], A)
    with pytest.raises(ValueError):
        index.ensure(DIMS + 1)
    assert index.count(Scope("a", include_forgotten=True)) == 0


def test_ids_come_back_canonical(index: VectorIndex) -> None:
    shouting = mid("kyoto").upper()
    index.upsert([Point(shouting, axis(0), None, payload())])
    assert ids_of(index.get([shouting], A)) == [mid("kyoto")]
    assert ids_of(index.search_dense(axis(0), A, 1)) == [mid("kyoto")]


def test_points_survive_close_and_reopen(opener: Opener) -> None:
    store = opener()
    store.ensure(DIMS)
    late = point("late", None, ("later",))
    store.upsert([*MEMORIES, late])
    store.set_dense([(late.id, axis(7))])
    store.set_payload([(MEMORIES[0].id, {"strength": 3.0})])
    before = snapshot(store, A), store.get([late.id], A)
    store.close()
    store.close()

    again = opener()
    try:
        again.ensure(DIMS)
        assert again.live_version() == 1
        assert (snapshot(again, A), again.get([late.id], A)) == before
        assert again.search_dense(axis(7), A, 1)[0].id == late.id
        assert again.get([MEMORIES[0].id], A)[0].payload["strength"] == 3.0
    finally:
        again.close()


KILLED_WRITER = """
import sys, time
from qdrant_client import QdrantClient
from sinks.vectors import ClientIndex, EdgeIndex, Point, SparseVector
kind, path = sys.argv[1], sys.argv[2]
store = EdgeIndex(path) if kind == "edge" else ClientIndex(QdrantClient(path=path))
store.ensure(8)
store.upsert([Point("6f1c2a4e-0000-4000-8000-000000000001", [1.0] + [0.0] * 7,
                    SparseVector([7], [1.0]), {"agent_id": "a", "forgotten": False,
                                               "invalidated": False})])
print("written", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("kind", ["edge", "client"])
def test_a_write_survives_a_killed_process(tmp_path: Path, kind: str) -> None:
    path = str(tmp_path / kind)
    repo = Path(__file__).resolve().parents[2]
    env = os.environ | {"PYTHONPATH": str(repo)}
    cmd = [sys.executable, "-c", KILLED_WRITER, kind, path]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "written"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    store = EdgeIndex(path) if kind == "edge" else ClientIndex(QdrantClient(path=path))
    try:
        assert ids_of(store.search_dense(axis(0), A, 5)) == ["6f1c2a4e-0000-4000-8000-000000000001"]
        assert store.live_version() == 1
    finally:
        store.close()


def test_a_synced_edge_index_keeps_the_contract(tmp_path: Path) -> None:
    store = EdgeIndex(tmp_path, sync=True)
    store.ensure(DIMS)
    store.upsert(MEMORIES)
    store.set_payload([(MEMORIES[0].id, {"strength": 2.0})])
    store.set_dense([(MEMORIES[0].id, axis(7))])
    store.close()
    again = EdgeIndex(tmp_path)
    try:
        assert again.count(A) == len(MEMORIES)
        assert again.search_dense(axis(7), A, 1)[0].payload["strength"] == 2.0
    finally:
        again.close()


def test_versions_are_built_aside_and_swapped_live(opener: Opener) -> None:
    store = opener()
    store.ensure(DIMS)
    store.upsert(MEMORIES[:2])
    assert (store.live_version(), store.versions()) == (1, [1])

    fresh = store.create_version()
    assert (fresh, store.live_version(), store.versions()) == (2, 1, [1, 2])
    store.use_version(fresh)
    store.upsert(MEMORIES)
    store.set_payload([(MEMORIES[0].id, {"strength": 4.0})])
    assert store.count(A) == 2, "reads stay on the live version until the swap"
    with pytest.raises(ValueError):
        store.drop_version(fresh)

    store.swap(fresh)
    assert store.live_version() == 2
    assert store.count(A) == len(MEMORIES)
    assert store.get([MEMORIES[0].id], A)[0].payload["strength"] == 4.0
    with pytest.raises(ValueError):
        store.drop_version(2)
    store.drop_version(1)
    store.drop_version(1)
    assert store.versions() == [2]
    store.upsert([point("after", axis(5), ("after",))])
    store.close()

    again = opener()
    try:
        assert (again.live_version(), again.versions()) == (2, [2])
        assert again.count(A) == len(MEMORIES) + 1
        assert again.create_version() == 3
    finally:
        again.close()


def test_a_new_version_may_change_dims(index: VectorIndex) -> None:
    index.upsert(MEMORIES)
    wide = index.create_version(DIMS * 2)
    index.use_version(wide)
    index.upsert([Point(mid("wide"), [1.0] * (DIMS * 2), None, payload())])
    index.swap(wide)
    assert ids_of(index.search_dense([1.0] * (DIMS * 2), A, 5)) == [mid("wide")]
    index.ensure(DIMS * 2)


def test_reads_and_writes_from_two_threads(index: VectorIndex) -> None:
    errors: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            for i in range(30):
                batch = [point(f"w{i}-{j}", axis(j % DIMS), ("thread", f"t{j}")) for j in range(8)]
                index.upsert(batch)
                index.set_payload([(batch[0].id, {"strength": float(i)})])
        except BaseException as error:
            errors.append(error)
        finally:
            done.set()

    def read() -> None:
        try:
            while not done.is_set():
                index.search_dense(axis(1), A, 5)
                index.search_sparse(terms("thread"), A, 5)
                index.count(A)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert index.count(A) == 30 * 8


def test_an_edge_root_has_one_owner(tmp_path: Path) -> None:
    first = EdgeIndex(tmp_path)
    try:
        with pytest.raises(RuntimeError):
            EdgeIndex(tmp_path)
    finally:
        first.close()
    EdgeIndex(tmp_path).close()


def test_reads_before_ensure_say_so(opener: Opener) -> None:
    store = opener()
    try:
        with pytest.raises(LookupError):
            store.live_version()
        with pytest.raises(LookupError):
            store.count(A)
    finally:
        store.close()


def test_open_index_by_url(tmp_path: Path) -> None:
    edge = open_index(f"edge://{tmp_path / 'e'}")
    local = open_index(f"local://{tmp_path / 'l'}")
    try:
        assert isinstance(edge, EdgeIndex)
        assert isinstance(local, ClientIndex)
        for store in (edge, local):
            store.ensure(DIMS)
            store.upsert(MEMORIES)
            assert store.count(A) == len(MEMORIES)
    finally:
        edge.close()
        local.close()
    for bad in ("qdrant://x", "edge://relative/path", "edge:relative", "/abs/path", "local://"):
        with pytest.raises(ValueError, match="edge:///abs/path"):
            open_index(bad)


def _owners(store: VectorIndex, version: int | None = None) -> list[tuple[str, str]]:
    """(agent, user or "-") of every point of ``version``, sorted."""
    return sorted(
        (p.payload["agent_id"], p.payload["user_id"] or "-") for p in store.points(version)
    )


def test_erase_deletes_the_subjects_points_of_the_agent_in_every_version(
    index: VectorIndex,
) -> None:
    index.upsert(
        [
            point("mei-1", axis(0), ("mei",), user_id="mei"),
            point("mei-2", None, ("mei",), user_id="mei"),
            point("sam-1", axis(1), ("sam",), user_id="sam"),
            point("mei-b", axis(2), ("mei",), agent="b", user_id="mei"),
            point("own", axis(3), ("own",), user_id=None),
        ]
    )
    aside = index.create_version()
    index.pinned(aside).upsert([point("mei-3", axis(4), ("mei",), user_id="mei")])
    assert index.erase("a", "mei") == 3
    assert _owners(index) == [("a", "-"), ("a", "sam"), ("b", "mei")]
    assert _owners(index, aside) == []
    assert index.erase("a", "mei") == 0, "erasing again deletes nothing"
    assert index.erase("a", None) == 1
    assert _owners(index) == [("a", "sam"), ("b", "mei")]
    assert index.count(Scope("a", user_id="mei", include_forgotten=True)) == 0
