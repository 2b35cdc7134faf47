"""Apache Kafka for tests and local runs: one KRaft node (broker and controller) on
127.0.0.1, started from the jars of Maven Central (see ``ops/kafka/jars.py``).

Unlike the embedded Tansu broker, its log is on disk: a broker stopped, or killed
with SIGKILL, and started again on the same directory keeps every acknowledged
record. It compacts, and answers ``offsets_for_times`` by the producer's CreateTime.
The child is tied to its parent (``PR_SET_PDEATHSIG``), so it never outlives it: to
the *thread* that started it, in fact (Linux signals the child when that thread
ends), so start it from a thread that lives as long as the broker should (the main
one), never from a short-lived one such as a ``threading.Timer``.

A directory holds ``server.properties``, ``log4j2.properties``, the log
(``data/``) and the broker's output (``kafka.log``).
"""

from __future__ import annotations

import base64
import ctypes
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from ops.kafka.jars import KAFKA_VERSION, KafkaError, collect_jars, java_binary
from ops.net import bindable, free_port

PR_SET_PDEATHSIG = 1
READY = b"Kafka Server started"
BIND_FAILED = b"java.net.BindException"
ATTEMPTS = 3
JVM_OPTIONS = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
# One node: every internal topic has replication factor 1 (the default 3 hangs
# groups and transactions), joins start at once, nothing expires by age.
SETTINGS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "inter.broker.listener.name": "PLAINTEXT",
    "controller.listener.names": "CONTROLLER",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "num.network.threads": "2",
    "num.io.threads": "2",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": "16777216",
    "log.cleaner.backoff.ms": "1000",
    "log.retention.ms": "-1",
    # A node killed with SIGKILL registers again only once its old session expired
    # (default 9 s): short heartbeats make a restart after a crash quick.
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "3000",
}
LOG4J2 = """\
status = warn
shutdownHook = disable
appender.out.type = Console
appender.out.name = STDERR
appender.out.target = SYSTEM_ERR
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = STDERR
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def cluster_id() -> str:
    """22 characters of URL-safe base64 of 16 random bytes, not starting with ``-``."""
    while True:
        found = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip("=")
        if not found.startswith("-"):
            return found


def previous_ports(properties: Path) -> tuple[int | None, int | None]:
    """(broker, controller) ports of an earlier ``server.properties``, if there is one."""
    try:
        text = properties.read_text()
    except OSError:
        return None, None
    broker = re.search(r"PLAINTEXT://[^:,]+:(\d+)", text)
    controller = re.search(r"CONTROLLER://[^:,]+:(\d+)", text)
    return (
        int(broker.group(1)) if broker else None,
        int(controller.group(1)) if controller else None,
    )


def two_free_ports() -> tuple[int, int]:
    first = free_port()
    while (second := free_port()) == first:
        pass
    return first, second


class ApacheKafka:
    """Start and stop one Apache Kafka node on 127.0.0.1.

    ``directory`` keeps its configuration and log; a restart on the same directory
    reuses its ports and its data. Without one, a temporary directory is made and
    removed by :meth:`close` (or leaving the ``with`` block). ``properties`` adds
    to or overrides ``server.properties``.

    Ports it picked itself and finds taken at its first start (someone bound one
    since) are picked again, up to ``ATTEMPTS`` times; ports it was given, read
    from an earlier ``server.properties`` or listened on once are kept.
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        port: int | None = None,
        controller_port: int | None = None,
        properties: Mapping[str, str] | None = None,
        version: str = KAFKA_VERSION,
    ) -> None:
        self.host = "127.0.0.1"
        self._temporary = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="engram-kafka-"))
        old_port, old_controller = previous_ports(self.server_properties)
        fresh_port, fresh_controller = two_free_ports()
        self.port = port or old_port or fresh_port
        self.controller_port = controller_port or old_controller or fresh_controller
        self._own_ports = not (port or old_port or controller_port or old_controller)
        self.properties = dict(properties or {})
        self.version = version
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def server_properties(self) -> Path:
        return self.directory / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.directory / "kafka.log"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 90.0) -> str:
        """Collect the jars if needed, format a new data directory, start the broker
        and wait until it says ``Kafka Server started``; return its address."""
        if self.running():
            raise KafkaError(f"Apache Kafka is already running on {self.bootstrap}")
        java = self._java()
        libs = collect_jars(self.version)
        self.directory.mkdir(parents=True, exist_ok=True)
        for _ in range(ATTEMPTS - 1):
            if self._own_ports and not self._ports_bindable():
                self.port, self.controller_port = two_free_ports()
            seen = self._launch(java, libs)
            try:
                return self._started(seen, timeout)
            except KafkaError:
                if not (self._own_ports and BIND_FAILED in self._output_since(seen)):
                    raise
                self.port, self.controller_port = two_free_ports()
        return self._started(self._launch(java, libs), timeout)

    def _ports_bindable(self) -> bool:
        return bindable(self.host, self.port) and bindable(self.host, self.controller_port)

    def _launch(self, java: str, libs: Path) -> int:
        """Write the configuration, format the log if new and start the broker; return
        where its output starts in ``kafka.log``."""
        self._write_config()
        if not (self.data_dir / "meta.properties").exists():
            self._format(java, libs)
        seen = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self._command(java, libs, "kafka.Kafka", str(self.server_properties)),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                preexec_fn=_die_with_parent,
            )
        return seen

    def _started(self, seen: int, timeout: float) -> str:
        self._await_ready(seen, timeout)
        self._own_ports = False  # clients know them now: a restart keeps them
        return self.bootstrap

    def stop(self, grace: float = 30.0) -> int | None:
        """Controlled shutdown (SIGTERM), SIGKILL after ``grace`` s; the exit code
        (143, the JVM's code for SIGTERM, after a controlled shutdown; -9 if killed)."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def kill(self) -> int | None:
        """SIGKILL, as a crash would: the next start recovers the log."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.kill()
        return process.wait()

    def restart(self, *, crash: bool = True, timeout: float = 90.0) -> str:
        """SIGKILL (``crash``, as :meth:`kill`) or stop the broker, then start it again
        on the same directory and ports, its log recovered; return its address."""
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop, and remove the directory if it was a temporary one."""
        self.stop()
        if self._temporary:
            shutil.rmtree(self.directory, ignore_errors=True)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> ApacheKafka:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _java(self) -> str:
        java = java_binary()
        if java is None:
            raise KafkaError("Apache Kafka needs Java >= 17: no java on the PATH (nor JAVA_HOME)")
        return java

    def _command(self, java: str, libs: Path, *args: str) -> list[str]:
        log4j = f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}"
        return [java, *JVM_OPTIONS, log4j, "-cp", f"{libs}/*", *args]

    def _write_config(self) -> None:
        listeners = {
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "log.dirs": str(self.data_dir),
        }
        lines = [f"{k}={v}" for k, v in {**SETTINGS, **listeners, **self.properties}.items()]
        self.server_properties.write_text("\n".join(lines) + "\n")
        (self.directory / "log4j2.properties").write_text(LOG4J2)

    def _format(self, java: str, libs: Path) -> None:
        """``kafka.tools.StorageTool format`` with a new cluster id (static quorum)."""
        cmd = self._command(
            java,
            libs,
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            cluster_id(),
            "--config",
            str(self.server_properties),
        )
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise KafkaError(
                f"formatting {self.data_dir} failed ({done.returncode}):\n"
                f"{(done.stdout + done.stderr)[-3000:]}"
            )

    def _await_ready(self, seen: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY in self._output_since(seen):
                return
            if self.process is None or self.process.poll() is not None:
                code = self.process.returncode if self.process else None
                self.process = None
                raise KafkaError(
                    f"Apache Kafka exited with {code} before it started; {self.log_path}:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.1)
        self.stop()
        raise KafkaError(
            f"Apache Kafka did not start within {timeout:.0f}s; {self.log_path}:\n{self.log_tail()}"
        )

    def _output_since(self, seen: int) -> bytes:
        with self.log_path.open("rb") as log:
            log.seek(seen)
            return log.read()
