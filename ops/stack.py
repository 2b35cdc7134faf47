"""``engram up``: the embedded stack in one process tree.

Order of start: broker (embedded Tansu, unless ``ENGRAM_KAFKA_BOOTSTRAP`` names
one) -> topics -> ClickHouse (chdb under ``$ENGRAM_HOME/clickhouse`` unless
``ENGRAM_CLICKHOUSE_URL``) -> restore the log from the archive when the broker
is empty -> HTTP API -> ``up.json`` -> the faust worker, in the foreground until
SIGINT/SIGTERM. Stopping tears it all down, the broker child included.

The HTTP API also serves the blue/green rebuilds of the projections
(``/v1/admin/rebuilds``, :mod:`ops.rebuild`): this process owns chdb and the Edge
directory, so the rebuilds run here; the vector projection's writes pass the
rebuild's gate (:class:`~ops.rebuild.GatedIndex`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import clickhouse_connect
import faust

from engram.api import create_api
from engram.client import Memory
from engram.letters import Opener, letters_router
from engram.recall import Recaller
from engram.service import MemoryService, memory_router
from engram.settings import Settings
from engram.sqlgate import QueryGate, QueryLimits
from engram.status import Projections, status_router
from ops.broker import EmbeddedBroker
from ops.http import HttpThread
from ops.ingest_child import IngestChild, ingest_group, register_hop
from ops.rebuild import GatedIndex, Rebuilds, rebuild_router
from ops.reprocess import (
    Parts,
    Reprocesses,
    WorkerControl,
    member_patience,
    recover,
    reprocess_router,
)
from ops.restore import restore_log
from ops.topics import ensure_topics, pipeline_topics
from ops.worker import run_worker, worker_app, worker_keys
from processors import MemoryConfig
from processors.summary import SUMMARISER_NAME
from schemas import RAW_TYPE_NAMES, Codec, Event
from schemas.sealed import SealingCodec
from sinks.clickhouse import ClickHouseHistory
from sinks.clickhouse_erasure import without_pandas
from sinks.derivations import Derivation, Derivations, first
from sinks.embed_process import ProcessEmbedder
from sinks.embedding import Embedder, get_embedder
from sinks.keys import BlockingKeyring, OpenEvent, restore_keys
from sinks.vectors import VectorIndex, open_index
from streams import faults
from streams.logwriter import LogWriter
from streams.pipeline import fold_waiting, register
from streams.summariser import ClickHouseSummaryRecords, LlmEndpoint, LlmSummariser
from streams.ticker import register_ticker
from streams.vectors import FoldFirst, register_vectors

log = logging.getLogger("engram.up")
KEY_FOLLOW_S = 2.0
"""How often the stack reads the key topic into its key file (keys made by producers
elsewhere; destroyed ones, whose material the file then drops)."""
Say = Callable[[str], None]


def episode_summariser(settings: Settings, history: ClickHouseHistory) -> LlmSummariser | None:
    """The LLM summariser of episodes when ``ENGRAM_LLM_URL`` is set, else None (the
    fold's extractive summaries stand)."""
    if settings.llm_url is None or settings.llm_model is None:
        return None
    endpoint = LlmEndpoint(
        settings.llm_url, settings.llm_model, settings.llm_api_key, settings.llm_timeout_s
    )
    return LlmSummariser(endpoint, ClickHouseSummaryRecords(history))


def summariser_name(settings: Settings) -> str:
    return f"llm:{settings.llm_model}" if settings.llm_url else SUMMARISER_NAME


async def embedding_writer(settings: Settings, bootstrap: str) -> tuple[LogWriter, Codec]:
    """A writer (and codec) for the ``memory.embedded`` records a vector rebuild makes:
    sealed under keys of its own, which it closes when it stops, when sealing is on."""
    if not settings.sealing:
        return LogWriter(bootstrap), Codec(max_bytes=settings.max_event_bytes)
    keys, codec = worker_keys(settings, bootstrap)
    await keys.ready()  # the keys made before: a record is sealed under its subject's key
    return keys.writer(bootstrap, owns_keys=True), codec


def ingest_batch_size(settings: Settings, config: MemoryConfig) -> int:
    """The ingest hop's batch size: a crash seals one batch again, and within the
    fold's window of event ids the copies are dropped."""
    return min(settings.batch_size, config.dedupe_window)


def fold_first(app: faust.App, settings: Settings) -> FoldFirst | None:
    """Memories wait to be embedded while ``settings.embed_yield_backlog`` folded events
    or more wait for their history write (None when it is 0: never)."""
    backlog = settings.embed_yield_backlog
    if backlog <= 0:
        return None
    return FoldFirst(lambda: fold_waiting(app) >= backlog, settings.embed_yield_max_s)


def build_worker_app(
    settings: Settings,
    bootstrap: str,
    history: ClickHouseHistory,
    vectors: tuple[VectorIndex, Embedder] | None = None,
    derivation: Derivation | None = None,
) -> faust.App:
    """The faust app with the pipeline (and, given ``vectors``, the embedding and
    vector-projection agents) registered on it, folding with ``derivation`` (its
    parameters, derived topic and state table; generation 0 when None)."""
    derivation = derivation or first(settings.memory_topic)
    app, topics = worker_app(
        settings,
        bootstrap,
        app_id=settings.group_id,
        datadir="faust",
        memory_topic=derivation.memory_topic,
        ingest=not settings.ingest_process,
    )
    keys, codec = worker_keys(settings, bootstrap)
    if not settings.ingest_process:  # else the stack's ingest child seals
        assert topics.ingest is not None
        batch = ingest_batch_size(settings, derivation.config)
        register_hop(app, settings, bootstrap, topics.ingest, keys, batch, remember=True)
    if settings.tick_interval_s > 0:
        register_ticker(
            app,
            topic=settings.events_topic,
            bootstrap=bootstrap,
            interval_s=settings.tick_interval_s,
            codec=codec,
            holds_topic=settings.clock_topic,
        )
    register(
        app,
        topics=topics,
        history=history,
        # the fold's own codec: the raw events it opens are opened once, not remembered
        codec=SealingCodec(keys.ring, max_bytes=settings.max_event_bytes, remember=False),
        config=derivation.config,
        bootstrap=bootstrap,
        batch_size=settings.batch_size,
        within=settings.flush_interval_s,
        summariser=episode_summariser(settings, history),
        keys=keys,
        state_table=derivation.state_table,
        save_every=settings.state_save_every,
        direct=settings.direct_feed,
    )
    if vectors is not None:
        index, embedder = vectors
        register_vectors(
            app,
            memory_topic=topics.memory,
            index=index,
            embedder=embedder,
            codec=codec,
            bootstrap=bootstrap,
            keys=keys,
            within=settings.relay_interval_s,
            projected=derivation.memory_starts,
            on_erased=lambda erased: history.call(lambda: history.record_vector_erasures(erased)),
            direct=settings.direct_feed,
            fold_first=fold_first(app, settings),
        )
    return app


async def prepare_log(
    settings: Settings, bootstrap: str, history: ClickHouseHistory, say: Say, memory_topic: str
) -> int:
    """Create the topics (``memory_topic``: the live derivation's) and restore the
    archive into an empty broker."""
    specs = pipeline_topics(
        settings.events_topic,
        memory_topic,
        settings.dlq_topic,
        settings.partitions,
        ingest=settings.ingest_topic,
        keys=settings.keys_topic,
        clock=settings.clock_topic,
    )
    created = await ensure_topics(bootstrap, specs)
    if created:
        say(f"created topics: {', '.join(created)}")
    archive = settings.key_archive()
    if archive is not None and (
        restored := await restore_keys(bootstrap, settings.keys_topic, archive)
    ):
        say(f"restored {restored} data key records from {archive.path}")

    def progress(done: int, total: int) -> None:
        say(f"restoring the log from the archive: {done}/{total}")

    return await restore_log(bootstrap, settings.events_topic, history, progress)


def http_api(
    settings: Settings,
    bootstrap: str,
    gate: QueryGate,
    info: dict[str, Any],
    recaller: Recaller | None,
    open_event: OpenEvent | None = None,
    config: MemoryConfig | None = None,
) -> tuple[Any, MemoryService]:
    """The HTTP API and its memory service (replays fold with ``config``); its
    publisher seals (``POST /v1/events``, recall records) when ``settings`` hold a
    master key, and its replays open with ``open_event``."""
    publisher = Memory(bootstrap=bootstrap, settings=settings)

    async def publish(events: Sequence[Event]) -> None:
        await publisher.apublish_many(events)

    service = MemoryService(
        recaller=recaller,
        history=ClickHouseHistory(gate.reader, gate.executor),
        publish=publish,
        open_event=open_event,
        config=config,
    )
    api = create_api(
        codec=Codec(max_bytes=settings.max_event_bytes, accept=RAW_TYPE_NAMES),
        publish=publish,
        gate=gate,
        info=lambda: info,
        memory=memory_router(service),
        erase=lambda subject, reason: publisher.aerase(subject, reason=reason),
    )
    return api, service


def open_vectors(settings: Settings, say: Say) -> tuple[VectorIndex, Embedder]:
    """The vector store (its live collection ensured) and the embedding model."""
    embedder: Embedder = get_embedder(settings.embedding_model, threads=settings.embed_threads)
    if settings.embed_process:  # the model's Python work off the worker's GIL
        embedder = ProcessEmbedder(embedder, threads=settings.embed_threads)
    index = open_index(settings.vectors, name=f"memories_{embedder.name}")
    index.ensure(embedder.dims)
    say(f"vectors: {settings.vectors} ({embedder.name} {embedder.version}, {embedder.dims} d)")
    # loaded while the worker starts and joins its group, not by the first event
    threading.Thread(target=embedder.load, name="engram-embedder-load", daemon=True).start()
    return index, embedder


def open_keys(settings: Settings, bootstrap: str, say: Say) -> BlockingKeyring | None:
    """The keys the stack's readers open sealed events with (None: sealing is off)."""
    master = settings.master_key()
    if master is None:
        say("sealing: off (ENGRAM_SEAL=off): events are kept in clear")
        return None
    where = "ENGRAM_MASTER_KEY" if settings.master_key_base64 else settings.master_key_file
    say(f"sealing: per-subject keys on {settings.keys_topic}, master key {where}")
    keys = BlockingKeyring(bootstrap, settings.keys_topic, master, settings.key_archive())
    keys.follow(KEY_FOLLOW_S)
    return keys


def run_up(settings: Settings, say: Say = print) -> int:
    """Run the stack until a signal; return the exit code. Without a master key in
    the environment it seals with ``$ENGRAM_HOME/master.key`` (made when missing)."""
    settings.home.mkdir(parents=True, exist_ok=True)
    settings = settings.with_home_master_key()
    broker: EmbeddedBroker | None = None
    keys: BlockingKeyring | None = None
    http: HttpThread | None = None
    index: VectorIndex | None = None
    embedder: Embedder | None = None
    rebuilds: Rebuilds | None = None
    reprocesses: Reprocesses | None = None
    ingest: IngestChild | None = None
    try:
        if settings.kafka_bootstrap:
            bootstrap = settings.kafka_bootstrap
        else:
            broker = EmbeddedBroker(settings.kafka_port, settings.home / "broker.log")
            bootstrap = broker.start()
            say(f"broker: Tansu on {bootstrap} (in memory)")
        without_pandas()  # the history's inserts are plain rows
        client = clickhouse_connect.get_client(dsn=settings.clickhouse_dsn)
        gate = QueryGate(
            client,
            QueryLimits(settings.query_timeout_s, settings.query_max_memory_mb << 20),
        )
        history = ClickHouseHistory(client, gate.executor)
        history.purged = faults.purged
        history.ensure_schema()
        say(f"history: {settings.clickhouse_dsn}")
        derivations = Derivations(history, settings.memory_topic)
        derivations.ensure()
        live = derivations.latest()
        restored = asyncio.run(prepare_log(settings, bootstrap, history, say, live.memory_topic))
        if restored:
            say(f"restored {restored} events from the archive")
        keys = open_keys(settings, bootstrap, say)
        open_event = keys.opener(max_bytes=settings.max_event_bytes) if keys else None
        index, embedder = open_vectors(settings, say)
        gated = GatedIndex(index)
        control = WorkerControl()
        parts = Parts(
            bootstrap=bootstrap,
            events_topic=settings.events_topic,
            base_topic=settings.memory_topic,
            dead_letter_topic=settings.dlq_topic,
            group=settings.group_id,
            history=history,
            derivations=derivations,
            index=gated,
            embedder=embedder,
            codec=Codec(max_bytes=settings.max_event_bytes),
            control=control,
            make_keys=(lambda: worker_keys(settings, bootstrap)) if settings.sealing else None,
            member_patience_s=member_patience(settings.group_timeouts()[0]),
            summariser=episode_summariser(settings, history),
        )
        live = asyncio.run(recover(parts))
        if restored:  # a fresh broker: the derived topic is folded again from the start
            live = live.model_copy(update={"memory_starts": {}})
        if live.generation:
            say(f"derivation: generation {live.generation} ({live.version}) on {live.memory_topic}")
        recaller = Recaller(index, embedder, config=live.config, query_cache=QUERY_CACHE)
        reprocesses = Reprocesses(parts)
        rebuilds = Rebuilds(
            bootstrap=bootstrap,
            topic=live.memory_topic,
            history=history,
            vectors=gated,
            model=embedder.name,
            open_event=open_event,
            busy=reprocesses.running,
            embedder=embedder,
            make_writer=lambda: embedding_writer(settings, bootstrap),
        )
        reprocesses.busy = rebuilds.running
        info: dict[str, Any] = {
            "http": settings.http_url,
            "kafka_bootstrap": bootstrap,
            "clickhouse": settings.clickhouse_dsn,
            "vectors": settings.vectors,
            "embedding_model": f"{embedder.name} {embedder.version}",
            "summariser": summariser_name(settings),
            "pid": os.getpid(),
            "broker_pid": broker.pid if broker else None,
            "started_at": datetime.now(UTC).isoformat(),
            "home": str(settings.home),
        }
        api, service = http_api(
            settings, bootstrap, gate, info, recaller, open_event, config=live.config
        )
        api.include_router(rebuild_router(rebuilds))
        api.include_router(reprocess_router(reprocesses))
        topics = [settings.events_topic, live.memory_topic, settings.ingest_topic]
        api.include_router(
            status_router(
                bootstrap=bootstrap,
                group=settings.group_id,
                topics=topics,
                dead_letter_topic=settings.dlq_topic,
                projections=lambda: Projections(
                    clickhouse_memory_changes=history.live_version(),
                    vectors_live=index.live_version() if index is not None else None,
                    vectors_versions=index.versions() if index is not None else [],
                ),
                erasures=history.erasures,
                topic_groups=(
                    {settings.ingest_topic: ingest_group(settings.group_id)}
                    if settings.ingest_process
                    else None
                ),
            )
        )
        api.include_router(
            letters_router(
                bootstrap=bootstrap,
                topic=settings.dlq_topic,
                opener=Opener(keys.book if keys is not None else None, open_event),
                refresh=keys.refresh if keys is not None else None,
            )
        )

        def swapped(now: Derivation) -> None:
            """A reprocess made ``now`` live: readers fold and rank with its parameters."""
            service.config = recaller.config = now.config
            rebuilds.topic = topics[1] = now.memory_topic

        parts.on_swapped = swapped
        http = HttpThread(api, settings.http_host, settings.http_port)
        http.start()
        settings.up_file.write_text(json.dumps(info, indent=2) + "\n")
        say(f"http: {settings.http_url} (OpenAPI at {settings.http_url}/docs)")
        if settings.llm_url:
            say(f"episode summaries: {summariser_name(settings)}, extractive when it fails")
        if settings.ingest_process:
            batch = ingest_batch_size(settings, live.config)
            ingest = IngestChild(settings, bootstrap, batch_size=batch, say=say)
            ingest.start()
            say(f"ingest: {settings.ingest_topic} -> {settings.events_topic} in a child process")
        say("engram is up; Ctrl-C stops it")
        while True:
            app = build_worker_app(settings, bootstrap, history, (gated, embedder), live)
            code = run_worker(app, settings.log_level, control)
            if not control.worker_ended():
                return code
            say("worker stopped for a reprocess's swap")
            if not control.wait_resumed():
                say("stopping: a signal came while the worker was stopped for a swap")
                return 0
            live = control.next_derivation() or live
            say(f"worker: generation {live.generation} ({live.version}) on {live.memory_topic}")
    finally:
        if ingest is not None:
            ingest.stop()
        if http is not None:
            http.stop()
        if reprocesses is not None:
            reprocesses.stop()
        if rebuilds is not None:
            rebuilds.stop()
        settings.up_file.unlink(missing_ok=True)
        if index is not None:
            index.close()
        if isinstance(embedder, ProcessEmbedder):
            embedder.close()
        if keys is not None:
            keys.close()
        if broker is not None:
            broker.stop()


QUERY_CACHE = 1024
"""Recent query vectors the stack's recall keeps (:class:`engram.recall.Recaller`): a
query asked again costs no embedding (about 3 ms of the worker's interpreter each)."""
