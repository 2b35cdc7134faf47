"""Moving an agent to another deployment: its raw log out (``engram export``) and in
(``engram import``).

An export is the agent's archived raw events (the ClickHouse ``events`` table: every
event the fold kept, duplicates already dropped, the ticks it met included) in log
order. Importing them into another deployment publishes the same events in the same
order to its ``engram.events``, so its fold derives the same memory: the same
episodes, memories, facts, persona and working memory, because the processors are
pure and the events keep their ids and event times. Importing twice changes nothing
(the fold drops repeated event ids).

Two formats:

* ``jsonl``: one event per line in the JSON wire format (what ``engram publish``
  reads), for people and other tools;
* ``avro``: an Avro object container file (deflate) of ``engram.LogRecord``
  records — agent, sequence and the event's single-object bytes, exactly as
  archived — for an exact copy that newer readers still resolve by fingerprint.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import fastavro

from engram.client import read_up_file
from engram.errors import EngramError
from engram.settings import Settings
from schemas import BadEvent, Codec, Event
from schemas.sealed import is_sealed
from sinks.keys import BlockingKeyring, MasterKey, OpenEvent

Format = Literal["jsonl", "avro"]
FORMATS: tuple[Format, ...] = ("jsonl", "avro")

LOG_RECORD: dict[str, Any] = {
    "type": "record",
    "name": "engram.LogRecord",
    "doc": "One archived raw event of an agent: its sequence and single-object bytes.",
    "fields": [
        {"name": "agent_id", "type": "string"},
        {"name": "seq", "type": "long"},
        {"name": "payload", "type": "bytes"},
    ],
}
_PARSED = fastavro.parse_schema(LOG_RECORD)
PAGE = 5_000


@dataclass(frozen=True)
class Exported:
    """What an export wrote."""

    agent_id: str
    events: int
    first_seq: int
    last_seq: int
    path: Path


def archived(client: Any, agent_id: str) -> Iterator[tuple[int, bytes]]:
    """``(seq, payload)`` of ``agent_id``'s archived events in log order, read in pages
    through any clickhouse-connect client (the running engram's SQL endpoint, chdb or
    a server)."""
    after = -1
    while True:
        result = client.query(
            "SELECT seq, payload FROM events FINAL WHERE agent_id = {a:String} AND seq > {s:Int64}"
            " ORDER BY seq LIMIT {n:UInt32}",
            parameters={"a": agent_id, "s": after, "n": PAGE},
            column_formats={"payload": "bytes"},
        )
        rows = result.result_rows
        for seq, payload in rows:
            yield int(seq), bytes(payload)
        if len(rows) < PAGE:
            return
        after = int(rows[-1][0])


def export_agent(
    client: Any,
    agent_id: str,
    path: Path,
    fmt: Format,
    codec: Codec | None = None,
    open_event: OpenEvent | None = None,
) -> Exported:
    """Write ``agent_id``'s log to ``path`` in ``fmt``; EngramError when the history has
    no event of the agent (nothing is written then). The file holds the events opened:
    ``open_event`` opens sealed payloads (:func:`archive_opener`), and skips the ones
    sealed under a destroyed key (an erased subject is not exported); both formats hold
    clear events, which the importing deployment seals as it publishes them."""
    codec = codec or Codec()
    read = open_event or codec.decode
    records = _opened(archived(client, agent_id), read, codec)
    first = next(records, None)
    if first is None:
        raise EngramError(f"no events of agent {agent_id!r} in the history: nothing to export")
    count, last = 0, first[0]

    def every() -> Iterator[tuple[int, bytes]]:
        nonlocal count, last
        for seq, payload in _chain(first, records):
            count += 1
            last = seq
            yield seq, payload

    with path.open("wb") as out:
        if fmt == "jsonl":
            for _, payload in every():
                out.write(codec.encode_json(codec.decode(payload)) + b"\n")
        else:
            rows = ({"agent_id": agent_id, "seq": s, "payload": p} for s, p in every())
            fastavro.writer(out, _PARSED, rows, codec="deflate")
    return Exported(agent_id, count, first[0], last, path)


def _chain(
    first: tuple[int, bytes], rest: Iterator[tuple[int, bytes]]
) -> Iterator[tuple[int, bytes]]:
    yield first
    yield from rest


def _opened(
    records: Iterator[tuple[int, bytes]], read: OpenEvent, codec: Codec
) -> Iterator[tuple[int, bytes]]:
    """``(seq, clear payload)`` of the events that open; shredded ones are left out."""
    for seq, payload in records:
        event = _decode(read, payload)
        if event is not None:
            yield seq, codec.encode(event) if is_sealed(payload) else payload


def _decode(read: OpenEvent, payload: bytes) -> Event | None:
    try:
        return read(payload)
    except BadEvent as bad:  # the fold archived it, so it decoded then
        raise EngramError(f"an archived event no longer decodes: {bad.reason}") from None


@contextmanager
def archive_opener(settings: Settings) -> Iterator[OpenEvent | None]:
    """An :data:`~sinks.keys.OpenEvent` with the deployment's keys (its master key from
    the settings, else ``$ENGRAM_HOME/master.key`` of the embedded stack; the key topic
    on ``ENGRAM_KAFKA_BOOTSTRAP`` or the running ``engram up``'s broker), or None when
    either is missing (clear payloads only)."""
    master = settings.master_key()
    home_key = settings.home / "master.key"
    if master is None and settings.seal and home_key.exists():
        master = MasterKey.from_file(home_key)
    up = read_up_file(settings.up_file)
    bootstrap = settings.kafka_bootstrap or (up or {}).get("kafka_bootstrap")
    if master is None or not bootstrap:
        yield None
        return
    keys = BlockingKeyring(str(bootstrap), settings.keys_topic, master)
    try:
        yield keys.opener(max_bytes=settings.max_event_bytes)
    finally:
        keys.close()


def export_with_keys(settings: Settings, agent_id: str, path: Path, fmt: Format) -> Exported:
    """:func:`export_agent` from the deployment's history, opened with its keys."""
    from engram.history import history_client  # engram.history imports the CLI's world

    with archive_opener(settings) as open_event:
        return export_agent(history_client(settings), agent_id, path, fmt, open_event=open_event)


def read_export(path: Path, codec: Codec | None = None) -> list[Event]:
    """The events of an export file, either format (told apart by the Avro magic);
    BadEvent names the first bad record."""
    codec = codec or Codec()
    with path.open("rb") as file:
        if file.read(4) == b"Obj\x01":
            file.seek(0)
            return _read_avro(file, codec)
    return _read_jsonl(path, codec)


def _read_avro(file: BinaryIO, codec: Codec) -> list[Event]:
    events = []
    try:
        reader = fastavro.reader(file)
        for number, record in enumerate(reader, start=1):
            if not isinstance(record, dict) or "payload" not in record:
                raise BadEvent(f"record {number}: not an engram.LogRecord")
            try:
                events.append(codec.decode(record["payload"]))
            except BadEvent as bad:
                raise BadEvent(f"record {number}: {bad.reason}") from None
    except (ValueError, EOFError, StopIteration) as error:
        raise BadEvent(f"malformed Avro container: {error}") from None
    return events


def _read_jsonl(path: Path, codec: Codec) -> list[Event]:
    events = []
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            events.append(codec.decode(line))
        except BadEvent as bad:
            raise BadEvent(f"line {number}: {bad.reason}") from None
    return events
