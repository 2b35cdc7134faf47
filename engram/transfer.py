"""Moving an agent to another deployment: its raw log out (``engram export``) and in
(``engram import``).

An export is the agent's archived raw events (the ClickHouse ``events`` table: every
event the fold kept, duplicates already dropped, the ticks it met included) in log
order. Importing them into another deployment publishes the same events in the same
order to its ``engram.events``, so its fold derives the same memory: the same
episodes, memories, facts, persona and working memory, because the processors are
pure and the events keep their ids and event times.

What an export leaves out, and what it translates:

* events no one can open any more (sealed under an erased subject's destroyed key)
  and an erasure's per-agent copies (``subject.erasure_requested``: what it erased is
  not in the file, and it would name the erased subject in every agent's export);
* so the importing side numbers the events without those gaps. A position an event
  names is translated into the export's numbering: a rollback's ``to_seq`` (this
  agent's) and a fork's ``source_seq`` (its source's, as the source's own export
  numbers it). Export the source of a fork too, and import it first.

Importing checks the destination first (:func:`import_plan`): events of the agent
already there must be the file's first ones (a second import then sends only the
rest), and the source of a fork must be there and reach its position, with the event
the fork names there (its ``source_event_id``, which an export translates with the
position: the id of the exported event the position names).

Two formats:

* ``jsonl``: one event per line in the JSON wire format (what ``engram publish``
  reads), for people and other tools;
* ``avro``: an Avro object container file (deflate) of ``engram.LogRecord``
  records — agent, sequence and the event's single-object bytes, exactly as
  archived — for an exact copy that newer readers still resolve by fingerprint.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal
from uuid import UUID

import fastavro

from engram.client import deployment_bootstrap
from engram.errors import EngramError
from engram.settings import Settings
from schemas import BadEvent, Codec, Event, SubjectErasureRequested
from schemas.raw import ClockTicked, MemoryForked, MemoryRolledBack
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
ERASURE_COPY = SubjectErasureRequested.TYPE
"""An erasure's per-agent copy in an agent's log (see the module: never exported)."""


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
    clear events, which the importing deployment seals as it publishes them. Positions
    are translated into the export's numbering (see the module)."""
    codec = codec or Codec()
    read = open_event or _clear_only(codec)
    records = _translated(client, _exportable(archived(client, agent_id), read, codec), read, codec)
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


def _exportable(
    records: Iterator[tuple[int, bytes]], read: OpenEvent, codec: Codec
) -> Iterator[tuple[int, Event, bytes]]:
    """``(seq, event, clear payload)`` of the events an export holds: shredded ones and
    an erasure's per-agent copies are left out."""
    for seq, payload in records:
        event = _decode(read, payload)
        if event is not None and event.type != ERASURE_COPY:
            yield seq, event, codec.encode(event) if is_sealed(payload) else payload


def _translated(
    client: Any, records: Iterator[tuple[int, Event, bytes]], read: OpenEvent, codec: Codec
) -> Iterator[tuple[int, bytes]]:
    """``(seq, payload)`` with the positions that events name translated into the
    export's numbering: event ``n`` of the file takes sequence ``n`` where it is
    imported."""
    kept: list[int] = []
    for seq, event, payload in records:
        if isinstance(event, MemoryRolledBack):
            to_seq = bisect.bisect_right(kept, event.body.to_seq) - 1
            payload = _with_position(event, "to_seq", to_seq, codec)
        elif isinstance(event, MemoryForked):
            body = event.body
            source_seq, there = _position_in_export(
                client, body.source_agent_id, body.source_seq, read
            )
            identity = {} if body.source_event_id is None else {"source_event_id": there}
            payload = _with_position(event, "source_seq", source_seq, codec, **identity)
        kept.append(seq)
        yield seq, payload


def _with_position(
    event: MemoryRolledBack | MemoryForked,
    field: str,
    position: int,
    codec: Codec,
    **also: Any,
) -> bytes:
    """``event`` re-encoded with ``body.<field>`` set to ``position`` (and the body
    fields ``also`` names); EngramError when every event up to the position it named
    left the log (an erased subject's)."""
    if position < 0:
        raise EngramError(
            f"{event.type} {event.event_id} names a position whose events were all erased:"
            " its state cannot be rebuilt from an export"
        )
    body = event.body.model_copy(update={field: position, **also})
    return codec.encode(event.model_copy(update={"body": body}))


def _position_in_export(
    client: Any, agent_id: str, seq: int, read: OpenEvent
) -> tuple[int, UUID | None]:
    """Where ``agent_id``'s event ``seq`` (or the last before it that an export holds)
    stands in ``agent_id``'s own export: how many of its exported events come up to
    ``seq``, minus one; and the id of the exported event there (None when there is
    none). A fork's ``source_event_id`` follows its position: the event at ``seq``
    itself when the export holds it, else the one the position now names."""
    codec = Codec()
    count, last = 0, None
    for exported, event, _ in _exportable(archived(client, agent_id), read, codec):
        if exported > seq:
            break
        count, last = count + 1, event.event_id
    return count - 1, last


def _clear_only(codec: Codec) -> OpenEvent:
    """Reads clear payloads; EngramError at a sealed one (no keys to open it)."""

    def read(payload: bytes) -> Event | None:
        if is_sealed(payload):
            raise EngramError(
                "the history is sealed and its keys cannot be reached: start engram up (or"
                " set ENGRAM_KAFKA_BOOTSTRAP and the master key) so that they can open it"
            )
        return codec.decode(payload)

    return read


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
    bootstrap = deployment_bootstrap(settings)
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
    except BadEvent:
        raise
    except Exception as error:  # a damaged container fails in zlib, fastavro, anywhere
        raise BadEvent(f"malformed Avro container: {type(error).__name__}: {error}") from None
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


@dataclass(frozen=True)
class ImportPlan:
    """What an import sends (``events``, in the file's order) and leaves out:
    ``present`` events per agent already archived here (a previous import of the same
    file), ``copies`` erasure copies (files of older engram exported them); ``expected``:
    how many events of each agent the file holds (erasure copies left out), ``ticks``:
    the ids of each agent's ticks in the file (the others here are this deployment's)."""

    events: list[Event]
    present: dict[str, int]
    copies: int
    expected: dict[str, int]
    ticks: dict[str, list[str]]


def import_plan(client: Any, events: list[Event]) -> ImportPlan:
    """Check ``events`` (an export file's) against the destination's history (any
    clickhouse-connect client) and say what to send. EngramError when:

    * the file holds no events;
    * an agent of the file has events here that are not the file's first ones (another
      agent of the same name, or another log): importing would mix two logs. The ticks
      this deployment's own clock gave the agent since an earlier import are not the
      file's and do not count (so importing again after a tick sends nothing new);
    * a fork in the file names a source this deployment lacks, or whose log here does
      not reach the fork's position: import the source's export first;
    * a fork names the source's event at its position (``source_event_id``) and the
      event here at that position is another: the agent of that name here is not the
      fork's source. A fork made by an older engram names none: its source is checked
      by name and length only.
    """
    if not events:
        raise EngramError("the file holds no events: nothing to import")
    _refuse_repeats(events)
    kept = [event for event in events if event.type != ERASURE_COPY]
    present: dict[str, int] = {}
    expected: dict[str, int] = {}
    ticks: dict[str, list[str]] = {}
    for agent_id in dict.fromkeys(event.agent_id for event in kept):
        theirs = [event for event in kept if event.agent_id == agent_id]
        mine = [str(event.event_id) for event in theirs]
        expected[agent_id] = len(mine)
        ticks[agent_id] = [str(e.event_id) for e in theirs if isinstance(e, ClockTicked)]
        file_ticks = set(ticks[agent_id])
        here = [
            event_id
            for event_id, kind in _archived(client, agent_id)
            if kind != ClockTicked.TYPE or event_id in file_ticks
        ]
        if here != mine[: len(here)]:
            raise EngramError(
                f"agent {agent_id!r} has {len(here)} events here that are not the first events"
                " of this file: importing would mix two logs (import into a deployment"
                " without that agent)"
            )
        present[agent_id] = len(here)
    sent: list[Event] = []
    seen = dict.fromkeys(present, 0)
    for event in kept:
        seen[event.agent_id] += 1
        if seen[event.agent_id] > present[event.agent_id]:
            sent.append(event)
    for event in sent:
        if isinstance(event, MemoryForked):
            _check_fork_source(client, event)
    present = {a: n for a, n in present.items() if n}
    return ImportPlan(sent, present, len(events) - len(kept), expected, ticks)


def _refuse_repeats(events: list[Event]) -> None:
    """EngramError when an event of an agent comes twice in the file (its events counted
    from 1, in order). An export never repeats one (the fold dropped repeats); the fold
    here would drop it too, and the import would wait for it until its timeout."""
    first: dict[tuple[str, UUID], int] = {}
    for number, event in enumerate(events, start=1):
        if event.type == ERASURE_COPY:
            continue
        seen = first.setdefault((event.agent_id, event.event_id), number)
        if seen != number:
            raise EngramError(
                f"events {seen} and {number} of the file are the same event"
                f" {event.event_id} of {event.agent_id!r}: an export never repeats one"
                " (was the file edited, or two files joined?); nothing was imported"
            )


def _archived(client: Any, agent_id: str) -> list[tuple[str, str]]:
    """The event ids and types of ``agent_id``'s archived events here, in log order."""
    result = client.query(
        "SELECT toString(event_id), type FROM events FINAL WHERE agent_id = {a:String}"
        " ORDER BY seq",
        parameters={"a": agent_id},
    )
    return [(str(event_id), str(kind)) for event_id, kind in result.result_rows]


def _check_fork_source(client: Any, fork: MemoryForked) -> None:
    """EngramError unless the fork's source is archived here up to the fork's position
    and, when the fork names it (``source_event_id``: forks made before version 2 of
    ``memory.forked`` do not), the source's event here at that position is the one the
    fork was made at. The position is the export's numbering, which the source's events
    take here when its export is imported."""
    source, position = fork.body.source_agent_id, fork.body.source_seq
    result = client.query(
        "SELECT count(), max(seq) FROM events FINAL WHERE agent_id = {a:String}",
        parameters={"a": source},
    )
    count, last = result.result_rows[0]
    if not count:
        raise EngramError(
            f"{fork.agent_id!r} begins as a fork of {source!r}, which this deployment does not"
            f" have: export {source!r} too and import it first"
        )
    if int(last) < position:
        raise EngramError(
            f"{fork.agent_id!r} begins as a fork of {source!r} at seq {position}, but {source!r}"
            f" reaches seq {last} here: import {source!r}'s whole export first (and wait until"
            " it is folded)"
        )
    if fork.body.source_event_id is not None:
        _check_fork_identity(client, fork)


def _check_fork_identity(client: Any, fork: MemoryForked) -> None:
    """EngramError unless the source's archived event here at the fork's position is
    the event the fork names (``source_event_id``)."""
    source, position = fork.body.source_agent_id, fork.body.source_seq
    result = client.query(
        "SELECT toString(event_id) FROM events FINAL WHERE agent_id = {a:String}"
        " AND seq = {s:UInt64}",
        parameters={"a": source, "s": position},
    )
    here = [str(row[0]) for row in result.result_rows]
    wanted = str(fork.body.source_event_id)
    if here == [wanted]:
        return
    found = f"event {here[0]}" if here else "no event"
    raise EngramError(
        f"{fork.agent_id!r} begins as a fork of {source!r} at seq {position}, where its source"
        f" had event {wanted}; the {source!r} here has {found} at seq {position}: it is"
        f" another agent of that name (or another log), not the one {fork.agent_id!r} was"
        f" forked from. Import {source!r}'s own export first, into a deployment without"
        " that agent; nothing was imported"
    )


def archived_counts(client: Any, plan: ImportPlan) -> dict[str, int]:
    """How many of each agent's events in the file ``plan`` was made of the history here
    archives (this deployment's own ticks of the agent are not counted)."""
    counts: dict[str, int] = {}
    for agent_id, ticks in plan.ticks.items():
        result = client.query(
            "SELECT countIf(type != {tick:String} OR has({t:Array(String)}, toString(event_id)))"
            " FROM events FINAL WHERE agent_id = {a:String}",
            parameters={"a": agent_id, "tick": ClockTicked.TYPE, "t": ticks},
        )
        counts[agent_id] = int(result.result_rows[0][0])
    return counts


def expected_counts(plan: ImportPlan) -> dict[str, int]:
    """How many events of each agent the history holds once ``plan`` is folded (of the
    file's: see :func:`archived_counts`)."""
    return dict(plan.expected)
