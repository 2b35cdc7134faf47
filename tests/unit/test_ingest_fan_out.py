"""The ingest agent copies a broadcast erasure request to every partition
(streams.ingest.fan_out); everything else keeps its key's partition."""

from __future__ import annotations

from streams.ingest import BROADCAST_KEY, fan_out
from streams.logwriter import Record


def test_a_broadcast_request_goes_to_every_partition_in_place() -> None:
    before = Record(b"agent-a", b"1")
    request = Record(BROADCAST_KEY, b"erase")
    after = Record(b"agent-b", b"2")
    out = fan_out([before, request, after], 3)
    assert out[0] == before and out[-1] == after
    assert [(r.key, r.value, r.partition) for r in out[1:-1]] == [
        (BROADCAST_KEY, b"erase", p) for p in range(3)
    ]


def test_other_records_and_placed_ones_are_left_alone() -> None:
    records = [Record(b"agent-a", b"1"), Record(BROADCAST_KEY, b"erase", partition=2)]
    assert fan_out(records, 4) == records
