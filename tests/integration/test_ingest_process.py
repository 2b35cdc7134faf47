"""The ingest process dies with its stack (:func:`ops.ingest_child._die_with_parent`),
even when the stack ends before the child has asked for its parent's death signal (the
child is then already adopted by another process). Real processes, no broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent(
    """
    import sys, time
    from ops.ingest_child import _die_with_parent
    time.sleep(float(sys.argv[2]))  # the parent may end meanwhile
    _die_with_parent(int(sys.argv[1]))
    print("armed", flush=True)
    time.sleep(60)
    """
)
PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    child = subprocess.Popen(
        [sys.executable, "-c", sys.argv[1], str(os.getpid()), sys.argv[2]],
        start_new_session=True,
    )
    print(child.pid, flush=True)
    time.sleep(float(sys.argv[3]))
    """
)


def gone(pid: int, within: float) -> bool:
    """Whether ``pid`` ends within ``within`` seconds (an adopted zombie counts as gone)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def run_parent(child_delay: float, parent_life: float) -> tuple[subprocess.Popen[str], int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(child_delay), str(parent_life)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


def test_a_child_whose_parent_is_killed_dies_with_it() -> None:
    parent, child = run_parent(child_delay=0.0, parent_life=60.0)
    time.sleep(3.0)  # the child has armed its death signal (imports take ~1 s)
    assert not gone(child, 0.1)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    assert gone(child, 5.0), "the child outlived its killed parent"


def test_a_child_adopted_before_it_asks_dies_at_once() -> None:
    parent, child = run_parent(child_delay=2.0, parent_life=0.0)
    parent.wait()  # the parent ended before the child asked for the signal
    assert gone(child, 10.0), "an adopted child kept running"
