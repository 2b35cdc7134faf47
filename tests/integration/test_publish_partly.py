"""A publish in batches that fails partway says how many events were acknowledged and
from which line to go on; ``skip`` goes on from there (a real broker, stopped midway)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import engram.publishing
from engram import Memory
from engram.errors import PartlyPublished
from engram.publishing import publish_file
from engram.settings import Settings
from ops.broker import EmbeddedBroker
from ops.topics import KEEP_FOREVER, TopicSpec, ensure_topics, read_to_end
from schemas import Codec

QUIET = Console(quiet=True)


def write_lines(path: Path, n: int) -> None:
    rows = [
        {
            "event_id": str(uuid.UUID(int=i + 1)),
            "type": "interaction.recorded",
            "agent_id": f"partly-{i % 3}",
            "occurred_at": f"2026-11-01T10:00:{i:02d}Z",
            "body": {"role": "user", "content": f"turn {i}"},
        }
        for i in range(n)
    ]
    path.write_text("\n\n".join(json.dumps(r) for r in rows) + "\n")  # a blank line between


class StopsTheBroker:
    """A real client whose broker is stopped before its second batch."""

    def __init__(self, memory: Memory, broker: EmbeddedBroker) -> None:
        self.memory, self.broker, self.batches = memory, broker, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.memory, name)

    def __enter__(self) -> StopsTheBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.memory.close()

    def publish_many(self, events: list[Any]) -> None:
        self.batches += 1
        if self.batches == 2:
            self.broker.stop()
        self.memory.publish_many(events)


def contents(bootstrap: str, topic: str) -> list[str]:
    codec, read = Codec(), []
    asyncio.run(
        read_to_end(bootstrap, topic, lambda rs: read.extend(codec.decode(r.value) for r in rs))
    )
    return sorted(e.body.content for e in read)  # type: ignore[attr-defined]


def test_a_failed_batch_says_what_was_acknowledged_and_skip_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ENGRAM_SEAL", "off")
    path = tmp_path / "events.jsonl"
    write_lines(path, 25)  # event n on line 2n + 1
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        monkeypatch.setenv("ENGRAM_KAFKA_BOOTSTRAP", broker.bootstrap)
        settings = Settings.from_env()
        topic = settings.events_topic
        asyncio.run(ensure_topics(broker.bootstrap, [TopicSpec(topic, 3, KEEP_FOREVER)]))

        class Failing:
            @staticmethod
            def connect(settings: Settings, *, prefer_http: bool) -> StopsTheBroker:
                memory = Memory(bootstrap=broker.bootstrap, settings=settings, timeout=3.0)
                return StopsTheBroker(memory, broker)

        monkeypatch.setattr(engram.publishing, "Memory", Failing)
        with pytest.raises(PartlyPublished) as failed:
            publish_file(settings, path, QUIET, prefer_http=False, batch=10, skip=5)
        # events 5..14 acknowledged, the batch of 15..24 failed: go on from event 15
        assert (failed.value.done, failed.value.pending, failed.value.line) == (15, 10, 31)
    monkeypatch.setattr(engram.publishing, "Memory", Memory)
    with EmbeddedBroker(log_path=tmp_path / "broker2.log") as broker:  # in memory: empty
        monkeypatch.setenv("ENGRAM_KAFKA_BOOTSTRAP", broker.bootstrap)
        asyncio.run(ensure_topics(broker.bootstrap, [TopicSpec(topic, 3, KEEP_FOREVER)]))
        sent = publish_file(Settings.from_env(), path, QUIET, prefer_http=False, batch=10, skip=15)
        assert sent == 10
        assert contents(broker.bootstrap, topic) == sorted(f"turn {i}" for i in range(15, 25))
