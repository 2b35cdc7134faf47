"""Shared pieces of the benchmarks: a real ``engram up`` in a subprocess, timing,
and reading peak memory from /proc."""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engram.history import http_client
from ops.launch import launch, stop
from ops.net import free_port
from ops.topics import topic_kinds


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


def compiled() -> dict[str, bool]:
    """Which of ``setup.py``'s mypyc builds this environment runs (the stack it starts
    runs the same): the fold (``processors``) and the wire codec (``schemas.wire``);
    False where it runs their Python sources (``ENGRAM_PURE_PYTHON=1``, or stale)."""
    import processors.memory
    import schemas.wire

    return {
        "fold": not str(processors.memory.__file__).endswith(".py"),
        "wire": not str(schemas.wire.__file__).endswith(".py"),
    }


def peak_rss_mib(pid: int) -> float:
    """Peak resident memory (VmHWM) of a live process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a live process has used so far, in seconds (from
    ``/proc/PID/stat``; its threads included, its children not)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime: the 14th and 15th fields
    return ticks / os.sysconf("SC_CLK_TCK")


def children(pid: int, marker: str) -> list[int]:
    """The live child processes of ``pid`` whose command line contains ``marker``."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(child))
    return found


KEEP_HOMES = "ENGRAM_BENCH_KEEP"
"""Set (to anything) to keep the homes the benchmarks made, for a look after a run."""


@dataclass
class BenchStack:
    """A running ``engram up``; ``owned``: its home was made for it, and goes with it."""

    home: Path
    process: subprocess.Popen[bytes]
    up: dict[str, Any]
    owned: bool = False

    def count(self, query: str) -> int:
        client = http_client(self.up["http"])
        try:
            return int(client.query(query).result_rows[0][0])
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the stack, then remove its home if it was made for it (each run left
        about 100 MiB in the temporary directory), unless :data:`KEEP_HOMES` is set."""
        stop(self.process, grace=60)
        if self.owned and not os.environ.get(KEEP_HOMES):
            shutil.rmtree(self.home, ignore_errors=True)


def start_stack(home: Path | None = None, timeout: float = 120.0, **env: str) -> BenchStack:
    """``engram up`` on the embedded stack in ``home``, or in a fresh temporary home
    that :meth:`BenchStack.stop` removes."""
    owned = home is None
    home = home or Path(tempfile.mkdtemp(prefix="engram-bench-"))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    environ.update({"ENGRAM_HOME": str(home), "ENGRAM_HTTP": f"127.0.0.1:{free_port()}", **env})
    process, up = launch(home, environ, timeout)  # a failed start keeps its home's log
    return BenchStack(home, process, up, owned)


async def embedded_all(bootstrap: str, topic: str) -> bool:
    """Whether every ``memory.created`` on ``topic`` has its ``memory.embedded``."""
    kinds = await topic_kinds(bootstrap, topic)
    return kinds["memory.created"] == kinds["memory.embedded"] > 0


def wait_embedded(bootstrap: str, timeout: float = 600.0) -> float:
    """Seconds until :func:`embedded_all` holds for ``engram.memory`` (the worker's
    embedding and vector agents are then idle); SystemExit after ``timeout``."""
    began = time.monotonic()
    while not asyncio.run(embedded_all(bootstrap, "engram.memory")):
        if time.monotonic() - began > timeout:
            raise SystemExit(f"the worker did not embed every memory within {timeout:.0f} s")
        time.sleep(1.0)
    return time.monotonic() - began
