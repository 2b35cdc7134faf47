"""Fixtures that start real components: the session's broker and ``engram up``.

``ENGRAM_TEST_BROKER`` picks the broker: ``tansu`` (the default, the embedded one) or
``kafka`` (Apache Kafka from Maven Central jars, ``ops.kafka``). Asking for ``kafka``
on a machine without Java >= 17 or Maven is a usage error, not a skip.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from ops.broker import EmbeddedBroker
from ops.kafka import ApacheKafka, available
from tests.durations import CACHE_KEY, by_file, committed, file_of
from tests.support import (
    FAST_GROUP,
    STARTED,
    Stack,
    broker_kind,
    start_stack,
    stop_left_running,
    worth_explaining,
)

# CI runs the property tests on a fixed seed, so a run is repeatable; local runs explore.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

TEST_BROKERS = ("tansu", "kafka")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "broker: runs on the session broker (set on every test using `broker`)"
    )
    kind = broker_kind()
    if kind not in TEST_BROKERS:
        known = ", ".join(TEST_BROKERS)
        raise pytest.UsageError(f"ENGRAM_TEST_BROKER={kind!r}: use one of {known}")
    reason = available() if kind == "kafka" else None
    if reason is not None:
        raise pytest.UsageError(f"ENGRAM_TEST_BROKER=kafka, but {reason}")
    config.pluginmanager.register(LongestFilesFirst(config), "engram-longest-files-first")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that need the session broker, directly or through ``stack``:
    ``-m broker`` runs only what changes with ``ENGRAM_TEST_BROKER``."""
    for item in items:
        if "broker" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.broker)


class LongestFilesFirst:
    """Orders the test files as the workers should take them (``make test`` runs
    ``--dist loadfile --no-loadscope-reorder``): the longest first, so that a run does
    not end with one worker on a long file while the other idles (xdist's own order, by
    number of tests, handed out the slow files of one or two tests last). A file's
    length is the sum of the seconds its selected tests took when they last ran on this
    broker (pytest's cache, written by the process that saw the reports: the controller
    under xdist); without them (a fresh clone), the seconds its file took in the runs
    committed with the tests (:mod:`tests.durations`). A file none of whose tests ran
    before comes first if it runs components (integration, e2e: tens of seconds), last
    if it is a unit test file (short ones fill the end). Tests keep their order in a
    file; without xdist, so do the files."""

    def __init__(self, config: pytest.Config) -> None:
        kind = broker_kind()
        self.key = CACHE_KEY + kind
        self.cache = getattr(config, "cache", None)  # None with -p no:cacheprovider
        self.known: dict[str, float] = self.cache.get(self.key, {}) if self.cache else {}
        self.committed = committed(kind)
        self.seconds: dict[str, float] = {}

    @pytest.hookimpl(trylast=True)  # after ``-m`` deselected: the order of what runs
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if not hasattr(config, "workerinput"):  # one process: the files in their order
            return
        known = self.known
        measured = by_file({i.nodeid: known[i.nodeid] for i in items if i.nodeid in known})
        files = dict.fromkeys(file_of(item.nodeid) for item in items)
        for path in files:
            if path not in measured and path in self.committed:
                measured[path] = self.committed[path]

        def weight(path: str) -> tuple[int, float]:
            if path in measured:
                return 1, -measured[path]
            return (2, 0.0) if path.startswith("tests/unit/") else (0, 0.0)

        rank = {path: (weight(path), i) for i, path in enumerate(files)}
        items.sort(key=lambda item: rank[file_of(item.nodeid)])

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.cache is None or not self.seconds or hasattr(session.config, "workerinput"):
            return
        ran = {nodeid: round(s, 2) for nodeid, s in self.seconds.items()}
        self.cache.set(self.key, self.cache.get(self.key, {}) | ran)


def pytest_report_header(config: pytest.Config) -> str:
    return f"broker: {broker_kind()} (ENGRAM_TEST_BROKER)"


@pytest.fixture(autouse=True)
def no_stack_left_running() -> Iterator[None]:
    """After each test, stop the stacks it started and left running (it failed before
    its own stop; the stacks of wider fixtures were started before this snapshot)."""
    started = len(STARTED)
    yield
    left = stop_left_running(started)
    if left:
        warnings.warn(f"stopped {len(left)} engram up left running by the test", stacklevel=1)


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's broker on a free port (see ``ENGRAM_TEST_BROKER``); yields its address."""
    if broker_kind() == "kafka":
        directory = tmp_path_factory.mktemp("kafka")
        with ApacheKafka(directory) as kafka:  # Kafka defaults: the topics carry their settings
            yield kafka.bootstrap
        return
    log = tmp_path_factory.mktemp("tansu") / "broker.log"
    with EmbeddedBroker(log_path=log) as tansu:
        yield tansu.bootstrap


@pytest.fixture(scope="session")
def tansu(broker: str) -> str:
    """The former name of :func:`broker`: the session's broker, Tansu or not."""
    return broker


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, broker: str) -> Iterator[Stack]:
    """``engram up`` against the session broker, chdb in a temp home. On Tansu the group
    timeouts are the short ones ``engram up`` gives its embedded broker; on Apache
    Kafka they are faust's, as in production."""
    home: Path = tmp_path_factory.mktemp("engram-home")
    env = {
        "ENGRAM_KAFKA_BOOTSTRAP": broker,
        "ENGRAM_TICK_INTERVAL_S": "0",  # tests publish their ticks: counts stay exact
    }
    if broker_kind() == "tansu":
        env |= FAST_GROUP
    running = start_stack(home, 90.0, **env)
    yield running
    code = running.stop()
    assert code == 0, f"engram up exited with {code}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """A failed test's report carries what the stacks it ran logged while it ran (the
    warnings and errors of every ``up.log`` written since it started): a stall on a CI
    machine explains itself."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    try:
        base = item.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return
    for log_path in sorted(Path(base).rglob("up.log")):
        if log_path.stat().st_mtime < call.start:
            continue
        text = log_path.read_text(errors="replace")
        shown = worth_explaining(text)[-40:] + text.splitlines()[-10:]
        report.sections.append((f"up.log {log_path}", "\n".join(shown)))
