"""The embedded Tansu broker (``ops.broker``) starts on a port of its own even when
the one it picked was taken before it bound it, and refuses a given port that is
taken, saying so."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from ops.broker import BrokerError, EmbeddedBroker

pytestmark = pytest.mark.integration


async def create_and_list(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("ports", 1, 1)])
        return set(await admin.list_topics())
    finally:
        await admin.close()


def test_a_picked_port_taken_before_the_start_is_picked_again(tmp_path: Path) -> None:
    broker = EmbeddedBroker(log_path=tmp_path / "broker.log")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", broker.port))
        squatter.listen()
        taken = broker.port
        with broker:
            assert broker.port != taken
            assert "ports" in asyncio.run(create_and_list(broker.bootstrap))


def test_a_given_port_that_is_taken_is_refused(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        taken = squatter.getsockname()[1]  # bound, not listening: connecting fails
        broker = EmbeddedBroker(taken, log_path=tmp_path / "broker.log")
        with pytest.raises(BrokerError, match=rf"did not listen on 127\.0\.0\.1:{taken} \(exited"):
            broker.start(timeout=20)
        assert broker.port == taken and broker.process is None
