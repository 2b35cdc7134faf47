"""Start ``engram up`` as a child process and wait until it answers; stop it.

Used by ``engram demo``, the benchmarks and the tests: one way to launch the stack.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx


class LaunchError(RuntimeError):
    """``engram up`` exited or did not answer in time; the message has its log tail."""


def answering(up_file: Path) -> dict[str, Any] | None:
    """What ``up.json`` records if the stack's HTTP API answers, else None."""
    try:
        up: dict[str, Any] = json.loads(up_file.read_text())
        httpx.get(f"{up['http']}/v1/health", timeout=2).raise_for_status()
    except (OSError, ValueError, KeyError, httpx.HTTPError):
        return None
    return up


def launch(
    home: Path, env: Mapping[str, str], timeout: float = 120.0
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Run ``engram up`` with ``env`` (its ``ENGRAM_HOME`` is ``home``), logging to
    ``home/up.log``; return the process and its ``up.json`` once the API answers."""
    home.mkdir(parents=True, exist_ok=True)
    up_file = home / "up.json"
    up_file.unlink(missing_ok=True)
    log_path = home / "up.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "engram", "up"],
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise LaunchError(f"engram up exited with {process.returncode}:\n{tail}")
        up = answering(up_file)
        if up is not None:
            return process, up
        time.sleep(0.2)
    stop(process)
    raise LaunchError(f"engram up did not answer within {timeout:.0f}s; see {log_path}")


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 30) -> int:
    """Signal the process (SIGTERM by default), kill it after ``grace`` s; its exit code."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode
