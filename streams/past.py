"""The past a rollback or a fork folds: an agent's archived events up to a sequence.

The fold cannot read the archive (processors are pure), so the worker reads it here
and hands it over (:class:`processors.rebase.Past`): the agent's rows of the
ClickHouse ``events`` table with ``seq <= upto``, in sequence order, each payload
opened (sealed ones with the worker's keys; shredded ones left out, as every replay
leaves them out); when the log begins with a ``memory.forked``, the source's past
up to its ``source_seq`` too, and so on down a chain of forks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from processors.rebase import Past
from schemas import BadEvent, Event, MemoryForked
from sinks.clickhouse import ArchivedEvent, ClickHouseHistory
from sinks.keys import OpenEvent

Rows = Callable[[str, int], Awaitable[Sequence[ArchivedEvent]]]
"""``(agent_id, upto)`` to that agent's archived rows with ``seq <= upto``, in order."""
Opener = Callable[[Sequence[ArchivedEvent]], Awaitable[OpenEvent]]
"""What opens a batch of rows (the worker covers their keys first)."""


async def read_past(rows: Rows, opener: Opener, agent_id: str, upto: int) -> Past:
    """``agent_id``'s past up to sequence ``upto`` (see the module docstring)."""
    found = await rows(agent_id, upto)
    past = _past(agent_id, found, await opener(found))
    source = _source(past)
    if source is None:
        return past
    origin = await read_past(rows, opener, *source)
    return Past(past.agent_id, past.events, past.last_seq, origin)


def read_past_sync(history: ClickHouseHistory, read: OpenEvent, agent_id: str, upto: int) -> Past:
    """:func:`read_past` on the calling thread (a snapshot's replay), opening with ``read``."""
    past = _past(agent_id, list(history.agent_log(agent_id, upto_seq=upto)), read)
    source = _source(past)
    if source is None:
        return past
    origin = read_past_sync(history, read, *source)
    return Past(past.agent_id, past.events, past.last_seq, origin)


def _past(agent_id: str, rows: Sequence[ArchivedEvent], read: OpenEvent) -> Past:
    events: list[tuple[int, Event]] = []
    for row in rows:
        event = _opened(read, row)
        if event is not None:
            events.append((row.seq, event))
    return Past(agent_id, tuple(events), rows[-1].seq if rows else -1)


def _source(past: Past) -> tuple[str, int] | None:
    """The source agent and sequence of a past that begins with a fork."""
    first = past.events[0][1] if past.events else None
    if isinstance(first, MemoryForked):
        return first.body.source_agent_id, first.body.source_seq
    return None


def _opened(read: OpenEvent, row: ArchivedEvent) -> Event | None:
    try:
        return read(row.payload)
    except BadEvent:  # archived by the fold, so it decoded then; skipped like a shredded one
        return None


def history_rows(history: ClickHouseHistory) -> Rows:
    """:data:`Rows` from the history, on its executor."""

    async def rows(agent_id: str, upto: int) -> Sequence[ArchivedEvent]:
        return await history.call(lambda: list(history.agent_log(agent_id, upto_seq=upto)))

    return rows


def plain_opener(read: OpenEvent) -> Opener:
    """:data:`Opener` that needs no preparation (``read`` opens what it can)."""

    async def opener(_: Sequence[ArchivedEvent]) -> OpenEvent:
        return read

    return opener
