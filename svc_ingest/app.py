"""Wiring: the Faust app, its dedup table, and the agent that cleans raw events.

Any number of workers (``python -m svc_ingest``) join one consumer group
(``AISTACK_INGEST_APP_ID``) and share the raw topic's partitions. Each batch:
decide every record's outcome (``RecordHandler``), send the clean events,
dead letters and the dedup table's new entries (local store and changelog),
and only then ack the batch. Under exactly_once all three go in one round
trip, as they share the source partition's transaction; under at_least_once
the dedup entries go only after the outputs they vouch for. How the sends
stay exactly-once under Faust's transactions is ``svc_ingest.output``'s
docstring; how a restart resumes at exactly the committed offsets is
``svc_ingest.faust_transport.BatchConsumer``'s.

Dedup is per raw partition, like every Faust table: a producer's retry
carries the same key, so it lands on the same partition as the original.
"""

from __future__ import annotations

import shutil
import time
import weakref
from collections.abc import AsyncIterator, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust
import mode
from faust.streams import _current_event
from faust.types import TP, EventT, TableT

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
from svc_ingest import faust_transport
from svc_ingest.cleaner import Cleaner
from svc_ingest.dedup import DedupWindow, Sightings, group_partition
from svc_ingest.handlers import RecordHandler
from svc_ingest.metrics import IngestMetrics
from svc_ingest.output import OutputWriter
from svc_ingest.settings import IngestSettings

log = get_logger("svc_ingest")

DEDUP_TABLE = "dedup"
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
        broker=[f"{faust_transport.SCHEME}://{server}" for server in kafka.bootstrap.split(",")],
        broker_credentials=_credentials(kafka),
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
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",
        value_serializer="raw",
        producer_compression_type="lz4",
        producer_linger=0.005,
        producer_max_batch_size=512 * 1024,
        producer_max_request_size=RAW_MAX_MESSAGE_BYTES + 64 * 1024,
        consumer_max_fetch_size=4 * 1024 * 1024,
        stream_buffer_maxsize=settings.batch_max * 4,
    )
    # Faust's Monitor sensor keeps per-message statistics that nothing here
    # reads (our counters are the Prometheus ones) at a few µs per record.
    monitor: Any = app.monitor
    monitor.on_message_in = monitor.on_message_out = _ignore
    raw_topic_name = settings.source_topic
    raw_topic = app.topic(settings.source_topic, key_serializer="raw", value_serializer="raw")
    table = app.Table(
        DEDUP_TABLE, default=None, key_type=bytes, value_type=bytes, partitions=partitions
    )
    changelog = table.changelog_topic.get_topic_name()
    dedup = DedupWindow(_TableStore(table), int(settings.dedup_window_seconds * 1000))
    handler = RecordHandler(
        Cleaner(settings.cleaning_rules()),
        dedup,
        source_topic=settings.source_topic,
        clean_topic=settings.clean_topic,
        dlq_topic=settings.dlq_topic,
    )
    writer = OutputWriter(app, settings.source_topic, exactly_once=exactly_once)
    outcomes = {k: metrics.outcomes.labels(k) for k in ("clean", "dead_letter", "duplicate")}
    expire_every_ms = int(max(1.0, min(60.0, settings.dedup_window_seconds / 10)) * 1000)
    upkeep = {"rebuild": True, "expired_at_ms": 0}

    async def on_rebalance_complete(sender: Any, **kwargs: Any) -> None:
        upkeep["rebuild"] = True

    app.on_rebalance_complete.connect(on_rebalance_complete)  # type: ignore[arg-type]

    def add_sightings(groups: list[Sightings]) -> None:
        for group in groups:
            writer.add(
                group.partition, changelog, group.key, group.value, [], partition=group.partition
            )

    async def send_batch() -> None:
        if exactly_once:
            # Outputs and sightings share the source partition's transaction:
            # neither commits without the other, so one round trip sends both.
            add_sightings(dedup.take_sightings())
            written = await writer.flush()
        else:
            # Outputs first, then the ids that vouch for them (see dedup.py).
            await writer.flush()
            add_sightings(dedup.take_sightings())
            written = await writer.flush()
        _persist_changelog_offsets(app, table, changelog, written, exactly_once=exactly_once)

    def rebuild_after_rebalance() -> None:
        # Streams resume only after the table's recovery, so by the first batch
        # since a rebalance the store holds every committed id of our partitions.
        if upkeep["rebuild"]:
            upkeep["rebuild"] = False
            log.info("dedup.rebuilt", ids=dedup.rebuild())

    async def expire(now_ms: int) -> None:
        if now_ms - upkeep["expired_at_ms"] < expire_every_ms:
            return
        upkeep["expired_at_ms"] = now_ms
        owned = {tp.partition for tp in app.consumer.assignment() if tp.topic == raw_topic_name}
        # Groups of partitions we no longer own are the new owner's to expire.
        forgotten = [(key, p) for key, p in dedup.expire(now_ms) if p in owned]
        if forgotten:
            await writer.use_partitions({p for _, p in forgotten}, (changelog,))
            for key, p in forgotten:
                writer.add(p, changelog, key, None, [], partition=p)
            await writer.flush()

    topics = (settings.clean_topic, settings.dlq_topic, changelog)

    # An error that is not the input's (the broker, a revoked transaction)
    # stops the worker rather than the agent alone: a restarted agent would
    # never see the batch it dropped, and its partitions would stall. A
    # restarted worker resumes exactly from the committed state.
    @app.agent(raw_topic, name="clean", supervisor_strategy=mode.CrashingSupervisor)
    async def clean(stream: faust.StreamT[bytes]) -> None:
        async for events in _batches(stream, app, settings):
            now_us = time.time_ns() // 1000
            partitions = {event.message.partition for event in events}
            tally = {"clean": 0, "dead_letter": 0, "duplicate": 0}
            last_offsets: dict[int, int] = {}
            # The gate keeps Faust's commit out from the first send to the ack.
            async with faust_transport.batch_gate(app):
                rebuild_after_rebalance()
                try:
                    await writer.use_partitions(partitions, topics)
                    for event in events:
                        message = event.message
                        partition = message.partition
                        outcome = handler.handle(
                            partition,
                            message.offset,
                            message.key,
                            message.value,
                            message.headers,
                            now_us,
                        )
                        tally[outcome.kind] += 1
                        last_offsets[partition] = message.offset
                        if outcome.kind == "dead_letter":
                            metrics.dead_letters.labels(outcome.reason).inc()
                            log.info(
                                "record.dead_lettered",
                                topic=message.topic,
                                partition=partition,
                                offset=message.offset,
                                reason=outcome.reason,
                                detail=outcome.message,
                            )
                        if outcome.topic:
                            writer.add(
                                partition,
                                outcome.topic,
                                outcome.key,
                                outcome.value,
                                outcome.headers,
                            )
                    await send_batch()
                except BaseException:
                    dedup.discard_pending()
                    raise
                faust_transport.ack_batch(events, app)
                await expire(now_us // 1000)
            metrics.records_in.inc(len(events))
            for kind, count in tally.items():
                if count:
                    outcomes[kind].inc(count)
            for partition, offset in last_offsets.items():
                highwater = app.consumer.highwater(TP(settings.source_topic, partition))
                if highwater is not None:
                    metrics.consumer_lag.labels(str(partition)).set(max(highwater - offset - 1, 0))

    return app


async def _batches(
    stream: faust.StreamT[bytes], app: faust.App, settings: IngestSettings
) -> AsyncIterator[list[EventT[Any]]]:
    """Whole batches off the agent's channel: Stream iteration costs futures per event."""
    queue = stream.channel.queue  # type: ignore[attr-defined]
    while not stream.should_stop:
        try:
            batch = await faust_transport.take_batch(
                queue, settings.batch_max, settings.batch_within_seconds, app=app
            )
        except StopAsyncIteration:  # how Faust's channel says the stream stopped
            return
        yield batch


def _persist_changelog_offsets(
    app: faust.App,
    table: TableT[Any, Any],
    changelog: str,
    written: list[Any],
    *,
    exactly_once: bool,
) -> None:
    """What Faust's own changelog callback does: RocksDB recovery starts after these."""
    newest: dict[TP, int] = {}
    for metadata in written:
        if metadata.topic != changelog:
            continue
        tp = TP(metadata.topic, metadata.partition)
        newest[tp] = max(newest.get(tp, -1), metadata.offset)
    store: Any = table.data  # a faust StoreT; TableT types it as a MutableMapping
    for tp, offset in newest.items():
        if exactly_once:
            app.tables.persist_offset_on_commit(store, tp, offset)
        else:
            store.set_persisted_offset(tp, offset)


class _TableStore(MutableMapping[bytes, bytes]):
    """A Faust table's local store as the dedup store; the changelog is written apart.

    Keys name their partition (``dedup.group_key``): a RocksDB store keeps one
    database per partition and finds it through Faust's current event.
    """

    def __init__(self, table: TableT[Any, Any]) -> None:
        self._data = table.data

    def __getitem__(self, key: bytes) -> bytes:
        with _in_partition(group_partition(key)):
            value = self._data.get(key)
        if value is None:
            raise KeyError(key)
        return value  # type: ignore[no-any-return]

    def __setitem__(self, key: bytes, value: bytes) -> None:
        with _in_partition(group_partition(key)):
            self._data[key] = value

    def __delitem__(self, key: bytes) -> None:
        with _in_partition(group_partition(key)):
            del self._data[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(list(self._data.keys()))

    def __len__(self) -> int:
        return len(self._data)


@dataclass(frozen=True)
class _PartitionMessage:
    partition: int


@dataclass(frozen=True)
class _PartitionEvent:
    """Just enough of a Faust event for a store to pick the partition's database."""

    message: _PartitionMessage


@contextmanager
def _in_partition(partition: int) -> Iterator[None]:
    event = _PartitionEvent(_PartitionMessage(partition))
    token = _current_event.set(weakref.ref(event))  # type: ignore[arg-type]
    try:
        yield
    finally:
        _current_event.reset(token)


def _ignore(*args: Any) -> None:
    return None


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
