"""Consumer lag: how many records each reader has yet to get through, per
partition, as one Prometheus gauge for every service.

``aistack_consumer_lag{reader, topic, partition}``: ``reader`` is the
consumer group for a group member (``svc_tuner``, ``aistack-ingest``), or the
name a reader outside any group was given (``svc_model.registry``,
``svc_transform.windows``).

What counts as not yet got through:

- a group member: the records after the group's committed offset, the
  number ``kafka-consumer-groups --describe`` shows as LAG. Records polled
  but not yet committed (a batch being handled, trials waiting in a
  trainer) still count. Before its first commit on a partition, the records
  after the last one handed to the application;
- a reader outside any group (``BusTail``, which never commits): the records
  after the last one handed to the application.

The end is the high watermark (the last stable offset under
``read_committed``, librdkafka's default), as of the last fetch response.

How it is measured, for the confluent-kafka readers (``BusConsumer``,
``BusTail``, so every ``ConsumeLoop`` and svc_trainer's own loop): from
librdkafka's statistics (``statistics.interval.ms``), not by asking per
poll. librdkafka already keeps, per partition, the watermarks of the last
fetch response, the committed offset (fetched when the partition was
assigned, updated on every commit) and the offset last handed to the
application, and computes the lag from them in its own thread; the document
costs one JSON parse per interval on the polling thread, nothing per record
or per poll. The alternative, ``get_watermark_offsets(cached=True)`` and
``position()`` after each poll, costs some 10 µs per partition on every poll
and cannot see a partition this member has not yet read from (its position
is unknown until then; an idle, caught-up member would export nothing) nor
the committed offset without a broker round trip.

Other engines measure it their own way and report it here, through
``ConsumerLag.set``: svc_ingest (aiokafka's cached highwater after each
batch), svc_transform (each Spark query's progress).

Series of partitions a reader no longer holds are removed, so that a
partition that moved to another replica is not reported twice.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection, Mapping
from typing import Any

from prometheus_client import Gauge

from shared.log import get_logger
from shared.metrics import NAMESPACE

log = get_logger("shared.bus")

# Well under a Prometheus scrape interval (15 s or more), and one JSON parse
# per interval per reader is nothing next to the records it reads.
STATS_INTERVAL_MS = 5_000

CONSUMER_LAG = Gauge(
    "consumer_lag",
    "Records not yet got through by a reader (a consumer group, or a named "
    "reader outside any group), per partition: the end of the partition "
    "minus the group's committed offset, or minus the reader's position",
    ["reader", "topic", "partition"],
    namespace=NAMESPACE,
)

# librdkafka's "not known" for an offset (RD_KAFKA_OFFSET_INVALID).
_UNKNOWN = -1001

Partition = tuple[str, int]
_Labels = tuple[str, str, str]

# Which reporter last set each series: two readers of one name in a process
# (members of one group in a benchmark) must not remove each other's series.
_owners: dict[_Labels, object] = {}
_owners_lock = threading.Lock()


def behind(end: int, position: int) -> int | None:
    """The records from ``position`` (the next offset to get through) to
    ``end`` (the offset after the last record); None when either is not
    known (negative: librdkafka's and aiokafka's "no offset yet")."""
    if end < 0 or position < 0:
        return None
    return max(end - position, 0)


def lag_from_statistics(stats: Mapping[str, Any]) -> dict[Partition, int]:
    """Each partition's lag from one librdkafka statistics document (its
    ``topics`` → ``partitions``), for the partitions the reader holds now."""
    lags: dict[Partition, int] = {}
    for topic, described in stats.get("topics", {}).items():
        for numbered in described.get("partitions", {}).values():
            partition = int(numbered.get("partition", -1))
            # -1 is librdkafka's internal "unassigned" partition; a partition
            # that is not desired was revoked (or belongs to another member).
            if partition < 0 or not numbered.get("desired") or numbered.get("unknown"):
                continue
            lag = _partition_lag(numbered)
            if lag is not None:
                lags[(topic, partition)] = lag
    return lags


def _partition_lag(stats: Mapping[str, Any]) -> int | None:
    # librdkafka's own lag: from the committed offset, else (nothing
    # committed: a reader outside any group, or a new group) from the offset
    # after the last record handed to the application. -1 is "not known".
    for name in ("consumer_lag", "consumer_lag_stored"):
        lag = int(stats.get(name, -1))
        if lag >= 0:
            return lag
    # Nothing committed nor handed over yet: the reader is where librdkafka
    # fetches next, less the records fetched and not yet handed over (in a
    # compacted log, whose offsets have gaps, those count as records where
    # the rest counts offsets: a little less, until the first is handed over).
    fetch = int(stats.get("next_offset", _UNKNOWN))
    if fetch < 0:
        return None
    return behind(int(stats.get("ls_offset", _UNKNOWN)), fetch - int(stats.get("fetchq_cnt", 0)))


class ConsumerLag:
    """One reader's series of the lag gauge.

    For a confluent-kafka consumer, merge ``client_config()`` into its
    configuration: librdkafka then reports every ``STATS_INTERVAL_MS`` (a
    ``statistics.interval.ms`` in the caller's own configuration wins), from
    within the consumer's poll (until then each report waits in the
    consumer's queue: a reader is polled, or closed). Other readers call
    ``set`` and ``keep``. ``close`` removes the reader's series; call it
    after closing the consumer.
    """

    def __init__(self, reader: str, *, gauge: Gauge = CONSUMER_LAG) -> None:
        self._reader = reader
        self._gauge = gauge
        self._owner = object()
        self._held: set[Partition] = set()
        self._closed = False
        self._failed = False

    @property
    def reader(self) -> str:
        return self._reader

    @property
    def held(self) -> frozenset[Partition]:
        """The partitions this reader has a series for."""
        return frozenset(self._held)

    def client_config(self) -> dict[str, Any]:
        """librdkafka settings that feed this reader's series."""
        return {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self.on_statistics}

    def on_statistics(self, document: str) -> None:
        """librdkafka's ``stats_cb``. Never raises: an exception here would
        surface from the consumer's poll and stop the reader."""
        if self._closed:
            return
        try:
            lags = lag_from_statistics(json.loads(document))
        except (ValueError, TypeError, AttributeError) as exc:
            if not self._failed:  # once: it would recur every interval
                self._failed = True
                log.warning(
                    "consumer_lag.unreadable_statistics", reader=self._reader, error=str(exc)
                )
            return
        for (topic, partition), lag in lags.items():
            self.set(topic, partition, lag)
        self.keep(lags.keys())

    def set(self, topic: str, partition: int, lag: int) -> None:
        labels = (self._reader, topic, str(partition))
        with _owners_lock:
            _owners[labels] = self._owner
        self._gauge.labels(*labels).set(lag)
        self._held.add((topic, partition))

    def keep(self, partitions: Collection[Partition]) -> None:
        """Remove the series of every partition but ``partitions`` (those the
        reader holds now)."""
        for gone in self._held.difference(partitions):
            self._remove(gone)

    def close(self) -> None:
        self._closed = True
        for held in list(self._held):
            self._remove(held)

    def _remove(self, partition: Partition) -> None:
        self._held.discard(partition)
        labels = (self._reader, partition[0], str(partition[1]))
        with _owners_lock:
            if _owners.get(labels) is not self._owner:
                return  # another reader of this name reports it now
            del _owners[labels]
            self._gauge.remove(*labels)


__all__ = ["CONSUMER_LAG", "STATS_INTERVAL_MS", "ConsumerLag", "behind", "lag_from_statistics"]
