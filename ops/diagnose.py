"""What a worker that seems stuck shows of itself on SIGUSR1 (:class:`ops.worker.StackWorker`):
where its consumer stands per partition, and where engram's coroutines wait."""

from __future__ import annotations

import gc
import logging
import types
from typing import Any

import faust

log = logging.getLogger("engram.up")


def log_consumer_state(app: faust.App) -> None:
    """Log, per assigned partition, where the worker's consumer stands (SIGUSR1): what
    a stalled partition looks like from inside (paused, buffered, read, committed, and
    records fetched but not yet handed to the agents)."""
    consumer: Any = app.consumer
    try:
        fetcher = consumer._thread._ensure_consumer()._fetcher
        fetched = {tp: repr(r) for tp, r in fetcher._records.items()}
        subscription = consumer._thread._ensure_consumer()._subscription.subscription
        assignment = subscription.assignment if subscription is not None else None
    except Exception as error:  # a diagnostic: never let it hurt the worker
        log.warning("consumer state unavailable: %r", error)
        return
    active = consumer._active_partitions
    for tp in sorted(consumer.assignment()):
        state = assignment.state_value(tp) if assignment is not None else None
        log.warning(
            "%s[%d]: active=%s paused=%s buffered=%s read=%s committed=%s acked=%d"
            " position=%s fetcher_paused=%s fetched=%s",
            tp.topic,
            tp.partition,
            active is None or tp in active,
            tp in consumer._paused_partitions,
            tp in consumer._buffered_partitions,
            consumer._read_offset.get(tp),
            consumer._committed_offset.get(tp),
            len(consumer._acked.get(tp, ())),
            getattr(state, "position", None),
            getattr(state, "paused", None),
            fetched.get(tp),
        )


def log_awaits() -> None:
    """Log where each suspended coroutine of engram's own code waits, following its
    chain of awaits into coroutines and async generators (mode's dump of the tasks
    stops at faust's ``await coro`` around an agent): where an agent waits, if it
    waits for ever."""
    ours = ("/streams/", "/sinks/", "/ops/", "/engram/")
    for found in gc.get_objects():
        if not isinstance(found, types.CoroutineType) or found.cr_frame is None:
            continue
        if not any(part in found.cr_frame.f_code.co_filename for part in ours):
            continue
        chain: list[str] = []
        awaited: Any = found
        while awaited is not None and len(chain) < 40:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
            if frame is not None:
                chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
        log.warning("suspended in:\n  %s", "\n  ".join(chain))
