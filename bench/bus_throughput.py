"""shared/'s producer and consumer against bare confluent-kafka, same run.

200,000 protobuf events of about 200 bytes go through the local broker twice
per round: once through shared.bus (BusProducer.publish, BusConsumer.poll_batch
+ Record.decode) and once through a hand-written loop on bare confluent-kafka
with the same client settings, writing the same envelope headers and parsing
the same messages. Rates are records per second; ratios are shared / bare, so
higher is better.

    python -m bench.bus_throughput [--events N] [--rounds R]

Needs a broker: ``aistack infra up`` (or AISTACK_KAFKA_BOOTSTRAP).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, Producer
from google.protobuf.timestamp_pb2 import Timestamp

from bench import profiling
from bench.harness import kafka_settings, print_ratio, round_order
from shared.bus.consumer import CONSUMER_DEFAULTS, BusConsumer
from shared.bus.producer import PRODUCER_DEFAULTS, BusProducer
from shared.bus.topics import TopicSpec, ensure_topics
from shared.contracts.aistack.v1 import common_pb2, events_pb2
from shared.settings import KafkaSettings

GOAL = 0.9
TYPE_NAME = b"aistack.v1.CleanEvent"


def make_events(n: int) -> list[events_pb2.CleanEvent]:
    events = []
    for i in range(n):
        events.append(
            events_pb2.CleanEvent(
                event_id=f"{i:032x}",
                entity_id=f"device-{i % 500:04d}",
                event_time=Timestamp(seconds=1_790_000_000 + i, nanos=i % 1000 * 1000),
                ingest_time=Timestamp(seconds=1_790_000_001 + i),
                attributes={"site": "plant-3"},
                source=common_pb2.SourcePosition(
                    topic="aistack.events.raw", partition=i % 3, offset=i
                ),
                sensor_reading=events_pb2.SensorReading(
                    device_id=f"device-{i % 500:04d}",
                    measurements=[
                        events_pb2.Measurement(
                            metric="temperature", value=20 + i % 7, unit="celsius"
                        ),
                        events_pb2.Measurement(
                            metric="humidity", value=40 + i % 11, unit="percent"
                        ),
                        events_pb2.Measurement(metric="pressure", value=1000 + i % 13, unit="hpa"),
                    ],
                ),
            )
        )
    return events


def timed(
    produce: Callable[[KafkaSettings, str, list[events_pb2.CleanEvent]], int],
    kafka: KafkaSettings,
    topic: str,
    events: list[events_pb2.CleanEvent],
) -> tuple[int, float]:
    start = time.perf_counter()
    count = produce(kafka, topic, events)
    return count, time.perf_counter() - start


# ---- through shared/ ----


def shared_produce(kafka: KafkaSettings, topic: str, events: list[events_pb2.CleanEvent]) -> int:
    producer = BusProducer(kafka, source="bench")
    for event in events:
        producer.publish(topic, event, key=event.entity_id)
    producer.flush(120)
    return len(events)


def shared_consume(kafka: KafkaSettings, topic: str, n: int) -> tuple[int, float]:
    consumer = BusConsumer(
        kafka,
        group_id=f"bench-{uuid.uuid4().hex}",
        topics=[topic],
        message_cls=events_pb2.CleanEvent,
    )
    seen = 0
    ids = 0
    start = None
    while seen < n:
        records = consumer.poll_batch(10_000, timeout=1.0)
        if records and start is None:
            start = time.perf_counter()
        for record in records:
            event = record.decode()
            ids += len(event.event_id)
        seen += len(records)
    elapsed = time.perf_counter() - (start or time.perf_counter())
    consumer.close()
    return seen, elapsed


# ---- bare confluent-kafka, written by hand ----


def bare_produce(kafka: KafkaSettings, topic: str, events: list[events_pb2.CleanEvent]) -> int:
    producer = Producer({**kafka.client_config(), **PRODUCER_DEFAULTS})
    for event in events:
        ids = os.urandom(40).hex()
        headers = [
            ("content-type", b"application/x-protobuf"),
            ("ce_specversion", b"1.0"),
            ("ce_type", TYPE_NAME),
            ("ce_source", b"bench"),
            ("ce_id", ids[:32].encode()),
            ("traceparent", f"00-{ids[32:64]}-{ids[64:]}-01".encode()),
        ]
        while True:
            try:
                producer.produce(
                    topic,
                    event.SerializeToString(),
                    event.entity_id,
                    headers=headers,  # type: ignore[arg-type]  # the stub's list is invariant
                )
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    return len(events)


def bare_consume(kafka: KafkaSettings, topic: str, n: int) -> tuple[int, float]:
    consumer = Consumer(
        {**kafka.client_config(), **CONSUMER_DEFAULTS, "group.id": f"bench-{uuid.uuid4().hex}"}
    )
    consumer.subscribe([topic])
    seen = 0
    ids = 0
    start = None
    parse = events_pb2.CleanEvent.FromString
    while seen < n:
        batch = consumer.consume(10_000, 1.0)
        if batch and start is None:
            start = time.perf_counter()
        for msg in batch:
            if msg.error():
                continue
            for key, value in msg.headers() or ():
                if key == "ce_type" and value != TYPE_NAME:
                    raise ValueError("unexpected message type")
            # A type ignore, not a cast: nothing but the work of a bare loop is timed.
            event = parse(msg.value())  # type: ignore[arg-type]  # errors skipped above
            ids += len(event.event_id)
            seen += 1
    elapsed = time.perf_counter() - (start or time.perf_counter())
    consumer.close()
    return seen, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=4)
    profiling.add_flag(parser, "bus_throughput")
    args = parser.parse_args()
    kafka = kafka_settings()
    events = make_events(args.events)
    size = sum(e.ByteSize() for e in events) / len(events)
    print(f"{args.events} events of {size:.0f} bytes on average, broker {kafka.bootstrap}")

    # Warm up the broker (idempotent-producer ids, group coordinator) and
    # both code paths; not measured.
    warm = events[: min(len(events), 20_000)]
    for produce, consume in ((shared_produce, shared_consume), (bare_produce, bare_consume)):
        topic = f"bench.bus.warmup.{uuid.uuid4().hex[:8]}"
        ensure_topics(kafka, [TopicSpec(topic, events_pb2.CleanEvent)], partitions=3)
        consume(kafka, topic, produce(kafka, topic, warm))

    best: dict[str, float] = {}
    paired: dict[str, list[float]] = {"produce": [], "consume": [], "total": []}
    for round_no in range(args.rounds):
        this_round: dict[str, float] = {}
        for who in round_order(("shared", "bare"), round_no):
            topic = f"bench.bus.{who}.{uuid.uuid4().hex[:8]}"
            ensure_topics(kafka, [TopicSpec(topic, events_pb2.CleanEvent)], partitions=3)
            produce = shared_produce if who == "shared" else bare_produce
            consume = shared_consume if who == "shared" else bare_consume
            gc.collect()
            n, produce_s = timed(produce, kafka, topic, events)
            gc.collect()
            seen, consume_s = consume(kafka, topic, n)
            rates = {
                f"{who}_produce": n / produce_s,
                f"{who}_consume": seen / consume_s,
                f"{who}_total": n / (produce_s + consume_s),
            }
            for name, rate in rates.items():
                best[name] = max(best.get(name, 0.0), rate)
                this_round[name] = rate
            print(
                f"round {round_no + 1} {who:<6} produce {rates[f'{who}_produce']:>9,.0f}/s  "
                f"consume {rates[f'{who}_consume']:>9,.0f}/s"
            )
        for part in paired:
            paired[part].append(this_round[f"shared_{part}"] / this_round[f"bare_{part}"])

    for who in ("shared", "bare"):
        print(
            f"{who}: produce {best[f'{who}_produce']:,.0f} events/s, "
            f"consume {best[f'{who}_consume']:,.0f} events/s, "
            f"end to end {best[f'{who}_total']:,.0f} events/s"
        )
    # The ratio is the median of the rounds' paired ratios: the machine's
    # noise (the broker shares the two cores) moves both sides of a round.
    for part in ("produce", "consume"):
        print_ratio(f"shared_vs_bare_{part}", statistics.median(paired[part]), GOAL)
    print_ratio("shared_vs_bare", statistics.median(paired["total"]), GOAL)


if __name__ == "__main__":
    main()
