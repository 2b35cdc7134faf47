"""A version lent to an Edge writer process (:meth:`sinks.vectors.EdgeIndex.lend`):
the same writes end in the same points as in process; while lent, reads stay on the
live version, the version is opened nowhere else and erasures still reach it; the
process ends with its version, on its own death, and with its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sinks.edge_process import ShardProcessGone
from sinks.vectors import EdgeIndex, LentVersion, Point, Scope, SparseVector
from streams.vectors import Op, apply_operations

pytestmark = pytest.mark.integration
DIMS = 4
NAMESPACE = uuid.UUID("0b7e1a52-0000-4000-8000-000000000000")


def mid(name: str) -> str:
    return str(uuid.uuid5(NAMESPACE, name))


def made(name: str, user: str | None = "mei", dense: list[float] | None = None) -> Point:
    payload = {"agent_id": "bot", "user_id": user, "forgotten": False, "invalidated": False}
    return Point(mid(name), dense, SparseVector([1, 7], [0.5, 1.5]), payload | {"text": name})


BATCH = [
    Op("upsert", made("a", dense=[1.0, 0.0, 0.0, 0.0])),
    Op("upsert", made("b")),
    Op("upsert", made("c", user=None)),
    Op("dense", (mid("b"), [0.0, 1.0, 0.0, 0.0])),
    Op("dense", (mid("nobody"), [0.0, 0.0, 1.0, 0.0])),  # unknown: skipped
    Op("payload", (mid("a"), {"strength": 3.0, "forgotten": True})),
    Op("payload", (mid("nobody"), {"strength": 1.0})),
    Op("erase", ("bot", None)),
    Op("upsert", made("d", user="lin")),
]


@pytest.fixture
def index(tmp_path: Path) -> Iterator[EdgeIndex]:
    store = EdgeIndex(tmp_path / "edge")
    store.ensure(DIMS)
    store.upsert([made("live", dense=[1.0, 0.0, 0.0, 0.0])])
    yield store
    store.close()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_lent_version_ends_with_the_points_of_the_same_writes_in_process(
    index: EdgeIndex,
) -> None:
    here, there = index.create_version(), index.create_version()
    assert apply_operations(index.pinned(here), BATCH) == [1]
    lent = index.lend(there)
    assert apply_operations(lent, BATCH) == [1]
    index.reclaim(there)
    assert index.points(there) == index.points(here)
    assert [p.id for p in index.points(there)] == sorted([mid("a"), mid("b"), mid("d")])


def test_while_lent_reads_stay_live_and_the_version_is_opened_nowhere_else(
    index: EdgeIndex,
) -> None:
    version = index.create_version()
    lent = index.lend(version)
    lent.upsert([made("x", dense=[0.0, 1.0, 0.0, 0.0])])
    hits = index.search_dense([1.0, 0.0, 0.0, 0.0], Scope("bot"), 5)
    assert [h.id for h in hits] == [mid("live")]
    for refused in (index.pinned, index.points, index.use_version):
        with pytest.raises(RuntimeError, match="lent"):
            refused(version)
    for again in (version, index.live_version()):
        with pytest.raises(ValueError):
            index.lend(again)
    assert index.versions() == [1, version]
    index.reclaim(version)
    index.reclaim(version)  # not lent any more: nothing to do
    assert [p.id for p in index.points(version)] == [mid("x")]


def test_erasures_reach_a_lent_version(index: EdgeIndex) -> None:
    version = index.create_version()
    lent = index.lend(version)
    lent.upsert([made("e1"), made("e2"), made("kept", user="lin")])
    assert index.erase("bot", "mei") == 3  # two in the lent version, one live
    assert lent.erase("bot", "mei") == 0  # once erased, again deletes nothing
    index.swap(version)  # reclaims it first
    assert index.live_version() == version
    assert [p.id for p in index.points()] == [mid("kept")]


def test_a_wrong_dimension_is_refused_through_the_process(index: EdgeIndex) -> None:
    lent = index.lend(index.create_version())
    with pytest.raises(ValueError, match="dimensions"):
        lent.upsert([made("wide", dense=[1.0] * (DIMS + 1))])
    lent.upsert([made("fine", dense=[1.0] * DIMS)])  # the process lives on


def test_dropping_a_lent_version_ends_its_process(index: EdgeIndex, tmp_path: Path) -> None:
    version = index.create_version()
    lent = index.lend(version)
    pid = lent.process.pid
    assert pid is not None and alive(pid)
    index.drop_version(version)
    assert not alive(pid)
    assert not (tmp_path / "edge" / f"memories_v{version}").exists()
    assert index.versions() == [1]


def test_a_dead_writer_process_fails_the_writes_and_its_version_drops(index: EdgeIndex) -> None:
    version = index.create_version()
    lent = index.lend(version)
    assert lent.process.pid is not None
    os.kill(lent.process.pid, signal.SIGKILL)
    with pytest.raises(ShardProcessGone):
        lent.upsert([made("late")])
    index.drop_version(version)
    again = index.lend(index.create_version())  # a rerun starts over
    again.upsert([made("rerun")])
    assert isinstance(again, LentVersion)


LENDER = """
import sys, time
from sinks.vectors import EdgeIndex
index = EdgeIndex(sys.argv[1])
index.ensure(4)
lent = index.lend(index.create_version())
print(lent.process.pid, flush=True)
time.sleep(60)
"""


def test_the_writer_process_ends_with_its_parent(tmp_path: Path) -> None:
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-c", LENDER, str(tmp_path / "edge")]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)
    store = EdgeIndex(tmp_path / "edge")  # the orphan version is there, and opens
    try:
        assert store.versions() == [1, 2] and store.live_version() == 1
        store.drop_version(2)
    finally:
        store.close()
