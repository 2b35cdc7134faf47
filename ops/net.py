"""Small network helpers for starting local services."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Ports are picked at random from here up to the kernel's ephemeral range. A port
# the kernel hands out (``bind(host, 0)``) is one it may hand out again as the
# local end of any outgoing connection, so a service told to listen on it later
# can find it taken; a port below the range is taken only by whoever binds it.
PORT_FLOOR = 20_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_picker = random.Random()  # seeded from os.urandom: a test's seed does not reach it


def ephemeral_low(path: Path = EPHEMERAL_RANGE) -> int:
    """The first port of the kernel's ephemeral range (Linux's default, 32768, when
    it cannot be read)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def bindable(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host`` now (nothing listens on it or holds it)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, below the kernel's ephemeral range (so
    no outgoing connection takes it meanwhile); the kernel's pick when that range
    leaves too few ports below it."""
    low = ephemeral_low()
    if low - PORT_FLOOR >= 1_000:
        for _ in range(100):
            port = _picker.randrange(PORT_FLOOR, low)
            if bindable(host, port):
                return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0
