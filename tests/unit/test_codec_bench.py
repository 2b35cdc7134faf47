"""The codec benchmark times the work it names (``ops/bench/codec.py``): its clear
bytes decode to the events, its sealed events open to them, and its derived events'
bytes open to them."""

from __future__ import annotations

import json
import subprocess
import sys

from ops.bench.codec import Workload


def test_each_step_does_what_it_is_timed_for() -> None:
    work = Workload(300, 7)
    assert len(work.derived) >= len(work.events)
    assert work.decode() == work.events
    opened = work.open()
    assert [event for event, _ in opened] == work.events
    assert [clear for _, clear in opened] == work.clear
    assert work.seal() != work.sealed  # fresh nonces, the same events inside
    for (clear, sealed), event in zip(work.encode_derived(), work.derived, strict=True):
        assert work.codec.open_clear(sealed) == (event, clear)


def test_it_reports_each_step_per_event() -> None:
    command = [sys.executable, "-m", "ops.bench.codec", "--events", "200", "--repeat", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(done.stdout)
    assert result["events"] == 200
    assert set(result["us_per_event"]) == {"decode", "seal", "open", "derived"}
    assert all(us > 0 for us in result["us_per_event"].values())
    assert set(result["compiled"]) == {"fold", "wire"}
