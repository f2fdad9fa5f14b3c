"""bench.ingest_throughput's peers on the real broker: each does the work it
is measured for. The cleaning peers publish exactly the clean events and dead
letters ``Cleaner.clean_all`` decides; the passthrough forwards every record
unchanged. Committed transactions only, each record once."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from confluent_kafka import Consumer

from bench.ingest_peers import run_peer
from bench.services import ingest_env
from loadgen.plan import generate
from loadgen.records import RawRecord
from shared.bus import envelope
from shared.settings import KafkaSettings
from svc_ingest.cleaner import Cleaner
from svc_ingest.rejection import RecordRejected
from svc_ingest.settings import IngestSettings
from tests.infra import Infra
from tests.integration.ingest_worker import Topics, prepare, publish, read_outputs

pytestmark = pytest.mark.timeout(240)

COUNT = 300


@pytest.fixture(scope="module")
def records() -> list[RawRecord]:
    found = generate("sensors", COUNT, bad_fraction=0.05, seed=22)
    assert sum(r.expected == "dead_letter" for r in found) >= 10
    return found


def expected(records: list[RawRecord]) -> tuple[Counter[str], Counter[bytes]]:
    """Clean event ids and rejected values, as ``Cleaner.clean_all`` decides
    under the settings ``ingest_env`` gives the peers."""
    cleaner = Cleaner(IngestSettings(max_future_skew_seconds=86400).cleaning_rules())
    now_us = time.time_ns() // 1000
    ids: Counter[str] = Counter()
    rejected: Counter[bytes] = Counter()
    for r in records:
        content_type = envelope.parse_headers(list(r.headers)).content_type
        try:
            events = cleaner.clean_all(r.value, r.key, content_type, now_us)
        except RecordRejected:
            rejected[r.value or b""] += 1
            continue
        ids.update(event.event_id for event in events)
    return ids, rejected


def committed_values(kafka: KafkaSettings, topic: str, wanted: int) -> Counter[bytes]:
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": f"reader-{topic}-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    values: Counter[bytes] = Counter()
    deadline = time.monotonic() + 60
    quiet_from = None
    try:
        # Past ``wanted``, a second more: a record written twice shows up.
        while time.monotonic() < deadline:
            batch = [r for r in consumer.consume(500, timeout=0.5) if not r.error()]
            values.update(r.value() for r in batch)
            if values.total() >= wanted:
                quiet_from = quiet_from or time.monotonic()
                if time.monotonic() - quiet_from >= 1.0:
                    break
    finally:
        consumer.close()
    return values


def start(infra: Infra, unique: str, records: list[RawRecord]) -> Topics:
    topics = Topics.unique(unique)
    prepare(infra, topics)
    publish(infra, topics.raw, records)
    return topics


def run(infra: Infra, topics: Topics, peer: str, guarantee: str) -> float:
    env = ingest_env(
        infra.kafka, topics.raw, topics.app_id, guarantee=guarantee, extra=topics.env()
    )
    return run_peer(peer, env, COUNT, timeout=120)


@pytest.mark.parametrize(
    ("peer", "guarantee"),
    [
        (peer, guarantee)
        for peer in ("stock_faust", "quixstreams")
        for guarantee in ("exactly_once", "at_least_once")
    ],
)
def test_cleaning_peer_publishes_what_the_cleaner_decides(
    infra: Infra, unique: str, records: list[RawRecord], peer: str, guarantee: str
) -> None:
    topics = start(infra, unique, records)
    assert run(infra, topics, peer, guarantee) > 0
    ids, rejected = expected(records)
    written = read_outputs(infra.kafka, topics, COUNT, timeout=60, quiet=1.0)
    assert written.clean_ids == ids
    assert Counter(letter.original_value for letter in written.dead_letters_raw) == rejected
    assert all(letter.reason for letter in written.dead_letters_raw)


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_passthrough_forwards_every_record_once(
    infra: Infra, unique: str, records: list[RawRecord], guarantee: str
) -> None:
    topics = start(infra, unique, records)
    assert run(infra, topics, "passthrough", guarantee) > 0
    assert committed_values(infra.kafka, topics.clean, COUNT) == Counter(r.value for r in records)
