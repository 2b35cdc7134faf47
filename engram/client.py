"""``engram.Memory``: publish events to the log, directly or through ``engram up``.

Direct mode writes to Kafka with an aiokafka producer (``acks=all``, key =
``agent_id``, so one agent's events stay in order in one partition). HTTP mode
posts to the API of ``engram up``. Either way every event is validated before
anything is sent: an invalid event raises :class:`BadEvent` and nothing of the
batch leaves the process.

Every method exists in two forms: ``apublish`` (async) and ``publish`` (sync; it
runs on a private event-loop thread owned by the client).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from engram.errors import NotRunning, PublishError, RejectedEvent
from engram.settings import Settings
from schemas import RAW_TYPE_NAMES, BadEvent, Codec, Event

T = TypeVar("T")
EventLike = Event | Mapping[str, Any]
HTTP_BATCH = 5000


def read_up_file(path: Path) -> dict[str, Any] | None:
    """What ``engram up`` recorded, or None when it is not running."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data


class _LoopThread:
    """A private event loop on a daemon thread, for the sync face of the client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


class Memory:
    """The public client. Give ``bootstrap`` (Kafka) or ``http`` (``engram up``);
    with neither, :meth:`connect` finds them from the environment or ``up.json``."""

    def __init__(
        self,
        *,
        bootstrap: str | None = None,
        http: str | None = None,
        settings: Settings | None = None,
        timeout: float = 30.0,
    ) -> None:
        if bootstrap is None and http is None:
            raise NotRunning("Memory needs bootstrap= (Kafka) or http= (engram up)")
        self.settings = settings or Settings.from_env()
        self.bootstrap = bootstrap
        self.http = http.rstrip("/") if http else None
        self.timeout = timeout
        self.codec = Codec(max_bytes=self.settings.max_event_bytes, accept=RAW_TYPE_NAMES)
        self._producer: AIOKafkaProducer | None = None
        self._http: httpx.AsyncClient | None = None
        self._loop: _LoopThread | None = None

    @classmethod
    def connect(cls, settings: Settings | None = None, *, prefer_http: bool = False) -> Memory:
        """Kafka from ``ENGRAM_KAFKA_BOOTSTRAP``, else the running ``engram up``."""
        settings = settings or Settings.from_env()
        up = read_up_file(settings.up_file)
        if settings.kafka_bootstrap and not prefer_http:
            return cls(bootstrap=settings.kafka_bootstrap, settings=settings)
        if up is None:
            raise NotRunning(
                f"engram is not running: no {settings.up_file}. Start it with `engram up`, "
                "or set ENGRAM_KAFKA_BOOTSTRAP to a Kafka broker."
            )
        if prefer_http:
            return cls(http=up["http"], settings=settings)
        return cls(bootstrap=up["kafka_bootstrap"], settings=settings)

    # -- validation -------------------------------------------------------
    def validate(self, events: Iterable[EventLike]) -> list[Event]:
        """Typed, size-checked raw events; raises BadEvent naming the first bad one."""
        checked = []
        for index, item in enumerate(events):
            try:
                event = item if isinstance(item, Event) else self.codec.from_json_object(item)
                if event.type not in RAW_TYPE_NAMES:
                    raise BadEvent(f"{event.type} is derived by engram; it cannot be published")
                self.codec.encode(event)
            except BadEvent as bad:
                raise BadEvent(f"event {index}: {bad.reason}") from None
            checked.append(event)
        return checked

    # -- async face -------------------------------------------------------
    async def apublish(self, event: EventLike) -> Event:
        """Publish one event; returns it once the log has acknowledged it."""
        return (await self.apublish_many([event]))[0]

    async def apublish_many(self, events: Iterable[EventLike]) -> list[Event]:
        """Validate all, then publish all; returns once every one is acknowledged."""
        checked = self.validate(events)
        if self.bootstrap is not None:
            await self._send_kafka(checked)
        else:
            await self._send_http(checked)
        return checked

    async def aclose(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _kafka(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                acks="all",
                linger_ms=5,
                max_request_size=max(1_048_576, self.settings.max_event_bytes * 2),
                request_timeout_ms=int(self.timeout * 1000),
            )
            try:
                await asyncio.wait_for(producer.start(), self.timeout)
            except (KafkaError, OSError, TimeoutError) as error:
                await producer.stop()
                raise PublishError(f"cannot reach Kafka at {self.bootstrap}: {error!r}") from None
            self._producer = producer
        return self._producer

    async def _send_kafka(self, events: Sequence[Event]) -> None:
        producer = await self._kafka()
        topic = self.settings.events_topic
        try:
            futures = [
                await producer.send(
                    topic,
                    key=e.agent_id.encode(),
                    value=self.codec.encode(e),
                    timestamp_ms=int(e.occurred_at.timestamp() * 1000),
                )
                for e in events
            ]
            await asyncio.wait_for(asyncio.gather(*futures), self.timeout)
        except (KafkaError, TimeoutError) as error:
            raise PublishError(f"Kafka did not acknowledge the events: {error!r}") from None

    async def _send_http(self, events: Sequence[Event]) -> None:
        if self._http is None:
            self._http = httpx.AsyncClient(base_url=self.http or "", timeout=self.timeout)
        for start in range(0, len(events), HTTP_BATCH):
            chunk = events[start : start + HTTP_BATCH]
            payload = "[" + ",".join(e.model_dump_json() for e in chunk) + "]"
            try:
                response = await self._http.post(
                    "/v1/events", content=payload, headers={"content-type": "application/json"}
                )
            except httpx.HTTPError as error:
                raise PublishError(f"cannot reach engram at {self.http}: {error!r}") from None
            if response.status_code >= 400:
                raise _rejection(response, start)

    # -- sync face --------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            self._loop = _LoopThread()
        return self._loop.run(coro)

    def publish(self, event: EventLike) -> Event:
        """Sync :meth:`apublish`."""
        return self._run(self.apublish(event))

    def publish_many(self, events: Iterable[EventLike]) -> list[Event]:
        """Sync :meth:`apublish_many`."""
        return self._run(self.apublish_many(list(events)))

    def close(self) -> None:
        if self._loop is not None:
            self._loop.run(self.aclose())
            self._loop.stop()
            self._loop = None

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    async def __aenter__(self) -> Memory:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


def _rejection(response: httpx.Response, offset: int) -> RejectedEvent:
    try:
        detail = response.json()
    except ValueError:
        return RejectedEvent(f"HTTP {response.status_code}: {response.text[:500]}")
    index = detail.get("index") if isinstance(detail, dict) else None
    reason = detail.get("reason") or detail.get("error") if isinstance(detail, dict) else detail
    return RejectedEvent(
        f"HTTP {response.status_code}: {reason}", None if index is None else offset + index
    )
