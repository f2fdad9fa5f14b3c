"""svc_ingest.faust_compat: the version gate, the highwater wait of table recovery,
its wait at a changelog's end, aiokafka's LZ4 compressor and the transactions
committed side by side."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError, ProducerFenced
from faust.types import TP

from svc_ingest.faust_compat import SUPPORTED, UnsupportedFaust, check_versions
from svc_ingest.faust_compat.producer import Producer
from svc_ingest.faust_compat.recovery import HighwaterWait, settled_highwaters, unsettled

CHANGELOG = [TP("ingest-dedup-changelog", 0), TP("ingest-dedup-changelog", 1)]
PERSISTED: dict[TP, int | None] = {CHANGELOG[0]: 1176, CHANGELOG[1]: None}
REAL = {CHANGELOG[0]: 1177, CHANGELOG[1]: 40}


class FakeBroker:
    """Answers highwater reads from a script: a mapping, or an error to raise."""

    def __init__(self, *answers: Mapping[TP, int | None] | Exception) -> None:
        self.answers = list(answers)
        self.reads = 0

    async def read(self, partitions: Collection[TP]) -> Mapping[TP, int | None]:
        self.reads += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return {tp: answer.get(tp) for tp in partitions}


class FakeTime:
    """A clock that only sleeping moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def settle(broker: FakeBroker, time: FakeTime, deadline: float = 60.0) -> Mapping[TP, int | None]:
    return asyncio.run(
        settled_highwaters(
            broker.read,
            CHANGELOG,
            PERSISTED,
            HighwaterWait(deadline_seconds=deadline),
            clock=time.clock,
            sleep=time.sleep,
        )
    )


def test_unknown_or_short_highwaters_are_unsettled() -> None:
    assert unsettled(REAL, CHANGELOG, PERSISTED) == []
    # None: no fetch response yet; -1: what a read_uncommitted LSO says.
    assert unsettled({CHANGELOG[0]: None, CHANGELOG[1]: -1}, CHANGELOG, PERSISTED) == CHANGELOG
    # The highwater is the next offset: 1176 persisted needs at least 1177.
    assert unsettled({**REAL, CHANGELOG[0]: 1176}, CHANGELOG, PERSISTED) == [CHANGELOG[0]]
    # An empty changelog with nothing persisted is settled at 0.
    assert unsettled({**REAL, CHANGELOG[1]: 0}, CHANGELOG, PERSISTED) == []


def test_a_cold_broker_is_read_again_until_it_reports_real_highwaters() -> None:
    broker = FakeBroker(
        {CHANGELOG[0]: None, CHANGELOG[1]: None},
        KafkaTimeoutError(),
        {CHANGELOG[0]: 0, CHANGELOG[1]: 40},
        REAL,
    )
    time = FakeTime()

    assert settle(broker, time) == REAL
    assert broker.reads == 4
    # Backoff doubles between reads.
    assert time.sleeps == [0.25, 0.5, 1.0]


def test_after_the_deadline_faust_gets_the_last_answer_to_judge() -> None:
    short = {CHANGELOG[0]: 5, CHANGELOG[1]: 40}  # the changelog really lost data
    broker = FakeBroker(short)
    time = FakeTime()

    assert settle(broker, time, deadline=10.0) == short
    assert time.now == pytest.approx(10.0)
    assert broker.reads > 3


def test_a_broker_that_never_answers_raises_its_error_at_the_deadline() -> None:
    broker = FakeBroker(KafkaTimeoutError())
    time = FakeTime()

    with pytest.raises(KafkaTimeoutError):
        settle(broker, time, deadline=5.0)
    assert time.now == pytest.approx(5.0)


def test_the_installed_versions_are_the_supported_ones() -> None:
    check_versions()  # what importing the package did; must not raise here


def test_another_faust_version_fails_with_one_line_naming_it() -> None:
    installed: dict[str, str | None] = {name: known[0] for name, known in SUPPORTED.items()}
    installed["faust-streaming"] = "0.16.0"

    with pytest.raises(UnsupportedFaust) as caught:
        check_versions(installed)
    message = str(caught.value)
    assert "\n" not in message
    assert "faust-streaming" in message and "0.16.0" in message and "0.15.3" in message


def test_a_missing_dependency_is_named() -> None:
    installed: dict[str, str | None] = {name: known[0] for name, known in SUPPORTED.items()}
    installed["aiokafka"] = None

    with pytest.raises(UnsupportedFaust, match=r"aiokafka .* found none"):
        check_versions(installed)


def test_recovery_waits_on_a_quiet_changelog_no_longer_than_the_cap() -> None:
    """Faust's recovery loop waits ``asyncio.wait_for(queue.get(), timeout=5.0)``;
    once the transport is imported its module sees the capped waits."""
    import faust.tables.recovery as faust_recovery

    from svc_ingest.faust_compat import changelog_idle, transport  # noqa: F401

    async def quiet_changelog() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(asyncio.TimeoutError):
            await faust_recovery.asyncio.wait_for(asyncio.Event().wait(), timeout=5.0)
        return loop.time() - started

    waited = asyncio.run(quiet_changelog())

    assert changelog_idle.IDLE_WAIT_SECONDS <= waited < 5.0
    # Everything else of asyncio is asyncio's own.
    assert faust_recovery.asyncio.sleep is asyncio.sleep
    assert faust_recovery.asyncio.TimeoutError is asyncio.TimeoutError


class _Cluster:
    def __init__(self, partitions: set[int]) -> None:
        self.partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions


class _Producer:
    """What ``partition_for`` reads of an aiokafka producer: its client's
    cluster metadata and its (real) default partitioner."""

    def __init__(self, partitions: set[int]) -> None:
        from aiokafka.partitioner import DefaultPartitioner

        self.client = type("Client", (), {"cluster": _Cluster(partitions)})()
        self._partitioner = DefaultPartitioner()


def test_a_key_keeps_its_partition_while_a_lagging_broker_lists_none() -> None:
    """On a cluster, a metadata answer from a broker that has only just heard
    of a topic lists no partitions; the key's partition must not move (nor
    divide by zero)."""
    from svc_ingest.faust_compat.producer import partition_for

    keys = [f"device-{i}".encode() for i in range(50)]
    full = [partition_for(_Producer({0, 1, 2}), "clean", key, 3) for key in keys]  # type: ignore[arg-type]
    lagging = [partition_for(_Producer(set()), "clean", key, 3) for key in keys]  # type: ignore[arg-type]

    assert lagging == full
    assert set(full) == {0, 1, 2}
    # A topic that grew is partitioned over its new count.
    grown = [partition_for(_Producer(set(range(6))), "clean", key, 3) for key in keys]  # type: ignore[arg-type]
    assert max(grown) > 2


LZ4_CODEC = 3  # the record batch attribute's codec bits for LZ4


def _lz4_batch(records: list[tuple[bytes, bytes, list[tuple[str, bytes]]]]) -> bytes:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=LZ4_CODEC,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for offset, (key, value, headers) in enumerate(records):
        builder.append(offset, timestamp=None, key=key, value=value, headers=headers)
    return bytes(builder.build())


def test_the_transport_has_aiokafka_compress_lz4_with_the_fast_compressor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import aiokafka.record.default_records as python_records
    from aiokafka import codec
    from aiokafka.record._crecords import default_records as c_records

    from svc_ingest.faust_compat import lz4, transport

    for module in (python_records, c_records):  # as aiokafka has it
        monkeypatch.setattr(module, "lz4_encode", codec.lz4_encode)
    transport.register_scheme()
    assert python_records.lz4_encode is lz4.fast_lz4_encode
    assert c_records.lz4_encode is lz4.fast_lz4_encode
    # The builder aiokafka's producer uses looks the name up when it compresses.
    calls: list[int] = []

    def counted(payload: bytes) -> bytes:
        calls.append(len(payload))
        return lz4.fast_lz4_encode(payload)

    monkeypatch.setattr(c_records, "lz4_encode", counted)
    _lz4_batch([(b"k", b"v" * 100, [])])
    assert len(calls) == 1


def test_a_batch_compressed_fast_reads_back_whole_and_smaller_than_it_was() -> None:
    from aiokafka.record.default_records import DefaultRecordBatch

    from svc_ingest.faust_compat import lz4

    lz4.use_fast_lz4()
    records = [
        (
            f"device-{i % 7}".encode(),
            f'{{"reading": {i}, "unit": "C"}}'.encode() * 4,
            [("id", b"%032x" % i)],
        )
        for i in range(2_000)
    ]
    batch = _lz4_batch(records)
    uncompressed = sum(len(key) + len(value) + 40 for key, value, _ in records)
    assert len(batch) < uncompressed / 3
    read = [
        (record.key, record.value, list(record.headers))
        for record in DefaultRecordBatch(bytearray(batch))
    ]
    assert read == records


class FakeTransaction:
    """A transactional producer whose commit waits at ``barrier`` (every commit
    must reach it before any ends) and records what it was asked, or fails."""

    def __init__(self, log: list[str], name: str, barrier: asyncio.Barrier, fail: bool) -> None:
        self.log, self.name, self.barrier, self.fail = log, name, barrier, fail

    async def send_offsets_to_transaction(self, offsets: Mapping[TP, int], group: str) -> None:
        self.log.append(f"{self.name} offsets {sorted(o for o in offsets.values())}")

    async def commit_transaction(self) -> None:
        await self.barrier.wait()
        if self.fail:
            raise ProducerFenced()
        self.log.append(f"{self.name} committed")

    async def begin_transaction(self) -> None:
        self.log.append(f"{self.name} began")


def _producer_over(transactions: dict[str, FakeTransaction]) -> Producer:
    producer = object.__new__(Producer)  # no app or transport: only the commit is used
    producer._trn_locks = {tid: asyncio.Lock() for tid in transactions}
    producer._transaction_producers = transactions
    return producer


def test_the_source_partitions_transactions_commit_side_by_side() -> None:
    async def main() -> list[str]:
        log: list[str] = []
        barrier = asyncio.Barrier(3)  # one after another, the first would wait forever
        transactions = {
            f"ingest-clean-{p}": FakeTransaction(log, f"p{p}", barrier, fail=False)
            for p in range(3)
        }
        offsets = {tid: {TP("raw", p): 10 + p} for p, tid in enumerate(transactions)}
        async with asyncio.timeout(5):
            await _producer_over(transactions).commit_transactions(offsets, "ingest")
        return log

    log = asyncio.run(main())
    for p in range(3):
        # Each transaction in Faust's order: its offsets, its commit, the next begun.
        mine = [entry for entry in log if entry.startswith(f"p{p} ")]
        assert mine == [f"p{p} offsets [{10 + p}]", f"p{p} committed", f"p{p} began"]


def test_a_failed_commit_is_raised_after_the_others_have_committed() -> None:
    async def main() -> tuple[list[str], BaseException | None]:
        log: list[str] = []
        barrier = asyncio.Barrier(2)
        transactions = {
            "ingest-clean-0": FakeTransaction(log, "p0", barrier, fail=True),
            "ingest-clean-1": FakeTransaction(log, "p1", barrier, fail=False),
        }
        offsets = {tid: {TP("raw", p): 5} for p, tid in enumerate(transactions)}
        try:
            async with asyncio.timeout(5):
                await _producer_over(transactions).commit_transactions(offsets, "ingest")
        except ProducerFenced as exc:
            return log, exc
        return log, None

    log, raised = asyncio.run(main())
    assert isinstance(raised, ProducerFenced)
    assert "p1 committed" in log and "p1 began" in log
    assert "p0 committed" not in log


def test_the_transport_commits_with_the_side_by_side_producer() -> None:
    from svc_ingest.faust_compat.transport import Transport

    assert Transport.Producer is Producer


def test_a_batch_is_stale_once_the_consumer_generation_moved_on() -> None:
    from types import SimpleNamespace

    from svc_ingest.faust_compat.batches import is_stale

    def batch(generation: int) -> list[Any]:
        return [SimpleNamespace(message=SimpleNamespace(generation_id=generation))] * 3

    app: Any = SimpleNamespace(consumer_generation_id=7)
    assert not is_stale(batch(7), app)
    assert is_stale(batch(6), app)
    assert not is_stale([], app)


def test_a_batch_acked_at_once_leaves_the_consumer_as_faust_acking_each_would() -> None:
    """``ack_batch`` does Message.ack and Consumer.ack's bookkeeping under
    one lock for the batch: on a real faust consumer (never started), the
    same messages become committable, in the same order, as when each is
    acked faust's way; held twice, acked already, below the committed
    offset, on a topic without acks, or of a subclass with its own ack."""
    from types import SimpleNamespace

    import faust
    from faust.types.tuples import ConsumerMessage, Message

    from svc_ingest.faust_compat.batches import ack_batch

    class OwnAck(ConsumerMessage):
        pass

    def scene() -> tuple[Any, list[Any], list[Any]]:
        app: Any = faust.App("ack-batch", broker="kafka://127.0.0.1:1")
        consumer = app.consumer
        app.topics._acking_topics.add("raw")  # as for every topic an agent reads
        raw, other = TP("raw", 0), TP("raw", 1)
        consumer._committed_offset[raw] = 3
        consumer._committed_offset[other] = None
        messages: list[Message] = []
        for i, (tp, cls) in enumerate(
            [(raw, ConsumerMessage)] * 8 + [(other, OwnAck)] * 2 + [(TP("untracked", 0), Message)]
        ):
            message = cls(tp.topic, tp.partition, i, 0.0, 0, [], b"k", b"v", None, tp=tp)
            message.refcount = 1
            consumer._unacked_messages.add(message)
            messages.append(message)
        messages[5].refcount = 2  # held by a second stream: stays unacked
        messages[6].acked = True  # acked already
        seen: list[int] = []

        class Seen(faust.Sensor):
            def on_message_out(self, tp: TP, offset: int, message: Message) -> None:
                seen.append(offset)

        app.sensors.add(Seen())
        events = [SimpleNamespace(message=m) for m in messages]
        return app, events, seen

    def state(app: Any) -> tuple[Any, ...]:
        consumer = app.consumer
        return (
            {tp: list(offsets) for tp, offsets in consumer._acked.items()},
            {tp: set(index) for tp, index in consumer._acked_index.items()},
            consumer._n_acked,
            sorted(m.offset for m in consumer._unacked_messages),
        )

    faust_app, faust_events, faust_seen = scene()
    on_message_out = faust_app.sensors.on_message_out
    faust_acked = 0
    for event in faust_events:  # faust's own way, one event at a time
        if event.message.ack(faust_app.consumer):
            faust_acked += 1
            on_message_out(event.message.tp, event.message.offset, event.message)
    app, events, seen = scene()
    # 3, 4 and 7 (0-2 are below the committed offset), 8, 9 and the untracked 10.
    assert ack_batch(events, app) == faust_acked == 6
    assert state(app) == state(faust_app)
    assert seen == faust_seen
    assert [e.message.acked for e in events] == [m.message.acked for m in faust_events]
    assert [e.message.refcount for e in events] == [m.message.refcount for m in faust_events]


def _fetched(records: list[tuple[int, bytes | None, bytes | None, list[Any]]]) -> Any:
    """A real aiokafka PartitionRecords over one record batch, as a fetch
    response brings it: (timestamp, key, value, headers) each."""
    from aiokafka.consumer.fetcher import PartitionRecords
    from aiokafka.record.default_records import DefaultRecordBatchBuilder
    from aiokafka.record.memory_records import MemoryRecords
    from aiokafka.structs import TopicPartition

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for offset, (timestamp, key, value, headers) in enumerate(records):
        builder.append(offset, timestamp=timestamp, key=key, value=value, headers=headers)
    tp = TopicPartition("raw", 2)
    return tp, PartitionRecords(
        tp, MemoryRecords(bytes(builder.build())), [], 0, None, None, True, "read_uncommitted"
    )


RECORDS: list[tuple[int, bytes | None, bytes | None, list[Any]]] = [
    (1_700_000_000_123, b"sensor-1", b'{"v": 1}', [("content-type", b"application/json")]),
    (1_700_000_000_456, None, b"x", []),
    (1_700_000_000_789, b"k", None, [("a", b"1"), ("b", None)]),
]


def test_a_fetched_record_becomes_the_message_faust_makes_of_aiokafkas_record() -> None:
    """``fetched_message`` makes in one step the message that aiokafka's
    ConsumerRecord and then Faust's ``_to_message`` make in two: every
    field the same (headers as the record's list, not aiokafka's tuple)."""
    from types import SimpleNamespace

    from faust.transport.drivers.aiokafka import Consumer
    from faust.types.tuples import ConsumerMessage

    from svc_ingest.faust_compat.consumer import fetched_message

    faust_consumer: Any = SimpleNamespace(app=SimpleNamespace(consumer_generation_id=None))
    tp, stock = _fetched(RECORDS)
    _, fused = _fetched(RECORDS)
    fused._consumer_record = fetched_message
    # Not set by either: span (a tracer's), time_in/out/total.
    unset = ("__weakref__", "headers", "span")
    fields = [s for s in ConsumerMessage.__slots__ if s not in unset]
    for aiokafka_record, message in zip(list(stock), list(fused), strict=True):
        faust_message = Consumer._to_message(faust_consumer, tp, aiokafka_record)
        assert type(message) is ConsumerMessage
        for field in fields:
            assert getattr(message, field) == getattr(faust_message, field), field
        assert message.headers == list(faust_message.headers)


def test_the_fetcher_switched_over_yields_messages_for_what_it_holds_and_fetches() -> None:
    """A fetcher's results, those it held when switched and those it stores
    after, yield Faust's messages; the batch consumer admits them with the
    current generation, and records fetched before the switch as Faust would."""
    from types import SimpleNamespace

    from aiokafka.consumer.fetcher import FetchResult
    from faust.transport.drivers.aiokafka import Consumer
    from faust.types.tuples import ConsumerMessage

    from svc_ingest.faust_compat.consumer import BatchConsumer, _fetch_messages

    def result() -> Any:
        tp, records = _fetched(RECORDS)
        assignment = SimpleNamespace(
            active=True,
            state_value=lambda tp: SimpleNamespace(consumed_to=lambda offset: None, paused=False),
        )
        found = FetchResult(tp, assignment=assignment, partition_records=records, backoff=0)
        found.check_assignment = lambda tp: True
        return tp, found

    held_tp, held = result()
    fetcher: Any = SimpleNamespace(
        _records={held_tp: held}, _key_deserializer=None, _value_deserializer=None
    )
    _fetch_messages(fetcher)
    _fetch_messages(fetcher)  # once is enough; again changes nothing
    later_tp, later = result()
    fetcher._records[("later", 0)] = later
    assert all(type(m) is ConsumerMessage for m in held.getall())
    fetched = later.getall()
    assert [m.offset for m in fetched] == [0, 1, 2]

    _, stock = _fetched(RECORDS)
    aiokafka_records = list(stock)
    consumer: Any = SimpleNamespace(
        app=SimpleNamespace(
            consumer_generation_id=4,
            topics=SimpleNamespace(acks_enabled_for=lambda topic: True),
        ),
        _read_offset={later_tp: None},
        log=SimpleNamespace(dev=lambda *args: None),
    )
    # What Faust's _to_message makes of a record fetched before the switch.
    consumer._to_message = lambda tp, record: Consumer._to_message(consumer, tp, record)
    admitted = asyncio.run(
        BatchConsumer._admit(consumer, later_tp, [fetched[0], aiokafka_records[1], fetched[2]])
    )
    assert [type(m) for m in admitted] == [ConsumerMessage] * 3
    assert [m.generation_id for m in admitted] == [4, 4, 4]
    assert admitted[0] is fetched[0]
    assert admitted[1].value == aiokafka_records[1].value
    consumer.app.consumer_generation_id = 5  # Faust's own getmany reads through here
    assert BatchConsumer._to_message(consumer, later_tp, fetched[1]) is fetched[1]
    assert fetched[1].generation_id == 5


def test_silenced_message_hooks_are_skipped_and_the_others_still_called() -> None:
    from types import SimpleNamespace

    import faust
    from faust.types.tuples import ConsumerMessage, Message

    from svc_ingest.faust_compat.batches import _message_hooks, ack_batch, silence_message_hooks

    app: Any = faust.App("hooks", broker="kafka://127.0.0.1:1")
    app.topics._acking_topics.add("raw")
    seen: list[int] = []

    class Seen(faust.Sensor):
        def on_message_out(self, tp: TP, offset: int, message: Message) -> None:
            seen.append(offset)

    silence_message_hooks(app.monitor)
    app.sensors.add(app.monitor)
    assert _message_hooks(app, "on_message_out") == []
    app.sensors.add(Seen())
    assert len(_message_hooks(app, "on_message_out")) == 1
    tp = TP("raw", 0)
    app.consumer._committed_offset[tp] = None
    message = ConsumerMessage("raw", 0, 5, 0.0, 0, [], b"k", b"v", None, tp=tp)
    message.refcount = 1
    assert ack_batch([SimpleNamespace(message=message)], app) == 1
    assert seen == [5]


@pytest.mark.parametrize(
    "headers",
    [[("content-type", b"application/json"), ("x", b"1")], [], None, {"x": b"1"}],
    ids=["pairs", "none-given", "None", "dict"],
)
def test_a_raw_event_reads_as_the_event_faust_makes(headers: Any) -> None:
    import faust
    from faust.types.tuples import ConsumerMessage

    from svc_ingest.faust_compat.delivery import RawEvent

    message = ConsumerMessage("raw", 0, 7, 0.0, 0, headers or [], b"k", b"v", None)
    ours = RawEvent(None, b"k", b"v", headers, message)  # type: ignore[arg-type]
    theirs = faust.Event(None, b"k", b"v", headers, message)  # type: ignore[arg-type]
    for name in ("app", "key", "value", "message", "acked", "headers"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.headers is ours.headers  # made once
    ours.headers = theirs.headers = {"y": b"2"}
    assert ours.headers == theirs.headers


def test_the_raw_path_delivers_raw_events_unless_the_app_names_its_own() -> None:
    import faust

    from svc_ingest.faust_compat.delivery import BatchConductor, BatchHandler, RawEvent

    class Mine(faust.Event):
        pass

    for configured, made in ((faust.Event, RawEvent), (Mine, Mine)):
        app = faust.App(f"raw-events-{made.__name__}", Event=configured)
        conductor = BatchConductor(app)
        handler = BatchHandler(conductor, TP("raw", 0), set(), None)
        assert handler.event_cls is made


def test_a_batch_taken_tracks_its_messages_as_faust_tracks_each() -> None:
    """``take_batch`` admits a batch as Faust's stream admits each event:
    the same messages tracked in the consumer's weak set of unacked ones
    (a message that is gone leaves it), the stale generation's acked and
    dropped; then ``ack_batch`` leaves none unacked."""
    import gc
    from types import SimpleNamespace

    import faust
    from faust.types.tuples import ConsumerMessage

    from svc_ingest.faust_compat.batches import ack_batch, take_batch

    def scene() -> tuple[Any, list[Any]]:
        app: Any = faust.App("take-batch", broker="kafka://127.0.0.1:1")
        app.topics._acking_topics.add("raw")
        app.consumer_generation_id = 2
        app.flow_control.resume()
        tp = TP("raw", 0)
        events = []
        for i in range(6):
            message = ConsumerMessage("raw", 0, i, 0.0, 0, [], b"k", b"v", None, tp=tp)
            message.refcount = 1
            message.generation_id = 1 if i == 0 else 2  # the first one is stale
            events.append(SimpleNamespace(message=message))
        return app, events

    async def take(app: Any, events: list[Any]) -> list[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        for event in events:
            queue.put_nowait(event)
        return await take_batch(queue, 10, 0.0, app=app)

    faust_app, faust_events = scene()
    for event in faust_events[1:]:  # what Stream does per event it admits
        faust_app.consumer.track_message(event.message)
    app, events = scene()
    taken = asyncio.run(take(app, events))
    assert [e.message.offset for e in taken] == [1, 2, 3, 4, 5]
    assert events[0].message.acked  # the stale one, acked and dropped
    assert sorted(m.offset for m in app.consumer.unacked) == sorted(
        m.offset for m in faust_app.consumer.unacked
    )
    del events, taken[4]  # a message gone from everywhere leaves the weak set
    gc.collect()
    assert sorted(m.offset for m in app.consumer.unacked) == [1, 2, 3, 4]
    ack_batch(taken, app)
    assert not app.consumer.unacked
