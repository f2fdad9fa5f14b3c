"""Every aistack.v1 event message through the real broker, with both clients."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from shared.bus import envelope
from shared.bus.codec import decode, type_name
from shared.bus.consumer import BusConsumer, Record
from shared.bus.producer import BusProducer
from shared.bus.topics import TopicSpec, ensure_topics
from shared.contracts.aistack.v1 import (
    common_pb2,
    events_pb2,
    features_pb2,
    models_pb2,
    tuning_pb2,
)
from shared.errors import UndecodableRecord
from tests.infra import Infra

pytestmark = pytest.mark.integration

NOW = Timestamp(seconds=1_790_000_000, nanos=123_000_000)


def every_event_message() -> list[tuple[Message, str]]:
    """One filled-in instance of each message that travels on a topic, and its key."""
    reading = events_pb2.SensorReading(
        device_id="dev-7",
        measurements=[events_pb2.Measurement(metric="temperature", value=21.5, unit="celsius")],
    )
    web = events_pb2.WebRequest(host="shop", method="GET", path="/cart", status=503, latency_ms=87)
    return [
        (events_pb2.RawEvent(event_id="r1", event_time=NOW, sensor_reading=reading), "dev-7"),
        (events_pb2.RawEvent(log_line='1.2.3.4 - - [..] "GET / HTTP/1.1" 200 5'), "shop"),
        (
            events_pb2.CleanEvent(
                event_id="r1",
                entity_id="dev-7",
                event_time=NOW,
                web_request=web,
                source=common_pb2.SourcePosition(topic="aistack.events.raw", partition=1, offset=9),
            ),
            "dev-7",
        ),
        (
            events_pb2.DeadLetter(
                reason="invalid_json",
                message="expected an object",
                original_value=b"[1,2",
                original_headers=[common_pb2.Header(key="content-type", value=b"application/json")],
            ),
            "dev-7",
        ),
        (
            features_pb2.FeatureWindow(
                window_key="dev-7|temperature|60|60|1790000000000",
                entity_id="dev-7",
                metric="temperature",
                window_start=NOW,
                count=12,
                mean=21.1,
                p95=22.0,
            ),
            "dev-7",
        ),
        (
            tuning_pb2.TrialRequested(
                trial_id="s1-t3",
                study_id="s1",
                trial_number=3,
                params={
                    "lr": common_pb2.ParamValue(float_value=1e-3),
                    "units": common_pb2.ParamValue(int_value=128),
                    "activation": common_pb2.ParamValue(string_value="relu"),
                },
                task=tuning_pb2.TrainingTask(dataset="digits", model_family="cnn", epochs=5),
                attempt=1,
            ),
            "s1-t3",
        ),
        (
            tuning_pb2.TrialReport(
                trial_id="s1-t3",
                study_id="s1",
                progress=tuning_pb2.TrialProgress(step=2, value=0.07),
            ),
            "s1",
        ),
        (
            tuning_pb2.TrialReport(
                trial_id="s1-t3", study_id="s1", completed=tuning_pb2.TrialCompleted(value=0.05)
            ),
            "s1",
        ),
        (
            tuning_pb2.TrialControl(
                trial_id="s1-t3", study_id="s1", action=tuning_pb2.CONTROL_ACTION_PRUNE, step=2
            ),
            "s1-t3",
        ),
        (
            models_pb2.ModelReady(
                model_name="digits-cnn",
                version="4",
                framework=common_pb2.FRAMEWORK_TORCH,
                format=models_pb2.ARTIFACT_FORMAT_TORCHSCRIPT,
                artifact_uri="file:///state/artifacts/digits-cnn/4/model.pt",
                sha256="ab" * 32,
                inputs=[models_pb2.TensorSpec(name="input", datatype="FP32", shape=[-1, 1, 8, 8])],
                metrics={"val_error": 0.02},
                lineage=models_pb2.ModelLineage(
                    study_id="s1",
                    trial_id="s1-t3",
                    data=models_pb2.DataLineage(
                        dataset="digits",
                        offsets=[common_pb2.SourcePosition(topic="x", partition=0, offset=5)],
                    ),
                ),
            ),
            "digits-cnn",
        ),
    ]


def make_topic(infra: Infra, name: str, partitions: int = 1) -> str:
    ensure_topics(infra.kafka, [TopicSpec(name, None)], partitions=partitions)
    return name


def consume_all(consumer: BusConsumer, want: int, timeout: float = 30.0) -> list[Record]:
    records: list[Record] = []
    deadline = time.monotonic() + timeout
    while len(records) < want and time.monotonic() < deadline:
        records.extend(consumer.poll_batch(100, timeout=0.5))
    return records


@pytest.mark.parametrize(
    ("message", "key"),
    every_event_message(),
    ids=lambda v: type(v).__name__ if isinstance(v, Message) else "",
)
def test_confluent_round_trip_keeps_message_key_and_headers(
    infra: Infra, unique: str, message: Message, key: str
) -> None:
    topic = make_topic(infra, f"test.roundtrip.{unique}")
    traceparent = envelope.new_traceparent()
    with BusProducer(infra.kafka, source="tests") as producer:
        event_id = producer.publish(topic, message, key=key, traceparent=traceparent)

    with BusConsumer(
        infra.kafka, group_id=f"g-{unique}", topics=[topic], message_cls=type(message)
    ) as consumer:
        records = consume_all(consumer, 1)
        assert len(records) == 1
        record = records[0]
        assert record.decode() == message
        assert record.key == key.encode()
        assert record.envelope == envelope.Envelope(
            content_type="application/x-protobuf",
            message_type=type_name(type(message)),
            event_id=event_id,
            source="tests",
            traceparent=traceparent,
        )
        consumer.commit(records)


def test_aiokafka_round_trip_both_ways(infra: Infra, unique: str) -> None:
    """aiokafka (Faust's client) reads what shared/ writes, and the reverse."""
    messages = every_event_message()
    to_aio = make_topic(infra, f"test.to-aio.{unique}", partitions=2)
    from_aio = make_topic(infra, f"test.from-aio.{unique}")

    with BusProducer(infra.kafka, source="tests") as producer:
        ids = [producer.publish(to_aio, m, key=k) for m, k in messages]

    async def aio_side() -> list[tuple[Message, envelope.Envelope]]:
        consumer = AIOKafkaConsumer(
            to_aio,
            group_id=f"aio-{unique}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            **infra.kafka.aiokafka_config(),
        )
        await consumer.start()
        received = []
        try:
            while len(received) < len(messages):
                batches = await consumer.getmany(timeout_ms=1000)
                for _, batch in batches.items():
                    received.extend(batch)
            await consumer.commit()
        finally:
            await consumer.stop()
        decoded = []
        by_type = {type_name(type(m)): type(m) for m, _ in messages}
        for r in received:
            env = envelope.parse_headers(r.headers)
            msg = decode(
                by_type[env.message_type],
                r.value,
                r.headers,
                topic=r.topic,
                partition=r.partition,
                offset=r.offset,
                key=r.key,
            )
            decoded.append((msg, env))

        producer = AIOKafkaProducer(acks="all", **infra.kafka.aiokafka_config())
        await producer.start()
        try:
            for message, key in messages:
                headers = envelope.HeaderTemplate(type_name(type(message)), "aio").build(
                    envelope.new_event_id(), envelope.new_traceparent()
                )
                await producer.send_and_wait(
                    from_aio, message.SerializeToString(), key=key.encode(), headers=headers
                )
        finally:
            await producer.stop()
        return decoded

    decoded = asyncio.run(aio_side())
    assert sorted(m.SerializeToString(deterministic=True) for m, _ in decoded) == sorted(
        m.SerializeToString(deterministic=True) for m, _ in messages
    )
    assert sorted(e.event_id for _, e in decoded) == sorted(ids)
    assert all(e.source == "tests" and e.traceparent.startswith("00-") for _, e in decoded)

    # Back through shared/: one consumer per message type, all on one topic.
    with BusConsumer(
        infra.kafka, group_id=f"g-{unique}", topics=[from_aio], message_cls=events_pb2.RawEvent
    ) as consumer:
        records = consume_all(consumer, len(messages))
    assert len(records) == len(messages)
    for record, (message, key) in zip(records, messages, strict=True):
        assert record.envelope.source == "aio" and record.key == key.encode()
        typed = decode(
            type(message),
            record.value,
            record.headers,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
        )
        assert typed == message


def test_bad_bytes_on_the_bus_raise_with_their_position(infra: Infra, unique: str) -> None:
    topic = make_topic(infra, f"test.bad.{unique}")
    with BusProducer(infra.kafka, source="tests") as producer:
        producer.publish_raw(topic, b"\xff\xfe not protobuf", key=b"k", headers=[("x", b"1")])
    with BusConsumer(
        infra.kafka, group_id=f"g-{unique}", topics=[topic], message_cls=events_pb2.CleanEvent
    ) as consumer:
        (record,) = consume_all(consumer, 1)
        with pytest.raises(UndecodableRecord) as caught:
            record.decode()
    error = caught.value
    assert (error.topic, error.partition, error.offset) == (topic, 0, 0)
    assert error.value == b"\xff\xfe not protobuf" and error.headers == [("x", b"1")]


def test_a_tail_since_a_time_no_record_reaches_is_caught_up_at_once(
    infra: Infra, unique: str
) -> None:
    """A partition with records, none at or after ``since_ms``: the tail
    starts at its end and has nothing to catch up on (svc_monitor's joiner
    replays its lookback so, and waited for it forever)."""
    from shared.bus.consumer import BusTail

    topic = make_topic(infra, f"since-{unique}", partitions=2)
    with BusProducer(infra.kafka, source="tests") as producer:
        for i in range(3):
            producer.publish(topic, events_pb2.CleanEvent(event_id=f"e{i}"), key=f"k{i}")
        producer.flush()
    future_ms = int(time.time() * 1000) + 3_600_000
    tail = BusTail(
        infra.kafka, topics=[topic], message_cls=events_pb2.CleanEvent, since_ms=future_ms
    )
    try:
        assert tail.caught_up()
        assert tail.poll_batch(10, timeout=0.5) == []
    finally:
        tail.close()
    everything = BusTail(infra.kafka, topics=[topic], message_cls=events_pb2.CleanEvent, since_ms=0)
    try:
        assert not everything.caught_up()
        read: list[Record] = []
        deadline = time.monotonic() + 30
        while not everything.caught_up() and time.monotonic() < deadline:
            read += everything.poll_batch(10, timeout=0.5)
        assert sorted(r.decode().event_id for r in read) == ["e0", "e1", "e2"]
    finally:
        everything.close()


def _forward(listener: socket.socket, to: tuple[str, int]) -> None:
    """Accept on ``listener`` and pipe each connection to ``to``, both ways."""

    def pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    with contextlib.suppress(OSError):
        while True:
            client, _ = listener.accept()
            upstream = socket.create_connection(to)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()


def test_a_tail_started_while_the_broker_is_away_waits_for_it(infra: Infra, unique: str) -> None:
    """The bootstrap address refuses connections (a broker restarting) when
    the tail starts, and answers two seconds later: the tail waits for it
    within its timeout (svc_monitor, restarted just before the broker, exited
    on the refusal); one that never answers is Unavailable, not a Kafka
    error."""
    from shared.bus.consumer import BusTail
    from shared.errors import Unavailable
    from shared.ports import free_port

    topic = make_topic(infra, f"away-{unique}", partitions=1)
    with BusProducer(infra.kafka, source="tests") as producer:
        producer.publish(topic, events_pb2.CleanEvent(event_id="e0"), key="k0")
        producer.flush()
    host, port = infra.kafka.bootstrap.split(",")[0].rsplit(":", 1)
    away = infra.kafka.model_copy(update={"bootstrap": f"127.0.0.1:{free_port()}"})
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def come_back() -> None:
        time.sleep(2.0)
        listener.bind(("127.0.0.1", int(away.bootstrap.rsplit(":", 1)[1])))
        listener.listen()
        _forward(listener, (host, int(port)))

    threading.Thread(target=come_back, daemon=True).start()
    try:
        tail = BusTail(
            away, topics=[topic], message_cls=events_pb2.CleanEvent, from_beginning=True, timeout=60
        )
        try:
            read: list[Record[events_pb2.CleanEvent]] = []
            deadline = time.monotonic() + 30
            while not tail.caught_up() and time.monotonic() < deadline:
                read.extend(tail.poll_batch(10, timeout=0.5))
            assert [r.decode().event_id for r in read] == ["e0"]
        finally:
            tail.close()
    finally:
        listener.close()

    nobody = infra.kafka.model_copy(update={"bootstrap": f"127.0.0.1:{free_port()}"})
    with pytest.raises(Unavailable, match=f"Kafka at {nobody.bootstrap} did not answer within 2 s"):
        BusTail(nobody, topics=[topic], message_cls=events_pb2.CleanEvent, timeout=2)
