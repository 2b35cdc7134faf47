"""Clock holds (:mod:`streams.holds`, :mod:`engram.clock`) on the session's broker: the
ticker publishes no tick while a hold is in force, and ticks again once it is released
or has lapsed (its import died)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from engram.clock import clock_held
from ops.topics import CLOCK_HOLDS, KEEP_FOREVER, TopicSpec, ensure_topics, read_to_end
from schemas import Codec
from streams.holds import Hold, active, decode_hold, encode_hold, read_holds, write_hold
from streams.ticker import publish_ticks

pytestmark = pytest.mark.integration


def topics(broker: str) -> tuple[str, str]:
    """A log of two partitions and a clock topic of their own."""
    tag = uuid.uuid4().hex[:8]
    events, clock = f"events-{tag}", f"clock-{tag}"
    specs = [TopicSpec(events, 2, KEEP_FOREVER), TopicSpec(clock, 1, CLOCK_HOLDS)]
    asyncio.run(ensure_topics(broker, specs))
    return events, clock


def tick(broker: str, events: str, clock: str) -> bool:
    return asyncio.run(publish_ticks(broker, events, 1.0, Codec(), clock))


def logged(broker: str, topic: str) -> int:
    return asyncio.run(read_to_end(broker, topic, lambda _: None))


def test_the_last_record_of_a_hold_decides_and_a_lapsed_one_is_not_in_force() -> None:
    records = [Hold("a", 100.0, "x"), Hold("b", 50.0, "y"), Hold("a", 0.0, "x")]
    assert active(records, now=10.0) == [Hold("b", 50.0, "y")]  # a released
    assert active(records, now=60.0) == []  # b lapsed
    record = encode_hold(Hold("c", 12.5, "import of z"))
    assert decode_hold(record.key, record.value) == Hold("c", 12.5, "import of z")
    assert decode_hold(b"d", b"not json") is None and decode_hold(b"d", b"{}") is None


def test_no_tick_while_held_ticks_once_released(broker: str) -> None:
    events, clock = topics(broker)
    assert tick(broker, events, clock)  # no hold yet
    with clock_held(broker, clock, "import of test", settle_s=0.0) as hold:
        [found] = active(asyncio.run(read_holds(broker, clock)), time.time())
        assert found.hold_id == hold.hold_id and found.by == "import of test"
        assert not tick(broker, events, clock)
        assert not tick(broker, events, clock)
    assert active(asyncio.run(read_holds(broker, clock)), time.time()) == []
    assert tick(broker, events, clock)
    assert logged(broker, events) == 2 * 2  # two ticks on each partition, none held back


def test_a_hold_is_released_when_the_import_fails(broker: str) -> None:
    events, clock = topics(broker)
    with pytest.raises(KeyboardInterrupt), clock_held(broker, clock, "import", settle_s=0.0):
        raise KeyboardInterrupt
    assert tick(broker, events, clock)


def test_a_hold_renewed_lasts_and_one_not_renewed_lapses(broker: str) -> None:
    """A hold lasts ``hold_s`` past its latest renewal; one whose import died (no
    renewal, no release) stops the clock only until it lapses."""
    events, clock = topics(broker)
    with clock_held(broker, clock, "import", hold_s=2.0, renew_s=0.5, settle_s=3.0):
        assert not tick(broker, events, clock)  # 3 s after it was taken: renewed
    died = Hold(uuid.uuid4().hex, time.time() + 2.0, "import of a dead process")
    asyncio.run(write_hold(broker, died, clock))
    assert not tick(broker, events, clock)
    time.sleep(max(died.until - time.time(), 0) + 0.1)
    assert tick(broker, events, clock)
