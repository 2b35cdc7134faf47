"""Fork and rollback requests: checked against the history, then published as events.

``engram rollback A --to T`` publishes a ``memory.rolled_back`` on A naming T and
A's last sequence at or before T; ``engram fork A --as B --at T`` publishes a
``memory.forked`` on B naming A, T, that sequence and the id of A's event there. The
worker does the rest (:mod:`processors.rebase`, :mod:`streams.past`) and records what
changed as an ``agent.rolled_back`` / ``agent.forked`` change, which :func:`applied`
finds. Nothing is published when a check fails (:class:`Refused` says why).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from engram.errors import EngramError, RequestFailed
from engram.events import make_event
from schemas import Event, MemoryForked

if TYPE_CHECKING:
    from engram.client import Memory
    from engram.settings import Settings


class Refused(EngramError):
    """A fork or rollback that was not published, and why."""


EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
"""The earliest moment the history stores (ClickHouse's ``DateTime64`` range)."""


def check_moment(moment: datetime) -> None:
    """Refuse a naive moment, one before :data:`EARLIEST` or one in the future."""
    if moment.tzinfo is None:
        raise Refused(f"{moment.isoformat()} has no UTC offset")
    if moment < EARLIEST:
        raise Refused(f"{moment.isoformat()} is before any history (the earliest is 1900-01-01)")
    now = datetime.now(UTC)
    if moment > now:
        raise Refused(f"{moment.isoformat()} is in the future (now is {now.isoformat()})")


async def position_at(memory: Memory, agent_id: str, moment: datetime) -> int:
    """``agent_id``'s last sequence at or before ``moment`` in the archive; Refused for
    an unknown agent, a moment in the future or before the agent's first event."""
    check_moment(moment)
    if not await exists(memory, agent_id):
        raise Refused(f"unknown agent {agent_id!r}: the history has no event of it")
    try:
        snap = await memory.asnapshot(agent_id, as_of=moment, episodes=0)
    except RequestFailed as failed:
        if failed.status != 404:
            raise
        raise Refused(f"{moment.isoformat()} is before the first event of {agent_id!r}") from None
    return snap.position.seq


async def exists(memory: Memory, agent_id: str) -> bool:
    """Whether the history has an event of ``agent_id``."""
    try:
        await memory.asnapshot(agent_id, episodes=0)
    except RequestFailed as failed:
        if failed.status != 404:
            raise
        return False
    return True


def rollback_event(agent_id: str, to: datetime, to_seq: int, reason: str | None) -> Event:
    body = {"to": to.isoformat(), "to_seq": to_seq, "reason": reason}
    return make_event("memory.rolled_back", agent_id=agent_id, body=body)


async def event_at(memory: Memory, agent_id: str, seq: int) -> UUID:
    """The id of ``agent_id``'s archived event at ``seq`` (what a fork records of its
    source's position, so that an import tells the source from another agent of that
    name); Refused when the archive has no event there."""
    rows = await memory._rows(
        "SELECT toString(event_id) FROM events FINAL"
        " WHERE agent_id = {a:String} AND seq = {s:UInt64}",
        {"a": agent_id, "s": str(seq)},
    )
    if not rows:  # position_at found it there: the archive changed since (an erasure)
        raise Refused(f"the history has no event of {agent_id!r} at seq {seq}: try again")
    return UUID(str(rows[0][0]))


def fork_event(
    source: str, target: str, at: datetime, source_seq: int, source_event_id: UUID
) -> Event:
    body = {
        "source_agent_id": source,
        "at": at.isoformat(),
        "source_seq": source_seq,
        "source_event_id": str(source_event_id),
    }
    version = MemoryForked.SCHEMA_VERSION
    return make_event("memory.forked", agent_id=target, body=body, schema_version=version)


def applied(settings: Settings, request_id: UUID) -> dict[str, Any] | None:
    """The ``agent.rolled_back`` / ``agent.forked`` change the worker derived from the
    request (its type and body), or None while it has not."""
    import json

    from engram.history import run_sql

    _, rows = run_sql(
        settings,
        "SELECT type, body FROM memory_changes"
        " WHERE source_event_id = {r:UUID} AND type IN ('agent.rolled_back', 'agent.forked')",
        {"r": str(request_id)},
    )
    if not rows:
        return None
    found: dict[str, Any] = json.loads(rows[0][1])
    found["type"] = rows[0][0]
    return found
