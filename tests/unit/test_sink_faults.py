"""``ENGRAM_FAULT`` (streams.faults): the specs parse as documented, timed faults end
on a clock of our own, flag files turn faults on and off while the worker runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streams.faults import SinkDown, SinkFault, SinkGate, parse_fault, parse_faults


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_specs_parse_as_documented(tmp_path: Path) -> None:
    assert parse_fault("clickhouse:down:20") == SinkFault("clickhouse", "down", seconds=20.0)
    assert parse_fault("clickhouse:down") == SinkFault("clickhouse", "down")
    assert parse_fault("vectors:slow:0.5") == SinkFault("vectors", "slow", 0.5)
    assert parse_fault("vectors:slow:0.5:30") == SinkFault("vectors", "slow", 0.5, 30.0)
    faults = parse_faults("flags, vectors:down:5", tmp_path)
    assert faults is not None
    assert faults.flags_dir == tmp_path / "faults"
    assert faults.timed == {"vectors": SinkFault("vectors", "down", seconds=5.0)}
    assert parse_faults("", tmp_path) is None
    assert parse_faults(None, tmp_path) is None


@pytest.mark.parametrize(
    "spec",
    ["qdrant:down:1", "clickhouse:up:1", "clickhouse:slow", "clickhouse:down:x", "vectors:down:-1"],
)
def test_a_bad_spec_is_refused_with_the_variable_named(spec: str) -> None:
    with pytest.raises(ValueError, match="ENGRAM_FAULT"):
        parse_fault(spec)


def test_a_timed_outage_counts_from_the_first_write_and_ends(tmp_path: Path) -> None:
    clock = Clock()
    faults = parse_faults("clickhouse:down:20", tmp_path)
    assert faults is not None
    gate = SinkGate(faults, clock)
    clock.now += 1000  # the worker started long ago: the outage starts at the first write
    with pytest.raises(SinkDown):
        gate.delay_or_raise("clickhouse")
    assert gate.delay_or_raise("vectors") == 0.0, "another store is not affected"
    clock.now += 19.9
    with pytest.raises(SinkDown):
        gate.delay_or_raise("clickhouse")
    clock.now += 0.1
    assert gate.delay_or_raise("clickhouse") == 0.0


def test_a_slow_store_delays_each_write_for_its_duration(tmp_path: Path) -> None:
    clock = Clock()
    faults = parse_faults("vectors:slow:0.5:10", tmp_path)
    assert faults is not None
    gate = SinkGate(faults, clock)
    assert gate.delay_or_raise("vectors") == 0.5
    clock.now += 10
    assert gate.delay_or_raise("vectors") == 0.0


def test_flag_files_turn_a_fault_on_and_off(tmp_path: Path) -> None:
    faults = parse_faults("flags", tmp_path)
    assert faults is not None
    gate = SinkGate(faults, Clock())
    assert gate.delay_or_raise("clickhouse") == 0.0
    flag = tmp_path / "faults" / "clickhouse"
    flag.parent.mkdir()
    flag.write_text("down\n")
    with pytest.raises(SinkDown):
        gate.delay_or_raise("clickhouse")
    flag.write_text("slow:2")
    assert gate.delay_or_raise("clickhouse") == 2.0
    flag.write_text("")
    with pytest.raises(SinkDown):
        gate.delay_or_raise("clickhouse")
    flag.unlink()
    assert gate.delay_or_raise("clickhouse") == 0.0


def test_without_faults_the_write_is_handed_back_untouched() -> None:
    from streams import faults

    async def write() -> int:
        return 7

    if faults.SINK_FAULTS is not None:
        pytest.skip("ENGRAM_FAULT is set in this environment")
    coroutine = write()
    assert faults.guarded("clickhouse", coroutine) is coroutine
    assert asyncio.run(coroutine) == 7
    faults.check("vectors")  # nothing happens


def test_a_write_to_a_store_that_is_down_never_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from streams import faults

    configured = parse_faults("clickhouse:down", tmp_path)
    assert configured is not None
    monkeypatch.setattr(faults, "_gate", SinkGate(configured))
    ran: list[int] = []

    async def write() -> None:
        ran.append(1)

    async def through(store: str) -> None:
        await faults.guarded(store, write())

    with pytest.raises(SinkDown):
        asyncio.run(through("clickhouse"))
    with pytest.raises(SinkDown):
        faults.check("clickhouse")
    asyncio.run(through("vectors"))
    assert ran == [1], "only the write to the store that is up ran"
