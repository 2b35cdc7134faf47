"""Retry in place: an infrastructure error stalls the line (lag shows it); it never
skips a batch.

The backoff is capped at 2 s: a store that comes back is written to again within
about 2 s (what ``ops/bench/outage.py`` measures), at the cost of one warning every
2 s while it is away.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("engram.streams")


async def retry_in_place(
    action: Callable[[], Awaitable[T]], *, what: str, first: float = 0.1, cap: float = 2.0
) -> T:
    """Run ``action`` until it succeeds, backing off exponentially up to ``cap`` seconds.

    Cancellation (worker shutdown) propagates; every other error is logged and retried.
    """
    delay = first
    attempt = 0
    while True:
        attempt += 1
        try:
            return await action()
        except Exception as error:
            log.warning(
                "%s failed (attempt %d), retrying in %.1fs: %r", what, attempt, delay, error
            )
            await asyncio.sleep(delay)
            delay = min(cap, delay * 2)
