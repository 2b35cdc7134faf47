"""Export files read back, whatever happened to them: a damaged Avro container is a
``BadEvent`` naming it, never a stray zlib or fastavro error; a sealed archive read
without keys says so."""

from __future__ import annotations

import io
import random
from pathlib import Path

import fastavro
import pytest

from engram import make_event
from engram.errors import EngramError
from engram.transfer import _PARSED, _clear_only, read_export
from schemas import BadEvent, Codec
from schemas.sealed import SEALED_HEADER


def container(events: int = 40) -> bytes:
    codec = Codec()
    rows = [
        {
            "agent_id": "mover",
            "seq": seq,
            "payload": codec.encode(
                make_event(
                    "interaction.recorded",
                    agent_id="mover",
                    body={"role": "user", "content": f"line {seq} " * 20},
                )
            ),
        }
        for seq in range(events)
    ]
    out = io.BytesIO()
    fastavro.writer(out, _PARSED, rows, codec="deflate")
    return out.getvalue()


def test_every_damaged_container_is_a_bad_event_or_reads(tmp_path: Path) -> None:
    good = container()
    path = tmp_path / "x.avro"
    path.write_bytes(good)
    assert len(read_export(path)) == 40
    rng = random.Random(7)
    refused = 0
    for trial in range(150):
        damaged = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        if trial % 3 == 0:
            damaged = damaged[: rng.randrange(len(damaged))]
        path.write_bytes(bytes(damaged))
        try:
            read_export(path)
        except BadEvent as bad:
            refused += 1
            assert bad.reason  # says what is wrong
    assert refused > 50  # most damage is noticed (deflate has no checksum: not all)


def test_a_sealed_archive_read_without_keys_says_so() -> None:
    read = _clear_only(Codec())
    with pytest.raises(EngramError, match="the history is sealed and its keys cannot be reached"):
        read(SEALED_HEADER + b"\x00" * 40)
