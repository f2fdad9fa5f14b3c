"""svc_ingest's consumer lag after each committed batch, against a fake of
Faust's consumer: the shared gauge and ``aistack_ingest_consumer_lag`` say
the same, and forget the partitions another worker took over."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from faust.types import TP
from prometheus_client import CollectorRegistry, Gauge

from shared.bus.lag import ConsumerLag
from svc_ingest.app import _Observer
from svc_ingest.handlers import Outcome
from svc_ingest.metrics import IngestMetrics

RAW = "aistack.events.raw"
GROUP = "aistack-ingest"


@dataclass
class FakeMessage:
    topic: str
    partition: int
    offset: int


@dataclass
class FakeEvent:
    message: FakeMessage


@dataclass
class FakeConsumer:
    """The highwater of each partition's last fetch, and the assignment."""

    highwaters: dict[int, int]
    assigned: set[TP] = field(default_factory=set)

    def highwater(self, tp: TP) -> int | None:
        return self.highwaters.get(tp.partition)

    def assignment(self) -> set[TP]:
        return self.assigned


@dataclass
class FakeApp:
    consumer: FakeConsumer


def committed(observe: _Observer, *positions: tuple[int, int]) -> None:
    """A committed batch of clean records at these (partition, offset)s."""
    events = [FakeEvent(FakeMessage(RAW, partition, offset)) for partition, offset in positions]
    observe(cast(Any, events), [Outcome("clean", "", None, None, []) for _ in positions])


def test_both_lag_gauges_follow_each_batch_and_forget_moved_partitions() -> None:
    registry = CollectorRegistry()
    metrics = IngestMetrics.create(registry)
    shared = Gauge("consumer_lag", "lag", ["reader", "topic", "partition"], registry=registry)
    consumer = FakeConsumer({0: 10, 1: 5, 2: 8}, {TP(RAW, 0), TP(RAW, 1), TP("changelog", 1)})
    observe = _Observer(
        cast(Any, FakeApp(consumer)), metrics, RAW, ConsumerLag(GROUP, gauge=shared)
    )

    def lags(partition: int) -> tuple[float | None, float | None]:
        mine = registry.get_sample_value(
            "aistack_ingest_consumer_lag", {"partition": str(partition)}
        )
        common = registry.get_sample_value(
            "consumer_lag", {"reader": GROUP, "topic": RAW, "partition": str(partition)}
        )
        return mine, common

    committed(observe, (0, 5), (0, 6), (1, 4), (2, 1))
    assert lags(0) == (3, 3)  # 7, 8 and 9 still to come
    assert lags(1) == (0, 0)
    del consumer.highwaters[2]  # not known (None), as before a partition's first fetch
    committed(observe, (2, 2))
    assert lags(2) == (6, 6)  # the value it last knew
    observe.rebalanced()  # partition 2 went to another worker
    assert lags(2) == (None, None)
    assert lags(0) == (3, 3)
