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
        await close_quietly(client)
        raise
    return client


async def close_quietly(client: object) -> None:
    """Stop ``client`` (an admin client closes), never raising but cancellation: the
    caller is already handling a failure (a start, a request), which is the one to tell."""
    end = getattr(client, "stop", None) or getattr(client, "close", None)
    if end is None:
        return
    with contextlib.suppress(Exception):
        await end()
