"""Strict offset order for an agent that forwards or projects what it reads.

faust may hand an agent a partition's messages with a hole: messages it skipped
during a rebalance (acked but refused by :class:`streams.app._Consumer`, so read
again later) or that a re-read dropped. An agent that writes each message
somewhere that keeps order (``engram.ingest`` forwarding to ``engram.events``,
``engram.vectors`` overwriting points) must not act on a message before the ones
ahead of it, or the re-read puts an older one last. :class:`InOrder` admits each
partition's messages strictly in offset order from the group's committed offset;
a message past a hole is held (never acked, so never committed) and its partition
read again from the hole, like the fold's guard (:class:`streams.pipeline.Folder`),
whose marks are durable; here the committed offset is the mark, since acting
twice on a message is harmless for these agents and skipping one is not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiokafka import TopicPartition

from streams.app import ack_messages

log = logging.getLogger("engram.streams")

REREAD_PATIENCE_S = 2.0
"""How long a partition sought back to a hole may go without delivering it before it
is sought there again (:class:`Holes`)."""


class Holes:
    """The holes a worker sought back to, sought again while they stay holes.

    A seek can come to nothing: messages faust fetched before it are still being
    delivered, and each moves faust's read offset past the hole, so the re-read that
    follows is dropped as already read. Nothing may arrive for that partition again
    (an idle topic), and the agent waiting for the hole would wait for ever. Every
    second (a timer, :func:`holes_of`) a hole older than :data:`REREAD_PATIENCE_S`
    whose agent still expects it is sought again; one that was filled, or whose
    partition left this worker, is dropped."""

    def __init__(self, patience_s: float = REREAD_PATIENCE_S) -> None:
        self.patience_s = patience_s
        self.open: dict[Any, tuple[int, float, Callable[[], int | None]]] = {}

    def sought(self, tp: Any, offset: int, expected: Callable[[], int | None]) -> None:
        """``tp`` was sought back to ``offset``; ``expected`` tells the offset its
        agent waits for now (the hole is filled once that moves on)."""
        self.open[tp] = (offset, time.monotonic(), expected)

    def forget(self) -> None:
        self.open.clear()

    def pending(self, tp: Any, offset: int) -> bool:
        """Whether ``tp`` was sought back to ``offset`` less than the patience ago (its
        re-read is on its way: seeking again would only cut it short)."""
        found = self.open.get(tp)
        return (
            found is not None
            and found[0] == offset
            and (time.monotonic() - found[1] < self.patience_s)
        )

    def due(self, assigned: set[Any], now: float) -> list[tuple[Any, int]]:
        """The holes to seek again now (their times reset); filled and unassigned ones
        leave."""
        out = []
        for tp, (offset, at, expected) in list(self.open.items()):
            if tp not in assigned or expected() != offset:
                del self.open[tp]
            elif now - at >= self.patience_s:
                self.open[tp] = (offset, now, expected)
                out.append((tp, offset))
        return out

    async def retry(self, consumer: Any) -> None:
        for tp, offset in self.due(set(consumer.assignment()), time.monotonic()):
            log.warning("%s[%d]: offset %d still missing; reading again from there", *tp, offset)
            await consumer.seek(tp, offset)


def holes_of(app: Any) -> Holes:
    """The app's :class:`Holes`, made (with its one-second timer, and forgotten when
    partitions are revoked) on first use; call it before the worker starts."""
    found: Holes | None = getattr(app, "_engram_holes", None)
    if found is None:
        holes = found = Holes()
        app._engram_holes = holes

        @app.timer(1.0)  # type: ignore[untyped-decorator]  # app is Any here
        async def seek_holes_again() -> None:
            await holes.retry(app.consumer)

        @app.on_partitions_revoked.connect  # type: ignore[untyped-decorator]
        async def forget(sender: Any, *_: Any, signal: Any, **__: Any) -> None:
            holes.forget()

    return found


@dataclass
class Admitted:
    """One batch sorted by :meth:`InOrder.admit`: ``ready`` to act on (in order),
    ``done`` acted on already (ack them), ``held`` past a hole (never ack them),
    and per partition the offset to read again from (``gaps``)."""

    ready: list[Any] = field(default_factory=list)
    done: list[Any] = field(default_factory=list)
    held: list[Any] = field(default_factory=list)
    gaps: dict[TopicPartition, int] = field(default_factory=dict)


class InOrder:
    """Per partition, the next offset an agent may act on: one past the last it
    admitted, or, after an assignment, the group's committed offset (everything
    below it was acted on and acknowledged before it was committed)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.holes = holes_of(app)
        self.next: dict[TopicPartition, int] = {}
        self.passed: dict[TopicPartition, set[int]] = {}

    def forget(self) -> None:
        """Partitions were revoked: start again from the committed offsets."""
        self.next.clear()
        self.passed.clear()

    def pass_over(self, messages: Sequence[Any]) -> None:
        """``messages`` need nothing of the agent (its direct feed passed them over,
        acked): each counts as acted on once the agent reached it, so the next offset
        moves past it then, not a hole to wait for. Constant time a message: many pass
        while the agent works on a message ahead of them (an embedding)."""
        for message in messages:
            tp = TopicPartition(message.topic, message.partition)
            offset = message.offset
            found = self.next.get(tp)
            if found is not None and offset < found:
                continue  # acted on already (a re-read)
            self.passed.setdefault(tp, set()).add(offset)
            if found is None or offset == found:
                self._advance(tp)

    def _advance(self, tp: TopicPartition) -> None:
        """Move ``tp``'s next offset past the passed-over offsets it reached (each one
        leaves the set as it is passed)."""
        passed = self.passed.get(tp)
        if not passed:
            return
        found = self.next.get(tp)
        if found is None:
            self.expected(tp)  # from the committed offset, if known: it advances then
            return
        while found in passed:
            passed.discard(found)
            found += 1
        self.next[tp] = found

    @property
    def consumer(self) -> Any:
        """The app's consumer (made when the worker starts, after the agents)."""
        return self.app.consumer

    def expected(self, tp: TopicPartition) -> int | None:
        found = self.next.get(tp)
        if found is None:
            committed = self.consumer._committed_offset.get(tp)
            if committed is not None:
                found = self.next[tp] = int(committed)
                passed = self.passed.get(tp)
                if passed:  # what was passed below the committed offset is done
                    passed.difference_update([o for o in passed if o < found])
                    self._advance(tp)
                    found = self.next[tp]
        return found

    def skip_to(self, tp: TopicPartition, offset: int) -> None:
        """Records below ``offset`` are gone (deleted by retention): start there."""
        if self.next.get(tp, offset) < offset:
            gone = (self.next[tp], offset - 1)
            log.warning("%s[%d]: offsets %d..%d are gone from the log", *tp, *gone)
            self.next[tp] = offset
            passed = self.passed.get(tp)
            if passed:
                passed.difference_update([o for o in passed if o < offset])
                self._advance(tp)

    def admit(self, messages: Sequence[Any]) -> Admitted:
        """Sort ``messages`` (in delivery order) into ready, done and held."""
        out = Admitted()
        for message in messages:
            tp = TopicPartition(message.topic, message.partition)
            if tp in out.gaps:
                out.held.append(message)
                continue
            expected = self.expected(tp)
            offset = message.offset
            if expected is not None and offset > expected:
                out.gaps[tp] = expected
                out.held.append(message)
            elif expected is not None and offset < expected:
                out.done.append(message)
            else:
                out.ready.append(message)
                self.next[tp] = offset + 1
                passed = self.passed.get(tp)
                if passed:
                    if expected is None:  # no committed offset: it starts here
                        passed.difference_update([o for o in passed if o <= offset])
                    self._advance(tp)
        return out


async def read_holes_again(consumer: Any, guard: InOrder, gaps: dict[TopicPartition, int]) -> None:
    """Seek each partition of ``gaps`` back to its hole (or to its log start, when
    retention removed the hole: then the guard starts there)."""
    if not gaps:
        return
    earliest = await consumer.earliest_offsets(*gaps)
    for tp, offset in sorted(gaps.items()):
        start = max(offset, earliest.get(tp) or 0)
        guard.skip_to(tp, start)
        if guard.holes.pending(tp, start):
            continue
        log.warning("%s[%d]: offset %d never came; reading again from there", *tp, start)
        await consumer.seek(tp, start)
        guard.holes.sought(tp, start, partial(guard.expected, tp))


async def in_order(
    batch: Sequence[Any],
    guard: InOrder,
    act: Callable[[list[Any]], Awaitable[None]],
) -> list[Any]:
    """Act on the batch's messages that come next in their partitions, in order
    (``act`` returns once its work is durable and never raises but on cancellation);
    ack those and the ones acted on before, and return them; hold the rest (never
    acked: their partitions are read again from the hole). One extra reference each
    keeps faust from acking a held message when the batch ends."""
    messages = [item.message for item in batch]
    for message in messages:
        message.incref()
    admitted = guard.admit(messages)
    if admitted.ready:
        await act(admitted.ready)
    acted = admitted.ready + admitted.done
    ack_messages(guard.consumer, acted)
    await read_holes_again(guard.consumer, guard, admitted.gaps)
    return acted


COMMIT_RETRY_S = 0.05
"""Pause between attempts of :func:`commit_acted` (another commit in flight, a broker
refusal)."""
COMMIT_PATIENCE_S = 10.0
"""How long :func:`commit_acted` tries before it leaves the offsets to faust's
periodic commit (a partition whose acked offsets have a gap cannot be committed past
it: the worker's consumer heals that by reading again, see ``streams.app``)."""


async def commit_acted(consumer: Any, messages: Sequence[Any]) -> None:
    """Commit the group's offsets past ``messages`` (what :func:`in_order` acted on)
    now, not at faust's next commit interval, so a crash makes the next owner read
    again only what came after them.

    Returns once every partition of ``messages`` still assigned to this worker has its
    committed offset past its last message; a partition revoked meanwhile is its next
    owner's (which reads again from the committed offset: acting twice is harmless for
    these agents, see the module doc). A refused commit is tried again for
    :data:`COMMIT_PATIENCE_S`, then left to faust's periodic commit with a warning.
    Never raises but on cancellation."""
    ends: dict[Any, int] = {}
    for message in messages:
        consumer.ack(message)  # faust's own ack only comes when the batch ends
        ends[message.tp] = max(ends.get(message.tp, 0), message.offset + 1)
    attempt, deadline = 0, time.monotonic() + COMMIT_PATIENCE_S
    while left := _uncommitted(consumer, ends):
        if time.monotonic() > deadline:
            log.warning("offsets %s not committed yet: left to the periodic commit", left)
            return
        attempt += 1
        try:
            await consumer.commit(set(left))
        except Exception as error:  # the broker refused: the offsets stay uncommitted
            log.warning("commit of %s failed (attempt %d): %r", sorted(left), attempt, error)
        if _uncommitted(consumer, ends):
            await asyncio.sleep(COMMIT_RETRY_S)  # another commit was in flight, or refused


def _uncommitted(consumer: Any, ends: dict[Any, int]) -> dict[Any, int]:
    """The partitions of ``ends`` assigned here whose committed offset is before their end."""
    assigned = consumer.assignment()
    committed = consumer._committed_offset
    return {
        tp: end for tp, end in ends.items() if tp in assigned and (committed.get(tp) or 0) < end
    }
