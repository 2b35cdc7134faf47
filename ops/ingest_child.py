"""The ingest hop (:mod:`streams.ingest`) in a process of its own, off the worker's GIL.

The worker is one Python process bound by its interpreter lock. Sealing at ingest
(``engram.ingest`` -> sealed -> ``engram.events``) cost the worker about 70 µs an
event (reading the clear event, validating it, sealing it, producing it, committing
per batch), beside the ~140 µs the fold and its projections cost: the default
(sealed) path ran ~40 % slower than publishing straight to ``engram.events``.
With ``ENGRAM_INGEST_PROCESS=on`` (the default) ``engram up`` runs the same faust agent
(:func:`streams.ingest.register_ingest`, same batches, order, commits, sweeps and dead
letters) in a child process, in a consumer group of its own (:func:`ingest_group`), and
the worker no longer reads ``engram.ingest``; the fold opens the sealed events it reads.

Contract:

- **Same guarantees as in the worker.** A batch is committed only once all its sealed
  events are acknowledged; a crash seals again at most the batch it interrupted, which
  the fold's window of event ids drops; an agent's events keep their order.
- **Supervised.** :class:`IngestChild` starts the child before the worker and starts it
  again (after :data:`RESTART_DELAY_S`, longer while it keeps dying young) whenever it
  exits while the stack runs, saying so in the stack's log; :meth:`IngestChild.stop`
  asks it to stop (SIGTERM, the faust worker's graceful stop), then kills it after
  :data:`STOP_TIMEOUT_S`.
- **It dies with the stack.** The child asks the kernel for SIGKILL when its parent
  ends (``PR_SET_PDEATHSIG``, Linux), so a stack killed with ``kill -9`` leaves no
  ingest process behind, exactly as when the hop ran inside it; where that is not
  available, it checks its parent every second. It runs in a session of its own, so a
  Ctrl-C in a terminal stops the stack, which stops the child.
- **Same settings.** The child reads the stack's ``ENGRAM_*`` environment, with the
  broker's address, the group timeouts and the master key the stack resolved.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping

import faust

from engram.settings import Settings
from ops.worker import run_worker, worker_app, worker_keys
from schemas import RAW_TYPE_NAMES
from schemas.sealed import SealingCodec
from streams.ingest import WorkerKeys, register_ingest

MODULE = "ops.ingest_child"
"""The child's module (``python -m``): what its command line says."""
RESTART_DELAY_S = 1.0
"""The wait before starting a dead child again; it doubles, up to
:data:`MAX_RESTART_DELAY_S`, while the child lives less than :data:`SHORT_LIFE_S`."""
MAX_RESTART_DELAY_S = 30.0
SHORT_LIFE_S = 30.0
STOP_TIMEOUT_S = 15.0
PARENT_CHECK_S = 1.0
_PR_SET_PDEATHSIG = 1
PARENT_VARIABLE = "ENGRAM_INGEST_PARENT"
"""The stack's pid, as the child's environment tells it (the child may be adopted by
another process before it asks for its parent's death signal)."""


def ingest_group(group_id: str) -> str:
    """The consumer group of the ingest hop when it runs in its own process: the
    worker's group with ``.ingest`` after it (the worker's own group no longer reads
    ``engram.ingest``)."""
    return f"{group_id}.ingest"


def build_ingest_app(settings: Settings, bootstrap: str, *, batch_size: int) -> faust.App:
    """A faust app with only the ingest agent, as the worker registers it in process
    (``batch_size``: at most the fold's window of event ids, see
    :func:`streams.ingest.register_ingest`)."""
    app, topics = worker_app(
        settings,
        bootstrap,
        app_id=ingest_group(settings.group_id),
        datadir="faust-ingest",
        memory_topic=settings.memory_topic,
        ingest=True,
    )
    assert topics.ingest is not None
    keys, _ = worker_keys(settings, bootstrap)
    register_hop(app, settings, bootstrap, topics.ingest, keys, batch_size, remember=False)
    return app


def register_hop(
    app: faust.App,
    settings: Settings,
    bootstrap: str,
    ingest: faust.TopicT,
    keys: WorkerKeys,
    batch_size: int,
    *,
    remember: bool,
) -> None:
    """Declare the ingest agent on ``app``, with ``settings``' topics, window and feed,
    sealing with ``keys`` (in the worker or in the child alike). ``remember``: whether
    the events it seals are remembered for the fold to open without decrypting or
    decoding them (:attr:`schemas.sealed.Sealer.remember`): only in the fold's process."""
    register_ingest(
        app,
        ingest=ingest,
        events_topic=settings.events_topic,
        dead_letter_topic=settings.dlq_topic,
        codec=SealingCodec(
            keys.ring, max_bytes=settings.max_event_bytes, accept=RAW_TYPE_NAMES, remember=remember
        ),
        keys=keys,
        bootstrap=bootstrap,
        batch_size=batch_size,
        within=settings.relay_interval_s,
        direct=settings.direct_feed,
    )


def child_env(settings: Settings, bootstrap: str, batch_size: int) -> dict[str, str]:
    """The child's environment: the stack's, with what the stack resolved itself (the
    broker it started, the group timeouts it chose for it, its master key file)."""
    env = dict(os.environ)
    env["ENGRAM_HOME"] = str(settings.home)
    env["ENGRAM_KAFKA_BOOTSTRAP"] = bootstrap
    env["ENGRAM_BATCH_SIZE"] = str(batch_size)
    session, rebalance = settings.group_timeouts()
    if session is not None:
        env["ENGRAM_SESSION_TIMEOUT_S"] = str(session)
    if rebalance is not None:
        env["ENGRAM_REBALANCE_TIMEOUT_S"] = str(rebalance)
    if settings.master_key_base64 is None and settings.master_key_file is not None:
        env["ENGRAM_MASTER_KEY_FILE"] = str(settings.master_key_file)
    env["ENGRAM_SEAL"] = "on" if settings.seal else "off"
    env[PARENT_VARIABLE] = str(os.getpid())
    return env


class IngestChild:
    """Runs and supervises the ingest child of a stack (see the module)."""

    def __init__(
        self,
        settings: Settings,
        bootstrap: str,
        *,
        batch_size: int,
        say: Callable[[str], None] = print,
    ) -> None:
        self.env = child_env(settings, bootstrap, batch_size)
        self.say = say
        self._child: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._supervise, name="engram-ingest", daemon=True)

    def start(self) -> None:
        """Start the child, and keep it running until :meth:`stop`."""
        self._thread.start()

    def stop(self) -> int | None:
        """Stop the child (and its supervision); its exit code, None if none ran."""
        self._stopping.set()
        with self._lock:
            child = self._child
        code = _terminate(child) if child is not None else None
        if self._thread.is_alive():
            self._thread.join(timeout=STOP_TIMEOUT_S + 5)
        return code

    def _spawn(self) -> subprocess.Popen[bytes] | None:
        with self._lock:
            if self._stopping.is_set():
                return None
            self._child = subprocess.Popen(
                [sys.executable, "-m", MODULE],
                env=self.env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            return self._child

    def _supervise(self) -> None:
        # the thread that starts the child waits on it: the child's PR_SET_PDEATHSIG
        # fires when the thread that forked it ends, so it must outlive the child
        delay = RESTART_DELAY_S
        while not self._stopping.is_set():
            child = self._spawn()
            if child is None:
                return
            began = time.monotonic()
            code = child.wait()
            if self._stopping.is_set():
                return
            # a child that keeps dying young (a setting it refuses) is started less often
            short = time.monotonic() - began < SHORT_LIFE_S
            delay = min(delay * 2, MAX_RESTART_DELAY_S) if short else RESTART_DELAY_S
            self.say(f"ingest process exited with {code}; starting it again in {delay:.0f} s")
            self._stopping.wait(delay)


def _terminate(child: subprocess.Popen[bytes]) -> int:
    if child.poll() is None:
        child.terminate()
        try:
            return child.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
    return child.wait()


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent (pid ``parent``) ends (Linux), else poll for
    it; at once if it has ended already (this process was then adopted)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:  # the parent ended before the request
                os.kill(os.getpid(), signal.SIGKILL)
            return
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="engram-parent-watch", daemon=True).start()


def main(env: Mapping[str, str] | None = None) -> int:
    """The child: run the ingest agent until SIGTERM (or the parent's end)."""
    _die_with_parent(int(os.environ.get(PARENT_VARIABLE) or os.getppid()))
    settings = Settings.from_env(env).with_home_master_key()
    logging.basicConfig(level=settings.log_level)
    bootstrap = settings.kafka_bootstrap
    if bootstrap is None:
        raise SystemExit("the ingest process needs ENGRAM_KAFKA_BOOTSTRAP (the stack sets it)")
    app = build_ingest_app(settings, bootstrap, batch_size=settings.batch_size)
    return run_worker(app, settings.log_level)


if __name__ == "__main__":
    sys.exit(main())
