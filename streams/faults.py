"""Fault injection for crash tests: ``ENGRAM_CRASH_AT=<point>:<n>`` kills the worker
with SIGKILL the ``n``-th time (1-based) it passes the named point, as ``kill -9``
would at that instant. The variable is read once, at import; unset (production), a
hook is one comparison and :func:`after` returns its awaitable untouched.

Points (each names the moment just after something became durable):

* ``flush.history`` -- a group's events and memory changes are in ClickHouse (its
  derived events and dead letters may or may not be on the log yet);
* ``flush.derived`` -- a group's derived events are on ``engram.memory`` (its history
  write may or may not be done);
* ``flush.written`` -- history, derived events and dead letters are all written;
  the agent states are not saved yet;
* ``flush.saved`` -- the states are on the changelog; no message of the group is
  acked yet (so none committed);
* ``vectors.run`` -- one run of vector-store operations is applied, the rest of the
  batch not yet (a crash mid-upsert of a batch);
* ``ingest.published`` -- a batch of ``engram.ingest`` is sealed and on
  ``engram.events``; its offsets are not committed yet (the next owner seals it
  again: the fold drops the copies by event id). Counted in records: ``:n`` is the
  first batch with which at least ``n`` records were sealed;
* ``embed.published`` -- a batch's ``memory.embedded`` records are on the log; the
  batch is not acked;
* ``erasure.purged`` -- an erasure's purge of the history finished one table (the
  archive first, then the memory changes, then the checkpoints); the rest of the
  purge, the receipt and the states are not written yet.

Sink faults: ``ENGRAM_FAULT`` makes a store fail or slow down at the sink boundary
(the write call sites: the fold's history write, the vector agent's store calls),
as an outage of ClickHouse or of the vector store would. Comma-separated specs:

* ``clickhouse:down:20`` -- every write to the store raises :class:`SinkDown` for
  20 s, counted from the first write attempt; then writes go through (``down``
  alone: for the worker's whole life);
* ``vectors:slow:0.5:30`` -- every write waits 0.5 s first, for 30 s from the
  first attempt (no duration: for the worker's whole life; a long delay is a hang);
* ``flags`` -- faults toggled at run time, while the worker runs: a file
  ``$ENGRAM_HOME/faults/<store>`` holding ``down`` or ``slow:<seconds>`` puts the
  fault on, removing it ends the outage (checked at every write: one ``stat``; a
  file that says something else fails the writes with its ValueError, as down).

Stores: ``clickhouse``, ``vectors``. The worker retries a failed write in place
(``streams.retry``), so an outage stalls the line and shows as lag; no offset is
committed past what was written. Unset (production), a check is one comparison.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
VARIABLE = "ENGRAM_CRASH_AT"
POINTS = (
    "flush.history",
    "flush.derived",
    "flush.written",
    "flush.saved",
    "vectors.run",
    "ingest.published",
    "embed.published",
    "erasure.purged",
)


def parse(value: str | None) -> tuple[str, int] | None:
    """``"flush.saved:3"`` -> ``("flush.saved", 3)``; None or ``""`` -> None."""
    if not value:
        return None
    point, _, count = value.rpartition(":")
    if point not in POINTS or not count.isdigit() or int(count) < 1:
        raise ValueError(f"{VARIABLE}={value!r}: use <point>:<n>, n >= 1, point one of {POINTS}")
    return point, int(count)


TARGET = parse(os.environ.get(VARIABLE))
_passes = 0
_lock = threading.Lock()


def purged(table: str) -> None:
    """The history's purge hook (``ClickHouseHistory.purged``): ``erasure.purged``."""
    reached("erasure.purged")


def reached(point: str, count: int = 1) -> None:
    """Kill this process (SIGKILL) on the n-th passage of the target point; a passage
    of ``count`` things (records of a batch) counts ``count`` times."""
    if TARGET is None or point != TARGET[0]:
        return
    global _passes
    with _lock:
        _passes += count
        if _passes >= TARGET[1]:
            os.kill(os.getpid(), signal.SIGKILL)


def after(point: str, awaitable: Awaitable[T]) -> Awaitable[T]:
    """``awaitable``, then :func:`reached` ``point`` once it has completed."""
    if TARGET is None or point != TARGET[0]:
        return awaitable

    async def then() -> T:
        result = await awaitable
        reached(point)
        return result

    return then()


# -- sink faults -------------------------------------------------------------------

SINK_VARIABLE = "ENGRAM_FAULT"
STORES = ("clickhouse", "vectors")
MODES = ("down", "slow")
FLAGS = "flags"


class SinkDown(ConnectionError):
    """An injected outage: the store did not take the write."""


@dataclass(frozen=True)
class SinkFault:
    """``mode`` (``down`` or ``slow``) of ``store``; ``delay`` is the wait before each
    write when slow; ``seconds`` how long it lasts from the first write attempt (None:
    for ever)."""

    store: str
    mode: str
    delay: float = 0.0
    seconds: float | None = None


@dataclass(frozen=True)
class SinkFaults:
    """What ``ENGRAM_FAULT`` asks: timed faults by store, and whether flag files count."""

    timed: dict[str, SinkFault]
    flags_dir: Path | None = None


def _number(spec: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{SINK_VARIABLE}: {spec!r}: {text!r} is not a number") from None
    if value < 0:
        raise ValueError(f"{SINK_VARIABLE}: {spec!r}: {text!r} is negative")
    return value


def parse_fault(spec: str) -> SinkFault:
    """``"clickhouse:down:20"`` or ``"vectors:slow:0.5[:30]"`` -> a :class:`SinkFault`."""
    store, _, rest = spec.partition(":")
    mode, _, args = rest.partition(":")
    numbers = [_number(spec, a) for a in args.split(":")] if args else []
    if store not in STORES or mode not in MODES:
        raise ValueError(
            f"{SINK_VARIABLE}: {spec!r}: use <store>:<mode>:..., store one of "
            f"{STORES}, mode one of {MODES}"
        )
    if mode == "down" and len(numbers) <= 1:
        return SinkFault(store, mode, seconds=numbers[0] if numbers else None)
    if mode == "slow" and len(numbers) in (1, 2):
        return SinkFault(store, mode, numbers[0], numbers[1] if len(numbers) == 2 else None)
    raise ValueError(
        f"{SINK_VARIABLE}: {spec!r}: use {store}:down[:<seconds>]"
        f" or {store}:slow:<delay>[:<seconds>]"
    )


def parse_faults(value: str | None, home: Path) -> SinkFaults | None:
    """The whole ``ENGRAM_FAULT`` value; None (no fault) when unset or empty."""
    specs = [s.strip() for s in (value or "").split(",") if s.strip()]
    if not specs:
        return None
    timed = {f.store: f for f in (parse_fault(s) for s in specs if s != FLAGS)}
    return SinkFaults(timed, home / "faults" if FLAGS in specs else None)


def flag_fault(path: Path) -> SinkFault | None:
    """The fault a flag file asks for (``down`` or ``slow:<seconds>``), None without one."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return parse_fault(f"{path.name}:{text or 'down'}")


class SinkGate:
    """Decides, at each write, whether ``store`` is down or slow right now."""

    def __init__(self, faults: SinkFaults, clock: Callable[[], float] = time.monotonic) -> None:
        self.faults = faults
        self.clock = clock
        self.first: dict[str, float] = {}

    def fault(self, store: str) -> SinkFault | None:
        """The fault in force for ``store`` now (a flag file wins over a timed fault)."""
        if self.faults.flags_dir is not None:
            flagged = flag_fault(self.faults.flags_dir / store)
            if flagged is not None:
                return flagged
        timed = self.faults.timed.get(store)
        if timed is None:
            return None
        began = self.first.setdefault(store, self.clock())
        over = timed.seconds is not None and self.clock() - began >= timed.seconds
        return None if over else timed

    def delay_or_raise(self, store: str) -> float:
        """Raise :class:`SinkDown` if ``store`` is down; else the seconds to wait first."""
        fault = self.fault(store)
        if fault is None:
            return 0.0
        if fault.mode == "down":
            raise SinkDown(f"{store} is down (injected by {SINK_VARIABLE})")
        return fault.delay


def _home() -> Path:
    return Path(os.environ.get("ENGRAM_HOME") or Path.home() / ".engram").expanduser()


SINK_FAULTS = parse_faults(os.environ.get(SINK_VARIABLE), _home())
_gate = SinkGate(SINK_FAULTS) if SINK_FAULTS is not None else None


def check(store: str) -> None:
    """At a blocking write call site (a worker thread): raise :class:`SinkDown` when
    ``store`` is down, sleep first when it is slow; nothing when no fault is set."""
    if _gate is None:
        return
    delay = _gate.delay_or_raise(store)
    if delay:
        time.sleep(delay)


def guarded(store: str, write: Awaitable[T]) -> Awaitable[T]:
    """``write`` at an async call site: untouched without faults; else it first raises
    :class:`SinkDown` (``write`` closed, never run) or waits while ``store`` is slow."""
    if _gate is None:
        return write
    gate = _gate

    async def gated() -> T:
        try:
            delay = gate.delay_or_raise(store)
        except SinkDown:
            _close(write)
            raise
        if delay:
            await asyncio.sleep(delay)
        return await write

    return gated()


def _close(write: Awaitable[Any]) -> None:
    if isinstance(write, Coroutine):
        write.close()
