"""One Qdrant Edge shard written by a child process, so its writes leave our GIL.

Edge's Python binding holds the interpreter lock while it converts a point (its
payload above all: ~50 µs for a memory's 20 fields) and while it applies an update
(~40 µs a point): ~100 µs of a point's time that no other thread of the process
can use. A vector rebuild hands the version it builds to a child
(:meth:`sinks.vectors.EdgeIndex.lend`): the parent reads and decodes the log while
the child writes, on the other core. Edge allows one opener per shard directory,
so while a version is lent the child alone has it open.

Contract of :class:`ShardProcess`:

- **Writes apply in call order** (one request at a time, under a lock), with the
  semantics of :class:`sinks.edge_shard.ShardWriter` (the child runs it).
- **Durable when :meth:`ShardProcess.close` returns**: the child flushed the
  shard and closed it, and exited; the parent may open the directory again. A
  write that returned is in the shard's write-ahead log, as in process.
- **Errors**: a write the child refused raises here (ValueError for a wrong
  dimension, :class:`ShardProcessFailed` otherwise; the child lives on); a child
  that died raises :class:`ShardProcessGone` and is not restarted (the version it
  was writing is abandoned by the caller: a rebuild fails and drops it).
- **The child ends with its parent**: it reads its requests from a socket and a
  closed socket ends it; it ignores SIGINT (a Ctrl-C reaches the parent, which
  stops it).

Wire (a socket pair, :class:`multiprocessing.connection.Connection` framing): a
request is ``b"W"`` + the pickled runs ``[(kind, items), ...]`` (kinds ``upsert``
with :data:`~sinks.edge_shard.WirePoint` items, ``dense``, ``payload``, ``erase``),
answered ``b"K"`` + the pickled counts of the erasures; or ``b"C"`` (flush, close,
exit), answered ``b"K"``. Any failure is answered ``b"E"`` + the pickled error type
name and message. The child's first message is ``b"R"`` once the shard is open.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import qdrant_edge as qe

from sinks.edge_shard import ShardWriter

START_TIMEOUT_S = 60.0
"""Longest wait for a child to open its shard."""

Run = tuple[str, list[Any]]
"""One kind of write and its items, as :func:`streams.vectors.apply_operations` groups them."""


class ShardProcessGone(RuntimeError):
    """The child exited, or never started: its shard's writes stop here."""


class ShardProcessFailed(RuntimeError):
    """The child refused a request (its error's type and message); it lives on."""


class ShardProcess:
    """The Edge shard at ``path`` (dense vectors of ``dims``), written by a child
    process; see the module for the contract. Starts the child at once."""

    def __init__(self, path: Path, dims: int, *, sync: bool = False) -> None:
        self.path = path
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair()
        with ours, theirs:
            command = [sys.executable, "-m", "sinks.edge_process", str(path), str(dims)]
            command += ["1" if sync else "0", str(theirs.fileno())]
            self._child = subprocess.Popen(
                command, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL
            )
            self._conn: Connection | None = Connection(os.dup(ours.fileno()))
        try:
            self._ready()
        except BaseException:
            self.kill()
            raise

    @property
    def pid(self) -> int | None:
        """The child's pid while it runs."""
        return self._child.pid if self._child.poll() is None else None

    def write(self, runs: list[Run]) -> list[int]:
        """Apply ``runs`` in order in the child; the counts of its erasures, in order."""
        counts: list[int] = pickle.loads(self._call(b"W" + _dumps(runs)))
        return counts

    def close(self) -> None:
        """Have the child flush and close the shard, and wait for it to exit. Raises
        :class:`ShardProcessGone` if it was gone before (the shard may miss writes)."""
        try:
            self._call(b"C")
            self._child.wait(timeout=START_TIMEOUT_S)
        finally:
            self.kill()

    def kill(self) -> None:
        """End the child now, without a flush (for a version that is dropped)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        if self._child.poll() is None:
            self._child.terminate()
            try:
                self._child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()

    def _ready(self) -> None:
        conn = self._conn
        assert conn is not None
        if not conn.poll(START_TIMEOUT_S):
            raise ShardProcessGone(f"the Edge writer of {self.path} did not start")
        try:
            ready = conn.recv_bytes()
        except (EOFError, OSError) as gone:
            raise ShardProcessGone(f"the Edge writer of {self.path} ended at start") from gone
        if ready != b"R":
            raise ShardProcessGone(f"the Edge writer of {self.path} failed: {_error(ready)[1]}")

    def _call(self, request: bytes) -> bytes:
        """One request and its ``K`` reply's data (the lock held throughout)."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise ShardProcessGone(f"the Edge writer of {self.path} was stopped")
            try:
                conn.send_bytes(request)
                reply = conn.recv_bytes()
            except (EOFError, OSError) as gone:
                raise ShardProcessGone(f"the Edge writer of {self.path} ended: {gone!r}") from gone
        if reply[:1] == b"K":
            return reply[1:]
        kind, message = _error(reply)
        if kind == "ValueError":
            raise ValueError(message)
        raise ShardProcessFailed(f"{kind}: {message}")


def _dumps(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _error(reply: bytes) -> tuple[str, str]:
    """The error type and message of an ``E`` reply."""
    if reply[:1] != b"E":
        return "ProtocolError", f"unexpected reply {reply[:40]!r}"
    kind, message = pickle.loads(reply[1:])
    return str(kind), str(message)


def _failure(error: BaseException) -> bytes:
    return b"E" + _dumps((type(error).__name__, str(error)))


# --------------------------------------------------------------------------- the child


def serve(path: str, dims: int, sync: bool, fd: int) -> None:
    """The child: open the shard at ``path``, say ready, answer requests until the
    socket closes (then close the shard) or a ``C`` request (flush and close first)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    try:
        shard = qe.EdgeShard.load(path)
    except Exception as error:  # the parent reports it
        conn.send_bytes(_failure(error))
        return
    writer = ShardWriter(shard, dims, sync=sync)
    conn.send_bytes(b"R")
    try:
        while True:
            try:
                request = conn.recv_bytes()
            except (EOFError, OSError):
                return
            if request[:1] == b"C":
                shard.flush()
                conn.send_bytes(b"K")
                return
            conn.send_bytes(answer(writer, request))
    finally:
        shard.close()


def answer(writer: ShardWriter, request: bytes) -> bytes:
    """The reply to one ``W`` request: the runs applied in order, or the failure."""
    try:
        if request[:1] != b"W":
            raise ValueError(f"unknown request {request[:1]!r}")
        counts: list[int] = []
        for kind, items in pickle.loads(request[1:]):
            counts += apply_run(writer, kind, items)
    except Exception as error:
        return _failure(error)
    return b"K" + _dumps(counts)


def apply_run(writer: ShardWriter, kind: str, items: list[Any]) -> list[int]:
    """One run on ``writer``; the counts of an ``erase`` run."""
    if kind == "erase":
        return [writer.erase(agent_id, user_id) for agent_id, user_id in items]
    if kind == "upsert":
        writer.upsert(items)
    elif kind == "dense":
        writer.set_dense(items)
    elif kind == "payload":
        writer.set_payload(items)
    else:
        raise ValueError(f"unknown write {kind!r}")
    return []


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4]))
