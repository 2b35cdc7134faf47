"""``engram publish FILE.jsonl`` and ``engram import``: validate every event, then
publish them in order with progress."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)

from engram.client import Memory
from engram.errors import EngramError, PartlyPublished
from engram.settings import Settings
from schemas import BadEvent, Event


def read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """(line number, object) of each non-blank line of a JSON-lines file (``-`` is
    stdin); BadEvent names the bad line (one that is not UTF-8 too). Lines end at
    ``\n``, ``\r\n`` or ``\r`` only: a JSON string may hold U+2028 as it is."""
    data = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    objects = []
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise BadEvent(
                f"line {number}: not UTF-8 text ({error.reason} at byte {error.start})"
            ) from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as error:
            raise BadEvent(f"line {number}: malformed JSON: {error}") from None
        objects.append((number, obj))
    return objects


def publish_file(
    settings: Settings,
    path: Path,
    console: Console,
    *,
    prefer_http: bool,
    batch: int,
    skip: int = 0,
) -> int:
    """Publish the events of ``path`` after its first ``skip`` (every line is checked
    first: nothing is sent if one is invalid); return how many were sent.
    :class:`PartlyPublished` counts ``done`` from the file's first event."""
    lines = read_jsonl(path)
    if skip > len(lines):
        raise EngramError(f"--skip {skip}: the file holds {len(lines)} events")
    with Memory.connect(settings, prefer_http=prefer_http) as memory:
        events = []
        for number, obj in lines:
            try:
                events.extend(memory.validate([obj]))
            except BadEvent as bad:
                raise BadEvent(f"line {number}: {bad.reason.removeprefix('event 0: ')}") from None
        try:
            return _publish(memory, events[skip:], console, batch)
        except PartlyPublished as partly:
            done = skip + partly.done
            raise PartlyPublished(done, partly.pending, partly.cause, lines[done][0]) from None


def publish_events(
    settings: Settings, events: list[Event], console: Console, *, prefer_http: bool, batch: int
) -> int:
    """Publish ``events`` in order (each validated first: nothing is sent if one fails)."""
    with Memory.connect(settings, prefer_http=prefer_http) as memory:
        checked = memory.validate(events)
        return _publish(memory, checked, console, batch)


def _publish(memory: Memory, events: list[Event], console: Console, batch: int) -> int:
    """Publish in batches of ``batch`` with a progress bar; return the count.
    :class:`PartlyPublished` when a batch fails (its ``done`` events were acknowledged)."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("publishing", total=len(events))
        for start in range(0, len(events), batch):
            chunk = events[start : start + batch]
            try:
                memory.publish_many(chunk)
            except EngramError as error:
                raise PartlyPublished(start, len(chunk), error) from None
            progress.advance(task, len(chunk))
    return len(events)
