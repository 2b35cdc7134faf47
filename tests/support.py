"""Helpers shared by the integration and end-to-end tests: a real ``engram up``
in a subprocess, queried through its ClickHouse-compatible HTTP endpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import clickhouse_connect
import httpx

from engram.client import reason_of
from ops.launch import launch, stop
from ops.net import free_port

T = TypeVar("T")
WORTH_EXPLAINING = ("WARNING", "ERROR", "ingest process exited")
NOISE = ("Unable connect to", "Unable to update metadata", "NodeNotReadyError")
"""aiokafka's lines of every retry while a broker is away: they bury the rest."""


def broker_kind() -> str:
    """The broker the session runs on: ``$ENGRAM_TEST_BROKER``, ``tansu`` by default."""
    return os.environ.get("ENGRAM_TEST_BROKER") or "tansu"


def worth_explaining(log: str) -> list[str]:
    """The lines of a stack's ``up.log`` that explain a failure: warnings, errors and
    ingest process exits, but :data:`NOISE`, each cut to 300 characters."""
    return [
        line[:300]
        for line in log.splitlines()
        if any(w in line for w in WORTH_EXPLAINING) and not any(n in line for n in NOISE)
    ]


REPO = Path(__file__).resolve().parent.parent


def engram_env(home: Path, **extra: str) -> dict[str, str]:
    """Environment for an engram subprocess with its own home and a free HTTP port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update({"ENGRAM_HOME": str(home), "ENGRAM_HTTP": f"127.0.0.1:{free_port()}"})
    env["ENGRAM_TICK_INTERVAL_S"] = "0"  # no ticker unless a test asks: counts stay exact
    env.update(extra)
    return env


def engram_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "engram", *args]


def wait_until(check: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


@dataclass
class Stack:
    """A running ``engram up``: its home, process and what it wrote to up.json."""

    home: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    up: dict[str, Any]

    @property
    def http(self) -> str:
        return str(self.up["http"])

    @property
    def bootstrap(self) -> str:
        return str(self.up["kafka_bootstrap"])

    def rows(self, query: str, **parameters: Any) -> list[tuple[Any, ...]]:
        url = httpx.URL(self.http)
        client = clickhouse_connect.get_client(host=url.host, port=url.port, interface="http")
        try:
            return [tuple(r) for r in client.query(query, parameters=parameters).result_rows]
        finally:
            client.close()

    def scalar(self, query: str, **parameters: Any) -> Any:
        return self.rows(query, **parameters)[0][0]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        return stop(self.process, sig)

    def explain(self, lines: int = 25) -> str:
        """Why the stack may be behind, for a failure message (the short part of a CI
        log that stays readable): its partitions with lag, from ``/v1/status``, and the
        last lines of its ``up.log`` that :func:`worth_explaining` keeps."""
        try:
            response = httpx.get(f"{self.http}/v1/status", timeout=30)
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}: {reason_of(response)}")
            answer = response.json()
            behind = [
                f"{p['topic']}[{p['partition']}] group={p.get('group') or 'worker'} "
                f"committed={p['committed']} end={p['end']} lag={p['lag']}"
                for p in answer["lag"]
                if p["lag"]
            ]
            lag = "lag: " + ("; ".join(behind) or "none")
        except (httpx.HTTPError, ValueError, KeyError) as error:
            lag = f"status unavailable: {error!r}"
        worth = worth_explaining((self.home / "up.log").read_text(errors="replace"))
        return "\n".join(
            [lag, f"up.log, the last of {len(worth)} warnings and errors:", *worth[-lines:]]
        )


FAST_GROUP = {"ENGRAM_SESSION_TIMEOUT_S": "6", "ENGRAM_REBALANCE_TIMEOUT_S": "2"}
"""Group timeouts for a stack on a broker of its own, so that a restarted or second
worker is let in within seconds rather than faust's default minute."""


STARTED: list[Stack] = []
"""Every stack :func:`start_stack` started in this process, in order (see
:func:`stop_left_running`)."""


def start_stack(home: Path, timeout: float = 90.0, **extra_env: str) -> Stack:
    """Start ``engram up`` and wait until up.json exists and the API answers."""
    env = engram_env(home, **extra_env)
    process, up = launch(home, env, timeout)
    STARTED.append(Stack(home, env, process, up))
    return STARTED[-1]


def stop_left_running(since: int, grace: float = 10.0) -> list[Stack]:
    """Stop the stacks of :data:`STARTED` after its first ``since`` that still run (a
    test that failed before it stopped what it started: the stack ran on, its broker
    gone, through the rest of the session); SIGKILL after ``grace`` s. Returns them."""
    left = [s for s in STARTED[since:] if s.process.poll() is None]
    for stack in left:
        stop(stack.process, grace=grace)
    del STARTED[since:]
    return left


def open_letters(stack: Stack, values: list[bytes]) -> list[bytes | None]:
    """What the stack's dead letters ``values`` hold: sealed letters opened with its keys
    (its home's master key; None for an erased subject's), other bytes as they are."""
    from schemas.letters import open_letter
    from sinks.keys import BlockingKeyring, MasterKey

    master = MasterKey.from_file(stack.home / "master.key")
    keys = BlockingKeyring(stack.bootstrap, "engram.keys", master)
    try:
        keys.refresh()
        return [open_letter(keys.book, value).raw for value in values]
    finally:
        keys.close()
