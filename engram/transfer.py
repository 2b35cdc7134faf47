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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import fastavro

from engram.errors import EngramError
from schemas import BadEvent, Codec, Event

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
    client: Any, agent_id: str, path: Path, fmt: Format, codec: Codec | None = None
) -> Exported:
    """Write ``agent_id``'s log to ``path`` in ``fmt``; EngramError when the history has
    no event of the agent (nothing is written then)."""
    codec = codec or Codec()
    records = archived(client, agent_id)
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
                out.write(codec.encode_json(_decode(codec, payload)) + b"\n")
        else:
            rows = ({"agent_id": agent_id, "seq": s, "payload": p} for s, p in every())
            fastavro.writer(out, _PARSED, rows, codec="deflate")
    return Exported(agent_id, count, first[0], last, path)


def _chain(
    first: tuple[int, bytes], rest: Iterator[tuple[int, bytes]]
) -> Iterator[tuple[int, bytes]]:
    yield first
    yield from rest


def _decode(codec: Codec, payload: bytes) -> Event:
    try:
        return codec.decode(payload)
    except BadEvent as bad:  # the fold archived it, so it decoded then
        raise EngramError(f"an archived event no longer decodes: {bad.reason}") from None


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
