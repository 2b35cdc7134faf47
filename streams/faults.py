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
* ``embed.published`` -- a batch's ``memory.embedded`` records are on the log; the
  batch is not acked.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")
VARIABLE = "ENGRAM_CRASH_AT"
POINTS = (
    "flush.history",
    "flush.derived",
    "flush.written",
    "flush.saved",
    "vectors.run",
    "embed.published",
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


def reached(point: str) -> None:
    """Kill this process (SIGKILL) on the n-th passage of the target point."""
    if TARGET is None or point != TARGET[0]:
        return
    global _passes
    with _lock:
        _passes += 1
        if _passes == TARGET[1]:
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
