"""Wiring: the Faust app, its dedup table, and the agent that cleans raw events.

Any number of workers (``python -m svc_ingest``) join one consumer group
(``AISTACK_INGEST_APP_ID``) and share the raw topic's partitions. Each batch
goes through ``BatchCheckpoint.commit`` (``svc_ingest.checkpoint``): decide
every record's outcome (``RecordHandler``), send the clean events, dead
letters and the dedup table's new entries, and only then ack the batch.
Everything that reaches into Faust's insides is ``svc_ingest.faust_compat``.

Dedup is per raw partition, like every Faust table: a producer's retry
carries the same key, so it lands on the same partition as the original.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import AsyncIterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import faust
import mode
from faust.types import TP, EventT, Message

from shared.bus.lag import ConsumerLag, behind
from shared.bus.topics import (
    EVENTS_CLEAN,
    EVENTS_DLQ,
    EVENTS_RAW,
    RAW_MAX_MESSAGE_BYTES,
    TOPICS_BY_NAME,
    ensure_topics,
    partition_count,
)
from shared.log import get_logger
from shared.settings import KafkaSettings
from svc_ingest import id_index, sensor_bytes
from svc_ingest.checkpoint import BatchCheckpoint, BatchPipeline, Decide
from svc_ingest.cleaner import Cleaner
from svc_ingest.dedup import DedupWindow, group_partition
from svc_ingest.faust_compat import transport
from svc_ingest.faust_compat.batches import silence_message_hooks, take_batch
from svc_ingest.faust_compat.tables import TableStore
from svc_ingest.handlers import Outcome, Publish, RecordHandler
from svc_ingest.metrics import IngestMetrics
from svc_ingest.output import OutputWriter
from svc_ingest.settings import IngestSettings

log = get_logger("svc_ingest")

DEDUP_TABLE = "dedup"
#: The dedup table's RocksDB, per partition. Faust's defaults (three 64 MiB
#: memtables, a 2 GiB block cache) let a steady stream of writes grow the
#: process by each memtable until it flushes, tens of minutes at 2,000
#: events/s (tests/unit/test_ingest_store_memory.py); lookups go to the in-memory index
#: (``DedupWindow``), so the store reads only on a restore and needs little cache.
DEDUP_ROCKSDB_OPTIONS = {
    "write_buffer_size": 8 * 1024 * 1024,
    "max_write_buffer_number": 2,
    "block_cache_size": 8 * 1024 * 1024,
}
CLEAN_SHUTDOWN_MARK = "clean-shutdown"


def state_dir(settings: IngestSettings) -> Path:
    return Path(settings.common.state_dir) / "ingest" / settings.app_id


def prepare_state(settings: IngestSettings) -> bool:
    """Drop local table state that a crash may have left ahead of the changelog.

    Under exactly_once the local store takes writes of transactions that a
    crash aborts; only the changelog knows what committed. As Kafka Streams
    does, state survives only a clean shutdown (``mark_clean_shutdown``);
    otherwise it is rebuilt from the changelog. Returns whether it was wiped.
    """
    directory = state_dir(settings)
    marker = directory / CLEAN_SHUTDOWN_MARK
    wiped = False
    if settings.processing_guarantee == "exactly_once" and not marker.exists():
        for tables in directory.glob("v*/tables"):
            shutil.rmtree(tables)
            wiped = True
    marker.unlink(missing_ok=True)
    return wiped


def mark_clean_shutdown(settings: IngestSettings) -> None:
    directory = state_dir(settings)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CLEAN_SHUTDOWN_MARK).touch()


def prepare_topics(settings: IngestSettings) -> int:
    """Create the raw, clean and dead-letter topics if missing; the raw topic's partition count."""
    specs = [
        TOPICS_BY_NAME[EVENTS_RAW].named(settings.source_topic),
        TOPICS_BY_NAME[EVENTS_CLEAN].named(settings.clean_topic),
        TOPICS_BY_NAME[EVENTS_DLQ].named(settings.dlq_topic),
    ]
    ensure_topics(settings.kafka, specs)
    return partition_count(settings.kafka, settings.source_topic)


def create_app(settings: IngestSettings, metrics: IngestMetrics, *, partitions: int) -> faust.App:
    """The Faust app with the cleaning agent; ``partitions`` is the raw topic's count."""
    kafka = settings.kafka
    directory = state_dir(settings)
    directory.mkdir(parents=True, exist_ok=True)  # Faust makes only the last level
    exactly_once = settings.processing_guarantee == "exactly_once"
    app = faust.App(
        settings.app_id,
        broker=[f"{transport.SCHEME}://{server}" for server in kafka.bootstrap.split(",")],
        broker_credentials=_credentials(kafka),
        broker_client_id=kafka.client_id,
        processing_guarantee=settings.processing_guarantee,
        store=_store_url(settings.store),
        datadir=str(directory),
        web_enabled=False,
        autodiscover=False,
        topic_partitions=partitions,
        topic_replication_factor=kafka.topic_replication_factor,
        broker_commit_interval=settings.commit_interval_seconds,
        broker_session_timeout=settings.session_timeout_seconds,
        broker_heartbeat_interval=settings.session_timeout_seconds / 10,
        consumer_group_instance_id=settings.instance_id or None,
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",
        value_serializer="raw",
        # Every in-sync replica (transactional producers insist on it anyway).
        producer_acks=-1,
        producer_compression_type="lz4",
        producer_linger=0.005,
        producer_max_batch_size=512 * 1024,
        producer_max_request_size=RAW_MAX_MESSAGE_BYTES + 64 * 1024,
        consumer_max_fetch_size=4 * 1024 * 1024,
        stream_buffer_maxsize=settings.batch_max * 4,
    )
    # Faust's Monitor sensor keeps per-message statistics that nothing here
    # reads (our counters are the Prometheus ones) at a few µs per record.
    silence_message_hooks(app.monitor)
    raw_topic = app.topic(settings.source_topic, key_serializer="raw", value_serializer="raw")
    table = app.Table(
        DEDUP_TABLE,
        default=None,
        key_type=bytes,
        value_type=bytes,
        partitions=partitions,
        # A copy: Faust's RocksDB store pops keys from the mapping it is given.
        options=dict(DEDUP_ROCKSDB_OPTIONS),
    )
    dedup = DedupWindow(
        TableStore(table, group_partition), int(settings.dedup_window_seconds * 1000)
    )
    handler = RecordHandler(
        Cleaner(settings.cleaning_rules()),
        dedup,
        source_topic=settings.source_topic,
        clean_topic=settings.clean_topic,
        dlq_topic=settings.dlq_topic,
    )
    if not sensor_bytes.BUILT:
        log.warning(
            "cleaner.python_only",
            why="svc_ingest._sensor_bytes is not built (make setup builds it): "
            "every record takes the Python path, at about half the rate",
        )
    if not id_index.BUILT:
        log.warning(
            "dedup.python_index",
            why="svc_ingest._id_table is not built (make setup builds it): "
            "the dedup window's index runs in Python, a claim four times as dear",
        )
    checkpoint = BatchCheckpoint(
        app,
        partial(OutputWriter, app, settings.source_topic, exactly_once=exactly_once),
        dedup,
        table,
        source_topic=settings.source_topic,
        output_topics=(settings.clean_topic, settings.dlq_topic),
        exactly_once=exactly_once,
        expire_every_ms=int(max(1.0, min(60.0, settings.dedup_window_seconds / 10)) * 1000),
    )

    observe = _Observer(app, metrics, settings.source_topic, ConsumerLag(settings.app_id))

    async def on_rebalance_complete(sender: Any, **kwargs: Any) -> None:
        checkpoint.rebalanced()
        observe.rebalanced()

    app.on_rebalance_complete.connect(on_rebalance_complete)  # type: ignore[arg-type]

    handle_batch = handler.handle_batch

    def deciding_at(now_us: int) -> Decide:
        def decide(messages: Sequence[Message], publish: Publish) -> list[Outcome]:
            return handle_batch(messages, now_us, publish)

        return decide

    # An error that is not the input's (the broker, a revoked transaction)
    # stops the worker rather than the agent alone: a restarted agent would
    # never see the batch it dropped, and its partitions would stall. A
    # restarted worker resumes exactly from the committed state.
    @app.agent(raw_topic, name="clean", supervisor_strategy=mode.CrashingSupervisor)
    async def clean(stream: faust.StreamT[bytes]) -> None:
        # The next batch is fetched and decided while the broker takes the last.
        pipeline = BatchPipeline(checkpoint, observe)
        try:
            async for events in _batches(stream, app, settings):
                now_us = time.time_ns() // 1000
                await pipeline.put(events, deciding_at(now_us), now_us // 1000)
        finally:
            # A batch still in flight when the loop ends (it ran out, or the
            # agent was stopped while it waited for records) is finished, or
            # its error raised, before the agent ends.
            await pipeline.drain()

    return app


async def _batches(
    stream: faust.StreamT[bytes], app: faust.App, settings: IngestSettings
) -> AsyncIterator[list[EventT[Any]]]:
    """Whole batches off the agent's channel: Stream iteration costs futures per event."""
    queue = stream.channel.queue  # type: ignore[attr-defined]
    while not stream.should_stop:
        try:
            batch = await take_batch(
                queue, settings.batch_max, settings.batch_within_seconds, app=app
            )
        except StopAsyncIteration:  # how Faust's channel says the stream stopped
            return
        yield batch


class _Observer:
    """A committed batch's counters, dead-letter log lines and consumer lag.

    The lag is the shared one (``aistack_consumer_lag``, under the group id)
    and, the same number, ``aistack_ingest_consumer_lag``, which dashboards
    read from before there was a shared one. It is measured after each
    committed batch from aiokafka's highwater of the last fetch (no request).
    """

    def __init__(
        self, app: faust.App, metrics: IngestMetrics, source_topic: str, lag: ConsumerLag
    ) -> None:
        self._app = app
        self._metrics = metrics
        self._source_topic = source_topic
        self._lag = lag
        self._lagging: set[int] = set()  # partitions with an ingest_consumer_lag series
        self._outcomes = {
            k: metrics.outcomes.labels(k) for k in ("clean", "dead_letter", "duplicate")
        }

    def __call__(self, events: Sequence[EventT[Any]], outcomes: Sequence[Outcome]) -> None:
        metrics = self._metrics
        tally = {"clean": 0, "dead_letter": 0, "duplicate": 0}
        last_offsets: dict[int, int] = {}
        for event, outcome in zip(events, outcomes, strict=True):
            message = event.message
            tally[outcome.kind] += 1
            last_offsets[message.partition] = message.offset
            if outcome.kind == "dead_letter":
                metrics.dead_letters.labels(outcome.reason).inc()
                log.info(
                    "record.dead_lettered",
                    topic=message.topic,
                    partition=message.partition,
                    offset=message.offset,
                    reason=outcome.reason,
                    detail=outcome.message,
                )
        metrics.records_in.inc(len(events))
        for kind, count in tally.items():
            if count:
                self._outcomes[kind].inc(count)
        for partition, offset in last_offsets.items():
            highwater = self._app.consumer.highwater(TP(self._source_topic, partition))
            lag = None if highwater is None else behind(highwater, offset + 1)
            if lag is not None:
                self._metrics.consumer_lag.labels(str(partition)).set(lag)
                self._lagging.add(partition)
                self._lag.set(self._source_topic, partition, lag)

    def rebalanced(self) -> None:
        """Forget the lag of the partitions another worker took over."""
        source = self._source_topic
        held = {tp.partition for tp in self._app.consumer.assignment() if tp.topic == source}
        self._lag.keep([(source, partition) for partition in held])
        for partition in self._lagging - held:
            self._metrics.consumer_lag.remove(str(partition))
        self._lagging &= held


def _store_url(store: str) -> str:
    if store == "memory":
        return "memory://"
    if store == "rocksdb":
        return "rocksdb://"
    try:
        import rocksdict  # noqa: F401
    except ImportError:
        return "memory://"
    return "rocksdb://"


def _credentials(kafka: KafkaSettings) -> Any:
    config = kafka.aiokafka_config()
    if kafka.sasl_mechanism:
        return faust.SASLCredentials(
            username=kafka.sasl_username,
            password=kafka.sasl_password.get_secret_value() if kafka.sasl_password else None,
            mechanism=kafka.sasl_mechanism,
            ssl_context=config.get("ssl_context"),
        )
    if "ssl_context" in config:
        return faust.SSLCredentials(config["ssl_context"])
    return None
