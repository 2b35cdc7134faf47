"""``engram demo``: three agents, a few sessions each, in English and Chinese.

The events' ids are ``uuid5`` of their place in the script, so running the demo
twice on the same home adds nothing: the second run's events are duplicates and
are dropped. Their times start two days before the day the demo runs
(:func:`demo_start`), so its recall shows memories a day or two old, partly faded:
a fixed start day would show every memory forgotten (retention 0) a few weeks later.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from engram.events import make_event
from schemas import Event

DEMO_NAMESPACE = uuid.UUID("5b0c3f62-8f54-4f4e-a1f0-6f2d2c7b9a11")


def demo_start(today: date | None = None) -> datetime:
    """When the demo's first session starts: 09:00 UTC two days before ``today`` (by
    default the current day in UTC); the same all day long."""
    day = today if today is not None else datetime.now(UTC).date()
    return datetime.combine(day - timedelta(days=2), time(9, 0), tzinfo=UTC)


@dataclass(frozen=True)
class Script:
    agent_id: str
    user_id: str
    sessions: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]


SCRIPTS = (
    Script(
        "travel-agent",
        "alice",
        (
            (
                "Plan a trip to Kyoto",
                (
                    ("user", "I want to visit Kyoto in April for the cherry blossoms."),
                    ("assistant", "April is peak season; shall I look for a ryokan near Gion?"),
                    ("user", "Yes, and I am vegetarian, please remember that."),
                    ("assistant", "Noted: vegetarian meals. I found three ryokans near Gion."),
                ),
            ),
            (
                "Book the flight",
                (
                    ("user", "Book the flight from Berlin on April 3rd."),
                    ("assistant", "Booked: Berlin to Osaka on April 3rd, window seat."),
                ),
            ),
        ),
    ),
    Script(
        "coding-agent",
        "bob",
        (
            (
                "Fix the flaky test",
                (
                    ("user", "The integration test for the payment service fails randomly."),
                    ("assistant", "It depends on wall-clock time; I will inject a clock."),
                    ("user", "Good. Please also add a regression test."),
                ),
            ),
            (
                "Review the migration",
                (
                    ("user", "Can you review the database migration before Friday?"),
                    ("assistant", "The migration locks the orders table; run it in batches."),
                ),
            ),
        ),
    ),
    Script(
        "assistant-zh",
        "wang",
        (
            (
                "安排会议",
                (
                    ("user", "帮我安排下周三下午和产品团队的会议。"),
                    ("assistant", "好的，已预订下周三下午三点的会议室。"),
                    ("user", "记住我不喝咖啡，会议准备绿茶。"),
                    ("assistant", "已记录：您喜欢绿茶，不喝咖啡。"),
                ),
            ),
            (
                "总结报告",
                (
                    ("user", "请总结一下第三季度的销售报告。"),
                    ("assistant", "第三季度销售额增长百分之十二，华东地区表现最好。"),
                    ("user", "很好，把这个发给张经理。"),
                ),
            ),
        ),
    ),
)


def _id(*parts: object) -> uuid.UUID:
    return uuid.uuid5(DEMO_NAMESPACE, "/".join(str(p) for p in parts))


def script_events(script: Script, start: datetime) -> list[Event]:
    """One agent's sessions as events from ``start``: started, turns, ended; a minute
    per turn, 20 hours between sessions."""
    events: list[Event] = []
    at = start
    for number, (task, turns) in enumerate(script.sessions):
        session = f"{script.agent_id}-s{number + 1}"
        steps: list[tuple[str, dict[str, object], object]] = [
            ("session.started", {"task": task}, "start")
        ]
        steps += [
            ("interaction.recorded", {"role": role, "content": content}, index)
            for index, (role, content) in enumerate(turns)
        ]
        steps.append(("session.ended", {"reason": "done"}, "end"))
        for kind, body, step in steps:
            events.append(
                make_event(
                    kind,
                    agent_id=script.agent_id,
                    session_id=session,
                    user_id=script.user_id,
                    body=body,
                    occurred_at=at,
                    event_id=_id(session, step),
                )
            )
            at += timedelta(minutes=1)
        at += timedelta(hours=20)
    return events


def demo_events(start: datetime | None = None) -> list[Event]:
    """Every event of the demo, in publish order, from ``start`` (by default
    :func:`demo_start`)."""
    first = start if start is not None else demo_start()
    return [e for script in SCRIPTS for e in script_events(script, first)]
