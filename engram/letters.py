"""The dead-letter reader: what the pipeline refused, why, and (for an operator who
asks) what it was, opened with the stack's keys.

``GET /v1/admin/dead-letters`` and ``engram dead-letters`` list the newest dead
letters: partition, offset, time, reason and source (clear headers), the subject
whose key seals the bytes, and their state — ``open`` (opened with the keys),
``clear`` (kept unsealed: sealing was off), ``erased`` (the subject's key was
destroyed: the bytes are gone for good), ``unknown key`` or ``unreadable``. The
content itself is returned only when asked for (``content=true``), cut to
:data:`CONTENT_CHARS` characters.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Literal

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict

from engram.status import REASON_HEADER, SOURCE_HEADER
from schemas.errors import BadEvent
from schemas.letters import open_letter
from schemas.sealed import Keyring, UnknownKey, is_sealed
from sinks.clients import partitions_of
from sinks.keys import OpenEvent

CONTENT_CHARS = 4000
"""At most this many characters of a dead letter's content are returned."""

State = Literal["open", "clear", "erased", "unknown key", "unreadable"]


class DeadLetterView(BaseModel):
    """One dead letter as its reader sees it (``content`` only when asked for)."""

    model_config = ConfigDict(frozen=True)

    partition: int
    offset: int
    at: datetime
    reason: str | None
    source: str | None
    key: str | None
    subject: str | None
    state: State
    size: int
    content: str | None = None


class Opener:
    """Opens a dead letter's value: sealed letters with ``keyring``, sealed events with
    ``open_event`` (both None: sealing is off, and sealed bytes stay unread)."""

    def __init__(self, keyring: Keyring | None, open_event: OpenEvent | None) -> None:
        self.keyring = keyring
        self.open_event = open_event

    def __call__(self, value: bytes) -> tuple[State, str | None, bytes | None]:
        """The state, subject and opened bytes of ``value``."""
        if is_sealed(value):
            return self._event(value)
        try:
            letter = open_letter(self.keyring, value)
        except BadEvent:
            return "unreadable", None, None
        return letter.state, letter.subject, letter.raw

    def _event(self, value: bytes) -> tuple[State, str | None, bytes | None]:
        if self.open_event is None:
            return "unknown key", None, None
        try:
            event = self.open_event(value)
        except UnknownKey as unknown:
            return "unknown key", unknown.envelope.subject, None
        except BadEvent:
            return "unreadable", None, None
        if event is None:
            return "erased", None, None
        subject = event.user_id or event.agent_id
        return "open", subject, event.model_dump_json().encode()


def _header(headers: Sequence[tuple[str, bytes]], name: str) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode(errors="replace")
    return None


def _text(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    return text if len(text) <= CONTENT_CHARS else text[:CONTENT_CHARS] + "…"


async def read_dead_letters(
    bootstrap: str, topic: str, opener: Opener, *, limit: int = 20, content: bool = False
) -> list[DeadLetterView]:
    """The newest ``limit`` dead letters of ``topic`` (oldest first), opened by
    ``opener``; their content only when ``content``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = await partitions_of(consumer, topic)
        if not partitions:
            return []
        starts = await consumer.beginning_offsets(partitions)
        ends = await consumer.end_offsets(partitions)
        consumer.assign(partitions)
        wanted: dict[TopicPartition, int] = {}
        for tp in partitions:
            if ends[tp] > starts[tp]:
                consumer.seek(tp, max(starts[tp], ends[tp] - limit))
                wanted[tp] = ends[tp]
            else:
                consumer.pause(tp)
        views: list[DeadLetterView] = []
        while wanted:
            batch = await consumer.getmany(*wanted, timeout_ms=2000)
            if not batch:
                break  # the broker has nothing more to give: show what was read
            for tp, records in batch.items():
                for record in records:
                    views.append(_view(record, opener, content))
                if (await consumer.position(tp)) >= wanted[tp]:
                    del wanted[tp]
                    consumer.pause(tp)
        views.sort(key=lambda v: (v.at, v.partition, v.offset))
        return views[-limit:] if limit else []
    finally:
        await consumer.stop()


def _view(record: ConsumerRecord[bytes, bytes], opener: Opener, content: bool) -> DeadLetterView:
    value = record.value or b""
    headers = list(record.headers or ())
    state, subject, raw = opener(value)
    return DeadLetterView(
        partition=record.partition,
        offset=record.offset,
        at=datetime.fromtimestamp(record.timestamp / 1000, UTC),
        reason=_header(headers, REASON_HEADER),
        source=_header(headers, SOURCE_HEADER),
        key=record.key.decode(errors="replace") if record.key is not None else None,
        subject=subject,
        state=state,
        size=len(value),
        content=_text(raw) if content and raw is not None else None,
    )


def letters_router(
    *,
    bootstrap: str,
    topic: str,
    opener: Opener,
    refresh: Callable[[], None] | None = None,
) -> APIRouter:
    """``GET /v1/admin/dead-letters``; ``refresh`` (blocking) reads the keys again
    first, so a letter of a subject erased a moment ago shows as erased."""
    router = APIRouter(tags=["operations"])

    @router.get(
        "/v1/admin/dead-letters",
        response_model=list[DeadLetterView],
        summary="The newest dead letters: reason, source, subject, state (content if asked)",
    )
    async def dead_letters(
        limit: int = Query(20, ge=1, le=1000, description="How many of the newest."),
        content: bool = Query(False, description="Include each one's opened content."),
    ) -> list[DeadLetterView]:
        if refresh is not None:
            await asyncio.get_running_loop().run_in_executor(None, refresh)
        return await read_dead_letters(bootstrap, topic, opener, limit=limit, content=content)

    return router


def dumps(views: list[DeadLetterView]) -> str:
    """JSON of ``views`` (a list), as the CLI prints it."""
    return json.dumps([v.model_dump(mode="json") for v in views], indent=2, ensure_ascii=False)
