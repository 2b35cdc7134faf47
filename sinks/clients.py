"""Starting aiokafka clients without leaving half-started ones behind.

An aiokafka producer, consumer or admin client whose ``start`` fails (the broker is
away) keeps what it opened and, once garbage, logs ``Unclosed AIOKafkaProducer`` (or
consumer) at ERROR level with its repr on standard output. The worker retries in place
every ~2 s while a broker is away, so each retry left one more of them.
"""

from __future__ import annotations

import contextlib
from typing import Protocol, TypeVar


class _Client(Protocol):
    async def start(self) -> None: ...


C = TypeVar("C", bound=_Client)


async def started(client: C) -> C:
    """``client`` once started. If it does not start, it is closed (``stop``, or
    ``close`` for an admin client) and the error of ``start`` propagates."""
    try:
        await client.start()
    except BaseException:
        await _close(client)
        raise
    return client


async def _close(client: object) -> None:
    """Stop ``client`` (an admin client closes), never raising but cancellation: what a
    failed close leaves is what a failed start left."""
    end = getattr(client, "stop", None) or getattr(client, "close", None)
    if end is None:
        return
    with contextlib.suppress(Exception):  # already failing: the start's error is the one
        await end()
