"""Consumer lag on the real broker: a reader behind by N records exports N,
and 0 once it has caught up, through the consume loop and through a reader
that polls on its own (svc_trainer's way)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY

from shared.bus.consumer import BusConsumer, BusTail, Record
from shared.bus.loop import Batch, ConsumeLoop, DeadLetters
from shared.bus.producer import BusProducer
from shared.bus.testing import MemoryPublisher
from shared.bus.topics import TopicSpec, ensure_topics
from shared.contracts.aistack.v1 import events_pb2
from shared.errors import Unavailable
from tests.infra import Infra, wait_until

pytestmark = pytest.mark.timeout(120)

Event = events_pb2.CleanEvent
N = 5
# librdkafka's statistics, which carry the lag, every 0.1 s instead of 5 s.
FAST = {"statistics.interval.ms": 100}


@pytest.fixture
def topic(infra: Infra, unique: str) -> str:
    name = f"test.lag.{unique}"
    ensure_topics(infra.kafka, [TopicSpec(name, Event)], partitions=1)
    return name


def publish(infra: Infra, topic: str, count: int) -> None:
    with BusProducer(infra.kafka, source="tests") as producer:
        for i in range(count):
            producer.publish(topic, Event(event_id=f"e-{i}", entity_id="t-1"), key="t-1")


def lag(reader: str, topic: str) -> float | None:
    labels = {"reader": reader, "topic": topic, "partition": "0"}
    return REGISTRY.get_sample_value("aistack_consumer_lag", labels)


def loop_over(
    consumer: BusConsumer[Event], handled: list[str], publisher: MemoryPublisher
) -> ConsumeLoop[Event]:
    def handle(batch: Batch[Event]) -> None:
        handled.extend(message.event_id for message, _ in batch)

    dead_letters = DeadLetters(publisher, topic="dlq", service="tests")
    return ConsumeLoop(consumer, handle, publisher=publisher, dead_letters=dead_letters)


def stepping(loop: ConsumeLoop[Event], until: Callable[[], bool]) -> Callable[[], bool]:
    """A condition for wait_until that steps the loop first (the statistics
    are served from within its polls); a step whose flush fails is what it is."""

    def check() -> bool:
        with contextlib.suppress(Unavailable):
            loop.step()
        return until()

    return check


def test_the_loop_s_lag_counts_what_its_group_has_not_committed(
    infra: Infra, topic: str, unique: str
) -> None:
    group = f"lag-loop-{unique}"
    handled: list[str] = []
    publish(infra, topic, 1)
    consumer: BusConsumer[Event] = BusConsumer(
        infra.kafka, group_id=group, topics=[topic], message_cls=Event, config=FAST
    )
    try:
        loop = loop_over(consumer, handled, MemoryPublisher())
        wait_until(
            stepping(loop, lambda: lag(group, topic) == 0 and len(handled) == 1), 30, "caught up"
        )
        # Its outputs' broker goes away: every batch is read and handled but
        # none is delivered, so none is committed; the group falls behind.
        failing = loop_over(consumer, handled, MemoryPublisher(down=True))
        publish(infra, topic, N)
        wait_until(
            stepping(failing, lambda: lag(group, topic) == N), 30, f"the lag never reached {N}"
        )
    finally:
        consumer.close()
    assert lag(group, topic) is None  # a reader that left has no series

    # Restarted, it reads the batch again from the last commit and catches up.
    handled.clear()
    with BusConsumer(
        infra.kafka, group_id=group, topics=[topic], message_cls=Event, config=FAST
    ) as consumer:
        loop = loop_over(consumer, handled, MemoryPublisher())
        wait_until(
            stepping(loop, lambda: lag(group, topic) == 0 and len(handled) == N),
            30,
            "caught up again",
        )
    assert handled == [f"e-{i}" for i in range(N)]


def test_a_reader_polling_on_its_own_lags_until_it_commits(
    infra: Infra, topic: str, unique: str
) -> None:
    """svc_trainer's way: requests taken many polls before they are
    committed, in order, one by one."""
    group = f"lag-own-{unique}"
    publish(infra, topic, 1)
    with BusConsumer(
        infra.kafka, group_id=group, topics=[topic], message_cls=Event, config=FAST
    ) as consumer:
        waiting: list[Record[Event]] = []

        def polled(until: Callable[[], bool]) -> Callable[[], bool]:
            def check() -> bool:
                waiting.extend(consumer.poll_batch(10, timeout=0.1))
                return until()

            return check

        wait_until(polled(lambda: len(waiting) == 1), 30, "the first record")
        consumer.commit(waiting)
        waiting.clear()
        publish(infra, topic, N)
        wait_until(
            polled(lambda: lag(group, topic) == N and len(waiting) == N),
            30,
            f"the lag never reached {N}",
        )
        consumer.commit(waiting[:2])
        wait_until(polled(lambda: lag(group, topic) == N - 2), 30, "two commits did not count")
        for record in waiting[2:]:
            consumer.commit([record])
        wait_until(polled(lambda: lag(group, topic) == 0), 30, "the lag never fell to 0")

    # A replay of the log outside any group (svc_model's registry, svc_monitor's
    # horizons) is caught up once it has read every record.
    reader = f"lag-replay-{unique}"
    tail: BusTail[Event] = BusTail(
        infra.kafka,
        topics=[topic],
        message_cls=Event,
        from_beginning=True,
        reader=reader,
        config=FAST,
    )
    try:
        read: list[Record[Event]] = []

        def replayed() -> bool:
            read.extend(tail.poll_batch(100, timeout=0.1))
            return tail.caught_up() and lag(reader, topic) == 0

        wait_until(replayed, 30, "the replay never caught up")
        assert len(read) == 1 + N
    finally:
        tail.close()
    assert lag(reader, topic) is None
