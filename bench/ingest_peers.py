"""The peers ``bench.ingest_throughput`` measures svc_ingest's worker against.

Each runs in a process of its own, as the worker does, configured as the
worker is: by ``AISTACK_INGEST_*`` (``IngestSettings``: source, clean and
dead-letter topics, ``processing_guarantee``, ``commit_interval_seconds``,
the cleaning rules). ``python -m bench.ingest_peers PEER --count N`` reads
the source topic from the earliest offset and prints ``rate R``: records
per second from the first record it sees to the ``count``-th. Faust's and
Quix's clocks stop once that record's outputs are handed to their producer;
the passthrough's and the worker's (its records-in counter) only once the
broker acknowledged them: that difference favours Faust and Quix.

* ``passthrough``: bare aiokafka on uvloop, the upper bound. Forwards every
  record unchanged (key, value, headers) to the clean topic, through one
  batch builder per destination partition per fetch (``create_batch`` /
  ``send_batch``, each builder closed first so that it does not linger, as
  svc_ingest's ``OutputWriter``), with the worker's
  producer settings (lz4 with the fast compressor, 5 ms linger, 512 KiB
  batches, 4 MiB fetches). It
  commits once per ``commit_interval_seconds`` under the worker's
  guarantee: exactly_once, a transactional producer that sends the offsets
  into its transaction (``send_offsets_to_transaction``) and commits it;
  at_least_once, a consumer commit after the interval's sends are
  acknowledged. No cleaning, no dedup, no dead letters.
* ``stock_faust``: what a user writing a Faust agent writes. Stock
  faust-streaming (``kafka://`` transport), uvloop, one agent on the source
  topic (raw serializers), ``Topic.send`` per output record, the worker's
  guarantee and ``broker_commit_interval``, its producer and fetch settings,
  in-memory tables. Each record goes through ``RecordOutputs``: the same
  ``Cleaner.clean_all`` and the same clean events and dead letters
  svc_ingest publishes. No dedup table: the worker does more work than
  this peer (it keeps and changelogs every event id of its window).
* ``quixstreams``: Quix Streams 3 ``Application`` with the matching
  ``processing_guarantee``, ``commit_interval``, ``auto_offset_reset=
  "earliest"`` and the same producer and fetch settings; one
  StreamingDataFrame applies ``RecordOutputs`` (expanded: one row per output
  record) and produces each row to the clean or dead-letter topic. Quix is
  synchronous (a poll loop over librdkafka, no event loop). No dedup either.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench import profiling
from bench.harness import ROOT, python_module
from shared.settings import load_settings
from svc_ingest.cleaner import Cleaner
from svc_ingest.dedup import DedupWindow
from svc_ingest.faust_compat.lz4 import use_fast_lz4
from svc_ingest.handlers import RecordHandler
from svc_ingest.settings import IngestSettings

RATE_PREFIX = "rate "
_RATE_LINE = re.compile(rf"{RATE_PREFIX}(\d+(?:\.\d*)?(?:e[+-]?\d+)?)$", re.MULTILINE)

# svc_ingest.app's producer and fetch settings, which every peer gets too;
# the aiokafka peers compress LZ4 as the worker does (``use_fast_lz4``: the
# fast compressor, as Quix's librdkafka does).
COMPRESSION = "lz4"
LINGER_MS = 5
MAX_BATCH_BYTES = 512 * 1024
MAX_FETCH_BYTES = 4 * 1024 * 1024

_QUIX_GUARANTEE = {"exactly_once": "exactly-once", "at_least_once": "at-least-once"}

Headers = list[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class Output:
    """One record to publish: a clean event or a dead letter."""

    topic: str
    key: bytes | None
    value: bytes
    headers: Headers


class Forgetful(DedupWindow):
    """A dedup window that remembers nothing: every event is a first sighting."""

    def __init__(self) -> None:
        super().__init__({}, 0)

    def first_sighting(self, event_id: bytes, now_ms: int, partition: int, offset: int) -> bool:
        return True


class RecordOutputs:
    """The records svc_ingest publishes for one raw record, without its dedup:
    svc_ingest's own ``RecordHandler`` (``Cleaner.clean_all``; each clean event
    with its source position and ingest time, keyed by entity, envelope
    headers; or one DeadLetter with the reason and the original bytes and
    headers) over a dedup window that remembers nothing."""

    def __init__(self, settings: IngestSettings) -> None:
        self._handler = RecordHandler(
            Cleaner(settings.cleaning_rules()),
            Forgetful(),
            source_topic=settings.source_topic,
            clean_topic=settings.clean_topic,
            dlq_topic=settings.dlq_topic,
        )

    def __call__(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | Mapping[str, bytes] | None,
        now_us: int,
    ) -> list[Output]:
        outcome = self._handler.handle(partition, offset, key, value, headers, now_us)
        assert outcome.value is not None  # nothing is a duplicate to a forgetful window
        first = Output(outcome.topic, outcome.key, outcome.value, outcome.headers)
        return [first, *(Output(outcome.topic, *extra) for extra in outcome.more)]


class RateClock:
    """Records per second from the first record a peer sees to its ``count``-th."""

    def __init__(self, count: int, clock: Callable[[], float] = time.perf_counter) -> None:
        self._count = count
        self._clock = clock
        self._started: float | None = None
        self._seen = 0
        self.rate: float | None = None

    def start(self) -> None:
        """A record arrived: the clock starts at the first."""
        if self._started is None:
            self._started = self._clock()

    def handled(self, records: int) -> float | None:
        """``records`` more are handled; the rate, once only: when ``count`` is reached."""
        if self._started is None:
            raise RuntimeError("handled() before start()")
        self._seen += records
        if self.rate is not None or self._seen < self._count:
            return None
        self.rate = self._seen / max(self._clock() - self._started, 1e-9)
        return self.rate


def now_us() -> int:
    return time.time_ns() // 1000


# ---- passthrough ----


async def passthrough(settings: IngestSettings, count: int) -> float:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.partitioner import DefaultPartitioner
    from aiokafka.structs import TopicPartition

    use_fast_lz4()
    exactly_once = settings.processing_guarantee == "exactly_once"
    config = settings.kafka.aiokafka_config()
    group = f"{settings.app_id}-passthrough"
    target = settings.clean_topic
    consumer = AIOKafkaConsumer(
        settings.source_topic,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed" if exactly_once else "read_uncommitted",
        max_partition_fetch_bytes=MAX_FETCH_BYTES,
        **config,
    )
    producer = AIOKafkaProducer(
        compression_type=COMPRESSION,
        linger_ms=LINGER_MS,
        max_batch_size=MAX_BATCH_BYTES,
        acks="all",
        enable_idempotence=exactly_once,
        transactional_id=f"{group}-tx" if exactly_once else None,
        **config,
    )
    await consumer.start()
    await producer.start()
    offsets: dict[TopicPartition, int] = {}

    async def commit() -> None:
        if exactly_once:
            if offsets:
                await producer.send_offsets_to_transaction(offsets, group)
            await producer.commit_transaction()
        elif offsets:
            await consumer.commit(offsets)
        offsets.clear()

    try:
        partitions = sorted(await producer.partitions_for(target))
        partition_of: dict[bytes | None, int] = {}
        clock = RateClock(count)
        if exactly_once:
            await producer.begin_transaction()
        committed_at = time.monotonic()
        rate = None
        while rate is None:
            fetched = await consumer.getmany(timeout_ms=1000, max_records=settings.batch_max)
            if not fetched:
                continue
            clock.start()
            builders: dict[int, Any] = {}
            sent = []
            handled = 0
            for tp, records in fetched.items():
                for record in records:
                    key, value, headers = record.key, record.value, list(record.headers)
                    partition = partition_of.get(key)
                    if partition is None:
                        partition = partition_of[key] = DefaultPartitioner()(
                            key, partitions, partitions
                        )
                    builder = builders.get(partition)
                    if builder is None:
                        builder = builders[partition] = producer.create_batch()
                    if (
                        builder.append(timestamp=None, key=key, value=value, headers=headers)
                        is not None
                    ):
                        continue
                    if builder.record_count():  # full: send it, start the next
                        builder.close()  # closed, it does not linger (as the worker's)
                        sent.append(await producer.send_batch(builder, target, partition=partition))
                        builder = builders[partition] = producer.create_batch()
                        if (
                            builder.append(timestamp=None, key=key, value=value, headers=headers)
                            is not None
                        ):
                            continue
                    sent.append(  # larger than a batch: alone
                        await producer.send(
                            target, value, key=key, partition=partition, headers=headers
                        )
                    )
                handled += len(records)
                offsets[tp] = records[-1].offset + 1
            for partition, builder in builders.items():
                if builder.record_count():
                    builder.close()
                    sent.append(await producer.send_batch(builder, target, partition=partition))
            await asyncio.gather(*sent)
            rate = clock.handled(handled)
            if time.monotonic() - committed_at >= settings.commit_interval_seconds:
                await commit()
                if exactly_once:
                    await producer.begin_transaction()
                committed_at = time.monotonic()
        await commit()
        return rate
    finally:
        await consumer.stop()
        await producer.stop()


def run_passthrough(settings: IngestSettings, count: int) -> float:
    import uvloop

    return uvloop.run(passthrough(settings, count))


# ---- stock Faust ----


def stock_faust(settings: IngestSettings, count: int) -> float:
    import faust
    import uvloop

    uvloop.install()
    use_fast_lz4()
    kafka = settings.kafka
    outputs = RecordOutputs(settings)
    clock = RateClock(count)
    with tempfile.TemporaryDirectory(prefix="bench-faust-") as datadir:
        app = faust.App(
            f"{settings.app_id}-faust",
            broker=[f"kafka://{server}" for server in kafka.bootstrap.split(",")],
            processing_guarantee=settings.processing_guarantee,
            store="memory://",
            datadir=datadir,
            web_enabled=False,
            autodiscover=False,
            topic_replication_factor=kafka.topic_replication_factor,
            broker_commit_interval=settings.commit_interval_seconds,
            consumer_auto_offset_reset="earliest",
            key_serializer="raw",
            value_serializer="raw",
            producer_compression_type=COMPRESSION,
            producer_linger=LINGER_MS / 1000,
            producer_max_batch_size=MAX_BATCH_BYTES,
            consumer_max_fetch_size=MAX_FETCH_BYTES,
        )
        targets = {name: app.topic(name) for name in (settings.clean_topic, settings.dlq_topic)}

        @app.agent(app.topic(settings.source_topic))
        async def clean(stream: faust.StreamT[bytes]) -> None:
            async for event in stream.events():
                clock.start()
                message = event.message
                for out in outputs(
                    message.partition,
                    message.offset,
                    message.key,
                    message.value,
                    message.headers,
                    now_us(),
                ):
                    await targets[out.topic].send(key=out.key, value=out.value, headers=out.headers)
                if clock.handled(1) is not None:
                    # The worker's own SIGTERM path: stop the agent, commit, exit.
                    os.kill(os.getpid(), signal.SIGTERM)

        worker = faust.Worker(
            app, loglevel="warn", quiet=True, redirect_stdouts=False, override_logging=False
        )
        try:
            worker.execute_from_commandline()
        except SystemExit:
            pass
    if clock.rate is None:
        raise RuntimeError("stock Faust stopped before its count-th record")
    return clock.rate


# ---- Quix Streams ----


def quixstreams(settings: IngestSettings, count: int) -> float:
    from quixstreams import Application, message_context
    from quixstreams.kafka.configuration import ConnectionConfig
    from quixstreams.models.serializers import SerializationContext, Serializer

    class OutputValue(Serializer):
        """An ``Output`` row's value; its key and headers are set apart."""

        def __call__(self, value: Output, ctx: SerializationContext) -> bytes:
            return value.value

    outputs = RecordOutputs(settings)
    clock = RateClock(count)

    def on_processed(topic: str, partition: int, offset: int) -> None:
        if clock.handled(1) is not None:
            app.stop()  # commits the checkpoint on the way out

    with tempfile.TemporaryDirectory(prefix="bench-quix-") as state_dir:
        app = Application(
            broker_address=ConnectionConfig.from_librdkafka_dict(
                settings.kafka.client_config(), ignore_extras=True
            ),
            consumer_group=f"{settings.app_id}-quix",
            auto_offset_reset="earliest",
            commit_interval=settings.commit_interval_seconds,
            processing_guarantee=_QUIX_GUARANTEE[settings.processing_guarantee],  # type: ignore[arg-type]
            producer_extra_config={
                "compression.type": COMPRESSION,
                "linger.ms": LINGER_MS,
                "batch.size": MAX_BATCH_BYTES,
            },
            consumer_extra_config={"max.partition.fetch.bytes": MAX_FETCH_BYTES},
            state_dir=state_dir,
            use_changelog_topics=False,
            on_message_processed=on_processed,
            loglevel="WARNING",
        )
        source = app.topic(
            settings.source_topic, key_deserializer="bytes", value_deserializer="bytes"
        )
        sinks = {
            name: app.topic(name, key_serializer="bytes", value_serializer=OutputValue())
            for name in (settings.clean_topic, settings.dlq_topic)
        }

        def clean(value: bytes, key: bytes, timestamp: int, headers: Any) -> list[Output]:
            clock.start()
            context = message_context()
            return outputs(context.partition, context.offset, key, value, headers, now_us())

        sdf = app.dataframe(source)
        sdf = sdf.apply(clean, metadata=True, expand=True)
        sdf = sdf.set_headers(lambda out, key, timestamp, headers: out.headers)
        sdf.to_topic(lambda out, key, timestamp, headers: sinks[out.topic], key=lambda out: out.key)
        app.run(sdf)
    if clock.rate is None:
        raise RuntimeError("Quix Streams stopped before its count-th record")
    return clock.rate


RUNNERS: dict[str, Callable[[IngestSettings, int], float]] = {
    "passthrough": run_passthrough,
    "stock_faust": stock_faust,
    "quixstreams": quixstreams,
}
PEERS = tuple(RUNNERS)


# ---- running one in a process of its own ----


def run_peer(name: str, env: Mapping[str, str], count: int, *, timeout: float = 600) -> float:
    """``python -m bench.ingest_peers name``; its rate. Under ``--profile``
    py-spy samples it (``bench.profiling``)."""
    with subprocess.Popen(
        python_module("bench.ingest_peers", name, "--count", str(count)),
        cwd=ROOT,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as peer:
        profiler = profiling.active()
        if profiler is not None:
            profiler.attach(peer.pid, f"peer_{name}")
        try:
            stdout, stderr = peer.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            peer.kill()
            raise
    rate = read_rate(stdout)
    if peer.returncode != 0 or rate is None:
        raise RuntimeError(f"peer {name} exited {peer.returncode}:\n{stderr[-3000:]}")
    return rate


def read_rate(stdout: str) -> float | None:
    """The last ``rate R`` a peer printed. Faust's worker writes terminal
    escapes to stdout as it exits, on the line the rate starts."""
    found = _RATE_LINE.findall(stdout)
    return float(found[-1]) if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=PEERS)
    parser.add_argument("--count", type=int, required=True)
    profiling.add_flag(parser, "ingest_peers")
    args = parser.parse_args()
    settings = load_settings(IngestSettings)
    from svc_ingest.app import prepare_topics

    prepare_topics(settings)  # the worker's clean and dead-letter topic specs
    rate = RUNNERS[args.peer](settings, args.count)
    print(f"{RATE_PREFIX}{rate}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
