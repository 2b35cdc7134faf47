"""``engram import``'s hold on the destination's clock (see :mod:`streams.holds`).

While an import publishes, the destination's ticker must publish no tick: a tick
folded between two imported events would join the agent's log there (an idle session
cut at its time, a forgetting the source never had) and shift every later position.
:func:`clock_held` takes a hold, renews it while the import runs and releases it at
the end, whatever the end (an error, Ctrl-C). A hold of an import that died lapses
by itself after :data:`HOLD_S`: the clock then ticks again.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from engram.client import deployment_bootstrap
from engram.errors import EngramError
from engram.settings import Settings
from streams.holds import Hold, write_hold

HOLD_S = 120.0
"""How long a hold lasts past its latest renewal: ticks resume this long after an
import died (a tick held back is not made up: the next one carries the time since)."""
RENEW_S = 30.0
"""How often a running import renews its hold (four chances before it lapses)."""
SETTLE_S = 2.0
"""How long an import waits after taking its hold before it sends anything. The
ticker reads the holds once its producer is ready and sends its ticks right after:
a tick it decided on just before the hold was written is acknowledged within one
produce request (milliseconds). Waiting this long puts such a tick before the first
imported event in every partition, with a wide margin for a loaded machine."""


@contextmanager
def clock_held(
    bootstrap: str,
    topic: str,
    by: str,
    *,
    hold_s: float = HOLD_S,
    renew_s: float = RENEW_S,
    settle_s: float = SETTLE_S,
    say: Callable[[str], None] = lambda _: None,
) -> Iterator[Hold]:
    """Hold the clock of the deployment on ``bootstrap`` (its clock topic ``topic``)
    for the body, which starts ``settle_s`` after the hold was written; EngramError
    when it cannot be written. The hold is renewed every ``renew_s`` (to ``hold_s``
    ahead) and released on the way out (``say`` tells when that fails)."""
    hold = Hold(uuid.uuid4().hex, time.time() + hold_s, by)
    try:
        _write(bootstrap, topic, hold)
    except Exception as error:
        raise EngramError(
            f"could not hold the clock on {bootstrap} ({topic}): {error!r}; nothing was imported"
        ) from None
    stop = threading.Event()
    renewer = threading.Thread(
        target=_renew, args=(bootstrap, topic, hold, hold_s, renew_s, stop), daemon=True
    )
    renewer.start()
    try:
        time.sleep(settle_s)
        yield hold
    finally:
        stop.set()
        renewer.join()
        if not release(bootstrap, topic, hold):
            say(f"the clock hold could not be released: ticks resume within {hold_s:.0f}s")


def release(bootstrap: str, topic: str, hold: Hold) -> bool:
    """Write ``hold`` released; False when that failed (it then lapses by itself)."""
    try:
        _write(bootstrap, topic, Hold(hold.hold_id, 0.0, hold.by))
    except Exception:
        return False
    return True


def _renew(
    bootstrap: str, topic: str, hold: Hold, hold_s: float, every: float, stop: threading.Event
) -> None:
    """Renew ``hold`` every ``every`` s until ``stop``. A renewal that fails is tried
    again at the next one: the hold outlasts several misses."""
    while not stop.wait(every):
        try:
            _write(bootstrap, topic, Hold(hold.hold_id, time.time() + hold_s, hold.by))
        except Exception:
            continue


def _write(bootstrap: str, topic: str, hold: Hold) -> None:
    asyncio.run(asyncio.wait_for(write_hold(bootstrap, hold, topic), 30))


def hold_clock(
    settings: Settings, by: str, say: Callable[[str], None]
) -> AbstractContextManager[Hold]:
    """:func:`clock_held` on the deployment of ``settings`` (``ENGRAM_KAFKA_BOOTSTRAP``,
    else the running ``engram up``'s broker), its clock topic created if missing (a
    deployment of an engram before holds: its ticker does not read them)."""
    from ops.topics import CLOCK_HOLDS, TopicSpec, ensure_topics

    bootstrap = deployment_bootstrap(settings)
    if not bootstrap:
        raise EngramError(
            f"engram is not running: no {settings.up_file}. Start it with `engram up`, "
            "or set ENGRAM_KAFKA_BOOTSTRAP to a Kafka broker."
        )
    spec = TopicSpec(settings.clock_topic, 1, CLOCK_HOLDS)
    try:
        asyncio.run(asyncio.wait_for(ensure_topics(str(bootstrap), [spec]), 30))
    except Exception as error:
        raise EngramError(
            f"could not reach {settings.clock_topic} on {bootstrap}: {error!r};"
            " nothing was imported"
        ) from None
    return clock_held(str(bootstrap), settings.clock_topic, by, say=say)
