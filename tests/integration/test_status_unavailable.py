"""``GET /v1/status`` when the broker refuses or does not answer: a 503 that says so,
within the endpoint's bound, never a request left hanging (real aiokafka clients, a
port where nothing listens, and a socket that accepts and never answers)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from engram.client import reason_of
from engram.status import Projections, status_router
from ops.net import free_port

pytestmark = pytest.mark.integration


def client_for(bootstrap: str, timeout_s: float) -> TestClient:
    app = FastAPI()
    app.include_router(
        status_router(
            bootstrap=bootstrap,
            group="engram-worker",
            topics=["engram.events"],
            dead_letter_topic="engram.events.dlq",
            projections=lambda: Projections(),
            timeout_s=timeout_s,
        )
    )
    return TestClient(app)


@pytest.fixture
def silent() -> Iterator[str]:
    """A listener that accepts connections and never answers a request."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield f"127.0.0.1:{server.getsockname()[1]}"


def test_a_refusing_broker_gives_a_503_that_names_it() -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    with client_for(bootstrap, 20.0) as client:
        answer = client.get("/v1/status")
    assert answer.status_code == 503
    assert f"the broker at {bootstrap} failed" in reason_of(answer)
    assert "the lag is unknown" in reason_of(answer)


def test_a_silent_broker_gives_a_503_within_the_bound(silent: str) -> None:
    began = time.monotonic()
    with client_for(silent, 1.0) as client:
        answer = client.get("/v1/status")
    waited = time.monotonic() - began
    assert answer.status_code == 503
    assert reason_of(answer) == (
        f"the broker at {silent} did not answer within 1 s: the lag is unknown"
    )
    assert waited < 10, "aiokafka's own request timeout is 40 s"
