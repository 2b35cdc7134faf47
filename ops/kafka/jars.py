"""Apache Kafka's jars from Maven Central, collected once by ``mvn`` and reused.

``ops/kafka/pom.xml`` names the broker (``kafka_2.13``) and a log4j2 binding;
``mvn dependency:copy-dependencies`` copies them, with everything they need, into a
directory outside the repo: ``$ENGRAM_KAFKA_JARS``, else
``~/.cache/engram/kafka-<version>/libs``. A directory that holds the broker jar is
reused as it is; a new one is filled beside it and renamed into place, so a run
that dies half-way never leaves a partial directory behind.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

KAFKA_VERSION = "4.1.1"
JAVA_MIN = 17
POM = Path(__file__).resolve().parent / "pom.xml"
MVN_TIMEOUT_S = 900.0
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Maven colours even in batch mode


class KafkaError(RuntimeError):
    """Apache Kafka could not be collected, formatted, started or stopped."""


def jars_dir(version: str = KAFKA_VERSION, env: Mapping[str, str] | None = None) -> Path:
    """Where the jars of ``version`` live: ``$ENGRAM_KAFKA_JARS`` or the user cache."""
    env = os.environ if env is None else env
    if env.get("ENGRAM_KAFKA_JARS"):
        return Path(env["ENGRAM_KAFKA_JARS"]).expanduser()
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "engram" / f"kafka-{version}" / "libs"


def collected(libs: Path) -> bool:
    """True when ``libs`` holds the broker jar (``kafka_2.13-*.jar``)."""
    return libs.is_dir() and any(libs.glob("kafka_2.13-*.jar"))


def java_binary() -> str | None:
    """``$JAVA_HOME/bin/java`` when it exists, else ``java`` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def java_major(java: str) -> int | None:
    """The major version ``java -version`` reports (``1.8`` counts as 8), or None."""
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def missing(version: str = KAFKA_VERSION) -> str | None:
    """Why Apache Kafka cannot run here (no Java >= 17, or no jars and no ``mvn``), or None."""
    java = java_binary()
    if java is None:
        return f"Apache Kafka needs Java >= {JAVA_MIN}: no java on the PATH (nor JAVA_HOME)"
    major = java_major(java)
    if major is None or major < JAVA_MIN:
        return f"Apache Kafka needs Java >= {JAVA_MIN}: {java} is version {major or 'unknown'}"
    if not collected(jars_dir(version)) and shutil.which("mvn") is None:
        return (
            f"Apache Kafka's jars are not in {jars_dir(version)} and there is no mvn"
            " on the PATH to collect them from Maven Central"
        )
    return None


def collect_jars(version: str = KAFKA_VERSION) -> Path:
    """The directory with Kafka ``version``'s jars, collected by ``mvn`` if not yet there."""
    libs = jars_dir(version)
    if collected(libs):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaError(f"no mvn on the PATH to collect Apache Kafka's jars into {libs}")
    libs.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{libs.name}-", dir=libs.parent))
    try:
        run_mvn(mvn, version, staging)
        if not collected(staging):
            raise KafkaError(f"mvn finished but left no kafka_2.13 jar in {staging}")
        _move_into_place(staging, libs)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return libs


def run_mvn(mvn: str, version: str, out: Path) -> None:
    """``mvn dependency:copy-dependencies`` of the POM into ``out``; the tail on failure."""
    cmd = [
        mvn,
        "-B",
        "-q",
        "-Dstyle.color=never",
        "-f",
        str(POM),
        f"-Dkafka.version={version}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={out}",
    ]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=MVN_TIMEOUT_S, cwd=out, check=False
        )
    except subprocess.TimeoutExpired as slow:
        raise KafkaError(f"mvn did not finish within {MVN_TIMEOUT_S:.0f}s: {cmd}") from slow
    if done.returncode != 0:
        tail = ANSI.sub("", done.stdout + done.stderr)[-3000:]
        raise KafkaError(
            f"collecting Apache Kafka {version} with mvn failed ({done.returncode}):\n"
            f"{' '.join(cmd)}\n{tail}"
        )


def _move_into_place(staging: Path, libs: Path) -> None:
    """Rename ``staging`` to ``libs``; another process that got there first wins."""
    try:
        staging.rename(libs)
    except OSError as clash:
        if not collected(libs):
            raise KafkaError(
                f"{libs} exists but holds no kafka_2.13 jar: remove it, or point"
                " ENGRAM_KAFKA_JARS elsewhere"
            ) from clash
