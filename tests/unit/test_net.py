"""Ports for local services (``ops.net``): picked below the kernel's ephemeral range,
where no outgoing connection can take one before the service binds it."""

from __future__ import annotations

import socket
from pathlib import Path

from ops.net import PORT_FLOOR, bindable, ephemeral_low, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low = ephemeral_low()
    ports = {free_port() for _ in range(50)}
    assert all(PORT_FLOOR <= port < low for port in ports)
    assert all(bindable("127.0.0.1", port) for port in ports)
    assert len(ports) > 40  # picked at random, not one port handed out again and again


def test_a_port_someone_holds_is_not_bindable() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        assert not bindable("127.0.0.1", port)
    assert bindable("127.0.0.1", port)


def test_the_ephemeral_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    ranged = tmp_path / "ip_local_port_range"
    ranged.write_text("40000\t60999\n")
    assert ephemeral_low(ranged) == 40_000
    ranged.write_text("garbage\n")
    assert ephemeral_low(ranged) == 32_768
    assert ephemeral_low(tmp_path / "missing") == 32_768
