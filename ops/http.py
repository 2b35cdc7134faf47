"""Serve an ASGI app with uvicorn on a thread of its own (its own event loop),
so it never competes with the worker's loop or its signal handlers."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class HttpServerError(RuntimeError):
    """The HTTP API could not start (port in use, bad address)."""


class HttpThread:
    def __init__(self, app: Any, host: str, port: int) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="engram-http", daemon=True)
        self.url = f"http://{host}:{port}"

    def start(self, timeout: float = 15.0) -> str:
        """Start serving and wait until the socket is bound; return the base URL."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise HttpServerError(
                    f"the HTTP API could not listen on {self.url} (is the port in use? "
                    "set ENGRAM_HTTP=HOST:PORT)"
                )
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
