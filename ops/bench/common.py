"""Shared pieces of the benchmarks: a real ``engram up`` in a subprocess, timing,
and reading peak memory from /proc."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from engram.history import http_client
from ops.net import free_port


def machine() -> str:
    """Cores and CPU model, for the record next to every figure."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    return f"{os.cpu_count()} cores, {model}, Python {platform.python_version()}"


def peak_rss_mib(pid: int) -> float:
    """Peak resident memory (VmHWM) of a live process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


@dataclass
class BenchStack:
    home: Path
    process: subprocess.Popen[bytes]
    up: dict[str, Any]

    def count(self, query: str) -> int:
        client = http_client(self.up["http"])
        try:
            return int(client.query(query).result_rows[0][0])
        finally:
            client.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_stack(home: Path | None = None, timeout: float = 120.0, **env: str) -> BenchStack:
    """``engram up`` on the embedded stack in a fresh home (a temp dir by default)."""
    home = home or Path(tempfile.mkdtemp(prefix="engram-bench-"))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    environ.update({"ENGRAM_HOME": str(home), "ENGRAM_HTTP": f"127.0.0.1:{free_port()}", **env})
    log = (home / "up.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "engram", "up"], env=environ, stdout=log, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"engram up exited; see {home / 'up.log'}")
        try:
            up: dict[str, Any] = json.loads((home / "up.json").read_text())
            httpx.get(f"{up['http']}/v1/health", timeout=2).raise_for_status()
            return BenchStack(home, process, up)
        except (OSError, ValueError, httpx.HTTPError):
            time.sleep(0.2)
    process.kill()
    raise TimeoutError(f"engram up did not answer within {timeout:.0f}s")
