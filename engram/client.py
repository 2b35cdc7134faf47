"""``engram.Memory``: publish events to the log, directly or through ``engram up``.

Direct mode writes to Kafka with an aiokafka producer (``acks=all``, key =
``agent_id``, so one agent's events stay in order in one partition). A client with a
master key (``ENGRAM_MASTER_KEY`` / ``ENGRAM_MASTER_KEY_FILE``) seals every event
under its subject's data key (written to ``engram.keys`` first when the subject has
none) and writes it to ``engram.events``; a client without one — the usual agent —
writes clear events to ``engram.ingest``, which the worker seals onto
``engram.events`` (``ENGRAM_SEAL=off``: clear, straight to ``engram.events``). HTTP mode
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
import time
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import httpx
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from engram.erasure import BROADCAST_ONLY
from engram.errors import (
    BrokerUnavailable,
    NotRunning,
    PublishError,
    RejectedEvent,
    RequestFailed,
)
from engram.events import make_event
from engram.results import DEFAULT_EPISODES, RecallResult, Snapshot
from engram.settings import Settings
from schemas import RAW_TYPE_NAMES, BadEvent, Codec, Event
from schemas.sealed import SealingCodec
from sinks.keys import KafkaKeyring
from streams.logwriter import Record, write_records

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


def deployment_bootstrap(settings: Settings) -> str | None:
    """The deployment's Kafka: ``ENGRAM_KAFKA_BOOTSTRAP``, else the running ``engram
    up``'s broker; None when neither is there."""
    if settings.kafka_bootstrap:
        return settings.kafka_bootstrap
    up = read_up_file(settings.up_file)
    return None if up is None else up.get("kafka_bootstrap")


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
        # With both, events go to Kafka and recall / snapshots to engram up's API.
        self.settings = settings or Settings.from_env()
        self.bootstrap = bootstrap
        self.http = http.rstrip("/") if http else None
        self.timeout = timeout
        self.codec = Codec(max_bytes=self.settings.max_event_bytes, accept=RAW_TYPE_NAMES)
        self._master = self.settings.master_key()
        self._keyring: KafkaKeyring | None = None
        self._sealing: SealingCodec | None = None
        self._refreshed = 0.0
        self._producer: AIOKafkaProducer | None = None
        self._http: httpx.AsyncClient | None = None
        self._loop: _LoopThread | None = None

    @classmethod
    def connect(cls, settings: Settings | None = None, *, prefer_http: bool = False) -> Memory:
        """Kafka from ``ENGRAM_KAFKA_BOOTSTRAP``, else the running ``engram up``."""
        settings = settings or Settings.from_env()
        up = read_up_file(settings.up_file)
        if settings.kafka_bootstrap and not prefer_http:
            http = up["http"] if up is not None else None
            return cls(bootstrap=settings.kafka_bootstrap, http=http, settings=settings)
        if up is None:
            raise NotRunning(
                f"engram is not running: no {settings.up_file}. Start it with `engram up`, "
                "or set ENGRAM_KAFKA_BOOTSTRAP to a Kafka broker."
            )
        if prefer_http:
            return cls(http=up["http"], settings=settings)
        return cls(bootstrap=up["kafka_bootstrap"], http=up["http"], settings=settings)

    # -- validation -------------------------------------------------------
    def validate(self, events: Iterable[EventLike]) -> list[Event]:
        """Typed, size-checked raw events; raises BadEvent naming the first bad one."""
        checked = []
        for index, item in enumerate(events):
            try:
                event = item if isinstance(item, Event) else self.codec.from_json_object(item)
                if event.type not in RAW_TYPE_NAMES:
                    raise BadEvent(f"{event.type} is derived by engram; it cannot be published")
                if event.type == BROADCAST_ONLY:
                    raise BadEvent(
                        f"{event.type} must reach every partition of the log: use Memory.erase"
                    )
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

    async def arecall(
        self,
        query: str,
        *,
        agent_id: str,
        user_id: str | None = None,
        session_id: str | None = None,
        k: int = 10,
        layers: Sequence[str] | None = None,
        min_importance: float | None = None,
        weights: Mapping[str, float] | None = None,
        include_forgotten: bool = False,
        record: bool = True,
    ) -> RecallResult:
        """The ``k`` best memories of ``agent_id`` for ``query`` (hybrid, retention
        weighted); the recall is recorded as ``memory.recalled``, which reinforces
        what it returned (``record=False`` peeks: nothing recorded, nothing
        reinforced). Raises :class:`RequestFailed` with the server's reason."""
        request: dict[str, Any] = {"query": query, "agent_id": agent_id, "k": k}
        optional = {
            "user_id": user_id,
            "session_id": session_id,
            "layers": list(layers) if layers is not None else None,
            "min_importance": min_importance,
            "weights": dict(weights) if weights is not None else None,
        }
        request.update({key: value for key, value in optional.items() if value is not None})
        if include_forgotten:
            request["include_forgotten"] = True
        if not record:
            request["record"] = False
        answer = await self._call("POST", "/v1/recall", json=request)
        return RecallResult.model_validate(answer)

    async def asnapshot(
        self,
        agent_id: str,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        as_of: datetime | None = None,
        episodes: int = DEFAULT_EPISODES,
    ) -> Snapshot:
        """``agent_id``'s memory snapshot (working memory, episodes, facts, persona,
        skills, log position), now or ``as_of`` an aware moment."""
        if as_of is not None and as_of.tzinfo is None:
            raise ValueError("as_of must be an aware datetime (UTC offset included)")
        params: dict[str, Any] = {"agent_id": agent_id, "episodes": episodes}
        optional = {
            "user_id": user_id,
            "session_id": session_id,
            "as_of": as_of.isoformat() if as_of else None,
        }
        params.update({key: value for key, value in optional.items() if value is not None})
        answer = await self._call("GET", "/v1/snapshot", params=params)
        return Snapshot.model_validate(answer)

    async def ahistory(
        self,
        agent_id: str,
        *,
        as_of: datetime,
        user_id: str | None = None,
        session_id: str | None = None,
        episodes: int = DEFAULT_EPISODES,
    ) -> Snapshot:
        """``agent_id``'s memory as of an aware moment, answered by SQL over the
        history (``GET /v1/history``); :meth:`asnapshot` with ``as_of`` replays the log
        to the same answer."""
        if as_of.tzinfo is None:
            raise ValueError("as_of must be an aware datetime (UTC offset included)")
        params: dict[str, Any] = {
            "agent_id": agent_id,
            "as_of": as_of.isoformat(),
            "episodes": episodes,
        }
        optional = {"user_id": user_id, "session_id": session_id}
        params.update({key: value for key, value in optional.items() if value is not None})
        answer = await self._call("GET", "/v1/history", params=params)
        return Snapshot.model_validate(answer)

    async def afeedback(
        self,
        memory_id: str,
        useful: bool,
        *,
        agent_id: str,
        user_id: str | None = None,
        session_id: str | None = None,
        correction: str | None = None,
    ) -> Event:
        """Publish ``feedback.given``: a useful memory is reinforced, a corrected one
        weakened (or invalidated when ``correction`` says what is true instead).
        ``memory_id`` is one recall returned (a UUID, in any case: it is sent in
        canonical form); BadEvent for anything else, before anything is sent."""
        try:
            canonical = str(UUID(memory_id))
        except (ValueError, TypeError, AttributeError):
            raise BadEvent(
                f"memory_id {memory_id!r} is not a memory id (the UUID a recall returned)"
            ) from None
        event = make_event(
            "feedback.given",
            agent_id=agent_id,
            user_id=user_id,
            session_id=session_id,
            body={"memory_id": canonical, "useful": useful, "correction": correction},
        )
        return await self.apublish(event)

    async def aerase(self, subject: str, *, reason: str | None = None) -> UUID:
        """Ask engram to forget ``subject`` (a user, or an agent without users)
        everywhere: its data keys are destroyed, then every agent, the history and the
        vectors purge it, each leaving a receipt without content. Returns the request
        id to follow it by (``engram status``; ``erasures`` in SQL). Direct mode
        publishes the request to every partition of ``engram.events``; HTTP mode posts
        ``/v1/erasures``. Raises ValueError for a subject that is not an identifier."""
        from engram.erasure import broadcast, erasure_request

        if self.bootstrap is None:
            answer = await self._call(
                "POST", "/v1/erasures", json={"subject": subject, "reason": reason}
            )
            return UUID(str(answer["request_id"]))
        request = erasure_request(subject, reason)
        producer = await self._kafka()
        try:
            await broadcast(producer, self.settings.events_topic, self.codec, request, self.timeout)
        except (KafkaError, TimeoutError) as error:
            raise PublishError(f"Kafka did not acknowledge the erasure: {error!r}") from None
        return request.event_id

    async def arollback(self, agent_id: str, *, to: datetime, reason: str | None = None) -> Event:
        """Roll ``agent_id``'s memory back to what it was at ``to`` (aware): publishes a
        ``memory.rolled_back`` naming ``to`` and the agent's last sequence at or before
        it, after which the agent's memory continues from that state; history keeps
        everything, the rollback included. Returns the published event (its id is the
        request's, see :func:`engram.rebase.applied`). Raises
        :class:`engram.rebase.Refused` for an unknown agent, or ``to`` in the future or
        before the agent's first event; nothing is published then."""
        from engram.rebase import position_at, rollback_event

        to_seq = await position_at(self, agent_id, to)
        return await self.apublish(rollback_event(agent_id, to, to_seq, reason))

    async def afork(self, source: str, *, into: str, at: datetime | None = None) -> Event:
        """Create agent ``into`` whose memory begins as ``source``'s was at ``at`` (aware;
        default now): publishes a ``memory.forked`` on ``into`` naming ``source``, its
        last sequence at or before ``at`` and the id of its archived event there (which
        ``engram import`` checks the source by). Raises :class:`engram.rebase.Refused`
        when ``into`` has events already, ``source`` is unknown, or ``at`` is in the
        future or before ``source``'s first event."""
        from datetime import UTC

        from engram.rebase import Refused, event_at, exists, fork_event, position_at

        if into == source:
            raise Refused("a fork needs a new agent id (--as), not the source's")
        if await exists(self, into):
            raise Refused(f"agent {into!r} exists already: a fork creates a new agent")
        moment = at or datetime.now(UTC)
        source_seq = await position_at(self, source, moment)
        source_event_id = await event_at(self, source, source_seq)
        return await self.apublish(fork_event(source, into, moment, source_seq, source_event_id))

    async def _rows(self, sql: str, params: Mapping[str, str]) -> list[list[Any]]:
        """The rows of one read-only query (``{name:Type}`` placeholders bound from
        ``params``, as text) through engram up's SQL endpoint (the archive, for
        :func:`engram.rebase.event_at`). Raises :class:`RequestFailed` with the
        server's reason."""
        query = {"query": sql, "default_format": "JSONCompact"}
        query.update({f"param_{name}": value for name, value in params.items()})
        answer = await self._call("GET", "/", params=query)
        return list(answer["data"])

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        if self.http is None:
            raise NotRunning(
                "recall and snapshots need engram up's HTTP API: pass http= or use "
                "Memory.connect() while `engram up` runs"
            )
        if self._http is None:
            self._http = httpx.AsyncClient(base_url=self.http, timeout=self.timeout)
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise RequestFailed(f"cannot reach engram at {self.http}: {error!r}") from None
        if response.status_code >= 400:
            raise RequestFailed(reason_of(response), response.status_code)
        return response.json()

    async def aclose(self) -> None:
        if self._keyring is not None:
            await self._keyring.stop()
            self._keyring = self._sealing = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _kafka(self) -> AIOKafkaProducer:
        """The started producer. An unreachable Kafka is tried again with backoff (0.1 s
        doubling up to 2 s) until ``timeout`` s have passed, then BrokerUnavailable."""
        deadline, attempts, pause = time.monotonic() + self.timeout, 0, 0.1
        while self._producer is None:
            attempts += 1
            producer = self._new_producer()
            try:
                await asyncio.wait_for(producer.start(), max(deadline - time.monotonic(), 0.1))
                self._producer = producer
            except (KafkaError, OSError, TimeoutError) as error:
                await producer.stop()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrokerUnavailable(
                        str(self.bootstrap), self.timeout, attempts, error
                    ) from None
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, 2.0)
        return self._producer

    def _new_producer(self) -> AIOKafkaProducer:
        largest = max(1_048_576, self.settings.max_event_bytes * 2)  # an event fits a batch
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            linger_ms=5,
            max_batch_size=largest,
            max_request_size=largest,
            request_timeout_ms=int(self.timeout * 1000),
        )

    @property
    def topic(self) -> str:
        """Where direct mode writes: ``engram.events`` when this client seals (or
        sealing is off), else ``engram.ingest`` (the worker seals)."""
        if self._master is not None or not self.settings.seal:
            return self.settings.events_topic
        return self.settings.ingest_topic

    async def _sealer(self) -> SealingCodec:
        """The sealing codec, its keyring started (and refreshed at most once a
        second, so that a destroyed key is not sealed under for long)."""
        assert self._master is not None
        if self._keyring is None:
            keyring = KafkaKeyring(
                self.bootstrap or "",
                self.settings.keys_topic,
                self._master,
                self.settings.key_archive(),
            )
            try:
                await asyncio.wait_for(keyring.start(), self.timeout)
            except (KafkaError, OSError, TimeoutError) as error:
                await keyring.stop()
                raise PublishError(f"cannot read the data keys: {error!r}") from None
            self._keyring, self._refreshed = keyring, time.monotonic()
            self._sealing = SealingCodec(
                keyring, max_bytes=self.settings.max_event_bytes, accept=RAW_TYPE_NAMES
            )
        elif time.monotonic() - self._refreshed > 1.0:
            await self._keyring.refresh()
            self._refreshed = time.monotonic()
        assert self._sealing is not None
        return self._sealing

    async def _values(self, events: Sequence[Event]) -> list[bytes]:
        """The bytes to send: sealed (their new keys written first) or clear Avro."""
        if self._master is None:
            return [self.codec.encode(e) for e in events]
        sealing = await self._sealer()
        values = [sealing.encode(e) for e in events]
        assert self._keyring is not None
        await self._keyring.flush()
        return values

    async def _send_kafka(self, events: Sequence[Event]) -> None:
        producer = await self._kafka()
        topic = self.topic
        try:
            values = await self._values(events)
            records = [
                Record(e.agent_id.encode(), value, int(e.occurred_at.timestamp() * 1000))
                for e, value in zip(events, values, strict=True)
            ]
            await asyncio.wait_for(write_records(producer, topic, records), self.timeout)
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

    def recall(self, query: str, **options: Any) -> RecallResult:
        """Sync :meth:`arecall`."""
        return self._run(self.arecall(query, **options))

    def snapshot(self, agent_id: str, **options: Any) -> Snapshot:
        """Sync :meth:`asnapshot`."""
        return self._run(self.asnapshot(agent_id, **options))

    def history(self, agent_id: str, **options: Any) -> Snapshot:
        """Sync :meth:`ahistory`."""
        return self._run(self.ahistory(agent_id, **options))

    def feedback(self, memory_id: str, useful: bool, **options: Any) -> Event:
        """Sync :meth:`afeedback`."""
        return self._run(self.afeedback(memory_id, useful, **options))

    def erase(self, subject: str, *, reason: str | None = None) -> UUID:
        """Sync :meth:`aerase`."""
        return self._run(self.aerase(subject, reason=reason))

    def rollback(self, agent_id: str, *, to: datetime, reason: str | None = None) -> Event:
        """Sync :meth:`arollback`."""
        return self._run(self.arollback(agent_id, to=to, reason=reason))

    def fork(self, source: str, *, into: str, at: datetime | None = None) -> Event:
        """Sync :meth:`afork`."""
        return self._run(self.afork(source, into=into, at=at))

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


def reason_of(response: httpx.Response) -> str:
    """Why engram's HTTP API refused a request: the ``reason`` or ``detail`` of its
    JSON answer, else the start of its text."""
    try:
        detail = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(detail, dict):
        if "reason" in detail:
            return str(detail["reason"])
        if isinstance(detail.get("detail"), str):  # an HTTPException's
            return str(detail["detail"])[:1000]
        if "detail" in detail:  # FastAPI's validation errors
            return json.dumps(detail["detail"], ensure_ascii=False)[:1000]
    return str(detail)[:1000]


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
