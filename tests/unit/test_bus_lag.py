"""Consumer lag (``shared.bus.lag``) from librdkafka's statistics, with no
broker: which number each kind of reader exports, and which series go away."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from shared.bus.lag import ConsumerLag, behind, lag_from_statistics

UNKNOWN = -1001
TOPIC = "aistack.tuning.trials"


def partition(
    number: int,
    *,
    hi: int = UNKNOWN,
    committed: int = UNKNOWN,
    stored: int = UNKNOWN,
    next_offset: int = UNKNOWN,
    fetchq: int = 0,
    desired: bool = True,
) -> dict[str, Any]:
    """One partition of a statistics document, as librdkafka 2.x writes it
    (its lags derived from the offsets the way librdkafka derives them)."""
    return {
        "partition": number,
        "desired": desired,
        "unknown": False,
        "fetch_state": "active" if desired else "none",
        "hi_offset": hi,
        "ls_offset": hi,
        "lo_offset": 0 if hi >= 0 else UNKNOWN,
        "next_offset": next_offset,
        "app_offset": stored,
        "stored_offset": stored,
        "committed_offset": committed,
        "fetchq_cnt": fetchq,
        "consumer_lag": hi - committed if hi >= 0 and committed >= 0 else -1,
        "consumer_lag_stored": hi - stored if hi >= 0 and stored >= 0 else -1,
    }


def statistics(*partitions: dict[str, Any], topic: str = TOPIC) -> dict[str, Any]:
    # librdkafka's internal "unassigned" partition is always listed.
    listed = [*partitions, partition(-1, desired=False)]
    return {
        "name": "aistack#consumer-1",
        "type": "consumer",
        "topics": {topic: {"topic": topic, "partitions": {str(p["partition"]): p for p in listed}}},
    }


def test_behind_counts_records_and_knows_when_it_cannot() -> None:
    assert behind(10, 4) == 6
    assert behind(10, 10) == 0
    assert behind(10, 12) == 0  # a position past a stale end is not a negative lag
    assert behind(UNKNOWN, 4) is None
    assert behind(10, UNKNOWN) is None


def test_a_group_member_lags_from_its_committed_offset() -> None:
    # Records 12..19 were handed over (stored 20) but only up to 12 committed:
    # those waiting uncommitted (a trainer's queued trials) still count.
    stats = statistics(partition(0, hi=20, committed=12, stored=20, next_offset=20))
    assert lag_from_statistics(stats) == {(TOPIC, 0): 8}


def test_an_idle_caught_up_member_exports_zero_before_reading_anything() -> None:
    stats = statistics(partition(0, hi=5, committed=5, next_offset=5))
    assert lag_from_statistics(stats) == {(TOPIC, 0): 0}


def test_a_reader_that_never_commits_lags_from_what_it_was_handed() -> None:
    stats = statistics(partition(0, hi=20, stored=15, next_offset=20, fetchq=5))
    assert lag_from_statistics(stats) == {(TOPIC, 0): 5}


def test_before_the_first_record_is_handed_over_the_fetched_ones_still_count() -> None:
    fetched = statistics(partition(0, hi=20, next_offset=20, fetchq=20))
    assert lag_from_statistics(fetched) == {(TOPIC, 0): 20}
    at_the_end = statistics(partition(0, hi=20, next_offset=20))
    assert lag_from_statistics(at_the_end) == {(TOPIC, 0): 0}


def test_partitions_not_held_or_not_yet_fetched_are_not_reported() -> None:
    stats = statistics(
        partition(0, hi=20, committed=10),
        partition(1, hi=30, committed=5, desired=False),  # another member's
        partition(2),  # assigned, no fetch response yet: its end is not known
    )
    assert lag_from_statistics(stats) == {(TOPIC, 0): 10}


class Lags:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.gauge = Gauge(
            "consumer_lag", "lag", ["reader", "topic", "partition"], registry=self.registry
        )

    def reader(self, name: str) -> ConsumerLag:
        return ConsumerLag(name, gauge=self.gauge)

    def value(self, reader: str, partition: int, topic: str = TOPIC) -> float | None:
        labels = {"reader": reader, "topic": topic, "partition": str(partition)}
        return self.registry.get_sample_value("consumer_lag", labels)


def test_statistics_feed_the_gauge_and_a_revoked_partition_leaves_it() -> None:
    lags = Lags()
    reader = lags.reader("svc_trainer")
    config = reader.client_config()
    assert config["statistics.interval.ms"] > 0
    report = config["stats_cb"]
    report(json.dumps(statistics(partition(0, hi=9, committed=2), partition(1, hi=4, committed=4))))
    assert (lags.value("svc_trainer", 0), lags.value("svc_trainer", 1)) == (7, 0)
    report(json.dumps(statistics(partition(0, hi=9, committed=9))))  # 1 moved away
    assert (lags.value("svc_trainer", 0), lags.value("svc_trainer", 1)) == (0, None)
    reader.close()
    assert lags.value("svc_trainer", 0) is None
    report(json.dumps(statistics(partition(0, hi=9, committed=2))))  # one served late
    assert lags.value("svc_trainer", 0) is None


def test_a_statistics_document_it_cannot_read_never_reaches_the_poll() -> None:
    lags = Lags()
    reader = lags.reader("svc_tuner")
    reader.on_statistics("{not json")
    reader.on_statistics(json.dumps({"topics": {TOPIC: {"partitions": {"0": {"partition": "x"}}}}}))
    reader.on_statistics(json.dumps(statistics(partition(0, hi=3, committed=1))))
    assert lags.value("svc_tuner", 0) == 2


def test_two_members_of_one_group_in_a_process_keep_each_others_series() -> None:
    lags = Lags()
    first, second = lags.reader("bench"), lags.reader("bench")
    first.set(TOPIC, 0, 4)
    second.set(TOPIC, 0, 6)  # the partition moved to the second member
    first.keep([])  # the first notices it lost it
    assert lags.value("bench", 0) == 6
    first.close()
    assert lags.value("bench", 0) == 6
    second.close()
    assert lags.value("bench", 0) is None


def test_readers_report_what_they_measured_themselves() -> None:
    lags = Lags()
    ingest = lags.reader("aistack-ingest")
    ingest.set("aistack.events.raw", 0, 3)
    ingest.set("aistack.events.raw", 1, 0)
    assert ingest.held == {("aistack.events.raw", 0), ("aistack.events.raw", 1)}
    ingest.keep([("aistack.events.raw", 1)])
    assert lags.value("aistack-ingest", 0, "aistack.events.raw") is None
    assert lags.value("aistack-ingest", 1, "aistack.events.raw") == 0
