"""``engram.demo``'s script: ids fixed by their place in it, times relative to the day
the demo runs (so its recall shows memories a day or two old, not all forgotten)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from engram.demo import demo_events, demo_start


def test_the_script_starts_two_days_before_the_day_it_runs_the_same_all_day() -> None:
    assert demo_start(date(2027, 3, 1)) == datetime(2027, 2, 27, 9, 0, tzinfo=UTC)
    now = datetime.now(UTC)
    events = demo_events()
    assert events[0].occurred_at == demo_start() == demo_start(now.date())
    assert all(e.occurred_at < now for e in events), "every event is in the past"
    assert max(e.occurred_at for e in events) > now - timedelta(days=2), "and recent"


def test_a_later_day_gives_the_same_events_at_other_times_so_a_rerun_adds_nothing() -> None:
    today = demo_events(demo_start(date(2027, 3, 1)))
    later = demo_events(demo_start(date(2027, 4, 15)))
    assert [e.event_id for e in today] == [e.event_id for e in later]
    assert [e.body for e in today] == [e.body for e in later]
    shift = later[0].occurred_at - today[0].occurred_at
    assert shift == timedelta(days=45)
    assert all(b.occurred_at - a.occurred_at == shift for a, b in zip(today, later, strict=True))
