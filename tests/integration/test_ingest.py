"""svc_ingest against the real broker: exact counts, crashes, several workers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from compose import kafka_dist
from loadgen.plan import generate
from loadgen.records import RawRecord
from svc_ingest.cleaner import content_hash
from tests.infra import Infra, wait_until
from tests.integration.ingest_worker import (
    Topics,
    Worker,
    Written,
    prepare,
    publish,
    read_outputs,
)

pytestmark = pytest.mark.timeout(300)


def mixed_records(count: int, seed: int) -> list[RawRecord]:
    """Sensor readings and web logs, 10% malformed and 5% duplicates, interleaved."""
    half = count // 2
    sensors = generate("sensors", half, bad_fraction=0.1, duplicate_fraction=0.05, seed=seed)
    weblogs = generate(
        "weblogs", count - half, bad_fraction=0.1, duplicate_fraction=0.05, seed=seed + 1
    )
    # Interleave, keeping each stream's own order (a duplicate after its original).
    mixed = [r for pair in zip(sensors, weblogs, strict=False) for r in pair]
    return mixed + sensors[len(weblogs) :] + weblogs[len(sensors) :]


def expected_clean_ids(records: list[RawRecord]) -> Counter[str]:
    return Counter(
        r.event_id or content_hash(r.value or b"") for r in records if r.expected == "clean"
    )


def assert_exact(
    records: list[RawRecord], written: Written, workers: Sequence[Worker] = ()
) -> None:
    """Every clean event once and every dead letter once. On a mismatch the
    failure is short and ends with each worker's state and last log lines:
    CI shows only the tail of a failure, and a diff of thousands of ids
    would fill it without saying why they were missing."""
    clean = expected_clean_ids(records)
    doubled = sorted(event_id for event_id, n in written.clean_ids.items() if n > 1)
    missing = sorted((clean - written.clean_ids).elements())
    unexpected = sorted((written.clean_ids - clean - Counter(doubled)).elements())
    if doubled or missing or unexpected:
        pytest.fail(
            f"clean: {written.clean_ids.total()} written, {clean.total()} expected; "
            f"{len(missing)} missing (e.g. {missing[:3]}), {len(doubled)} written twice "
            f"(e.g. {doubled[:3]}), {len(unexpected)} not expected (e.g. {unexpected[:3]})"
            + "".join(worker.describe() for worker in workers)
            + f"\nin {os.environ.get('PYTEST_CURRENT_TEST', '?')}",
            pytrace=False,
        )
    bad = [r for r in records if r.expected == "dead_letter"]
    assert written.dead_letter_count == len(written.dead_letters) == len(bad)
    assert Counter(written.dead_letters.values()) == Counter(r.reason for r in bad)


@pytest.fixture
def topics(infra: Infra, unique: str) -> Topics:
    created = Topics.unique(unique)
    prepare(infra, created)
    return created


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.close()


def test_ten_thousand_mixed_events_end_exactly_once(
    infra: Infra, topics: Topics, workers: list[Worker], tmp_path: Path
) -> None:
    records = mixed_records(10_000, seed=3)
    publish(infra, topics.raw, records)
    worker = Worker(infra, topics, tmp_path / "w1")
    workers.append(worker)
    worker.wait_ready()

    written = read_outputs(infra.kafka, topics, expected_total=9_500)

    assert_exact(records, written, workers)
    duplicates = sum(r.expected == "duplicate" for r in records)
    assert duplicates == 500
    wait_until(
        lambda: worker.counter("ingest_records_in_total") == 10_000,
        30,
        "records_in never reached 10000",
    )
    assert worker.counter("ingest_records_total", '{outcome="duplicate"}') == duplicates
    assert worker.counter("ingest_records_total", '{outcome="clean"}') == 9_000 - 500
    assert worker.counter("ingest_records_total", '{outcome="dead_letter"}') == 1_000
    # The oversized records travelled to the dead-letter topic whole.
    large = [d for d in written.dead_letters_raw if d.reason == "too_large"]
    assert large and all(len(d.original_value) > 1_048_576 for d in large)
    # A dead letter says where its record came from and keeps its headers.
    letter = written.dead_letters_raw[0]
    assert letter.source.topic == topics.raw and letter.service == "svc_ingest" and letter.message
    # SIGTERM: finishes, commits, exits 0; a restart has nothing left to do.
    assert worker.terminate() == 0
    again = Worker(infra, topics, tmp_path / "w1")
    workers.append(again)
    again.wait_ready()
    time.sleep(3)
    assert again.counter("ingest_records_in_total") == 0


def test_at_least_once_worker_writes_each_outcome_once_without_a_crash(
    infra: Infra, topics: Topics, workers: list[Worker], tmp_path: Path
) -> None:
    """The configurable guarantee: plain producer, outputs before the dedup ids."""
    records = mixed_records(2_000, seed=5)
    worker = Worker(
        infra,
        topics,
        tmp_path / "w",
        extra_env={"AISTACK_INGEST_PROCESSING_GUARANTEE": "at_least_once"},
    )
    workers.append(worker)
    worker.wait_ready()
    publish(infra, topics.raw, records)

    written = read_outputs(infra.kafka, topics, expected_total=1_900)

    assert_exact(records, written, workers)
    assert worker.terminate() == 0


def test_kill_9_mid_stream_and_restart_keeps_counts_exact(
    infra: Infra, topics: Topics, workers: list[Worker], tmp_path: Path
) -> None:
    records = mixed_records(10_000, seed=11)
    worker = Worker(infra, topics, tmp_path / "w")
    workers.append(worker)
    worker.wait_ready()
    # The stream goes on after the kill: a worker that cleans the first part
    # before the kill lands (10,000 records take it under a second) still
    # leaves the restarted one records to clean.
    publish(infra, topics.raw, records[:6_000])
    wait_until(
        lambda: worker.counter("ingest_records_in_total") >= 3_000,
        60,
        "the worker made no progress before the kill",
    )
    worker.kill()
    publish(infra, topics.raw, records[6_000:])
    restarted = Worker(infra, topics, tmp_path / "w")
    workers.append(restarted)
    restarted.wait_ready(timeout=90)

    written = read_outputs(infra.kafka, topics, expected_total=9_500, timeout=120)

    assert_exact(records, written, workers)
    # The rest of the stream was the restarted worker's to clean.
    assert restarted.counter("ingest_records_in_total") > 0


def test_a_worker_restarted_under_its_instance_id_takes_its_partitions_back_at_once(
    infra: Infra, topics: Topics, workers: list[Worker], tmp_path: Path
) -> None:
    """Static membership: the restarted worker rejoins the generation the killed
    one left, with no rebalance; a dynamic member would first wait out the
    minute-long session timeout for the dead one to be dropped."""
    env = {
        "AISTACK_INGEST_INSTANCE_ID": "ingest-static-1",
        "AISTACK_INGEST_SESSION_TIMEOUT_SECONDS": "60",
    }
    records = mixed_records(6_000, seed=13)
    worker = Worker(infra, topics, tmp_path / "w", extra_env=env)
    workers.append(worker)
    worker.wait_ready()
    publish(infra, topics.raw, records[:3_000])
    wait_until(
        lambda: worker.counter("ingest_records_in_total") >= 2_000,
        60,
        "the worker made no progress before the kill",
    )
    worker.kill()
    # The rest only now: the killed worker may have finished the first half
    # before the kill landed, and the restarted one must have work to show.
    publish(infra, topics.raw, records[3_000:])
    restarted = Worker(infra, topics, tmp_path / "w", extra_env=env)
    workers.append(restarted)
    restarted.wait_ready(timeout=90)

    written = read_outputs(infra.kafka, topics, expected_total=5_700, timeout=120)

    assert_exact(records, written, workers)
    assert restarted.counter("ingest_records_in_total") > 0
    (before,) = joined_generations(worker)
    assert joined_generations(restarted) == [before], restarted.log_text()[-3000:]


def joined_generations(worker: Worker) -> list[int]:
    """The group generations a worker joined, from aiokafka's log lines."""
    return [
        int(found)
        for found in re.findall(r"Joined group '[^']*' \(generation (\d+)\)", worker.log_text())
    ]


def test_two_workers_share_the_partitions(
    infra: Infra, topics: Topics, workers: list[Worker], tmp_path: Path
) -> None:
    first, second = (
        Worker(
            infra, topics, tmp_path / name, extra_env={"AISTACK_KAFKA_CLIENT_ID": f"ingest-{name}"}
        )
        for name in ("a", "b")
    )
    workers += [first, second]
    first.wait_ready()
    second.wait_ready()
    records = mixed_records(10_000, seed=21)
    publish(infra, topics.raw, records)

    written = read_outputs(infra.kafka, topics, expected_total=9_500, timeout=180)

    assert_exact(records, written, workers)
    assert first.counter("ingest_records_in_total") > 0
    assert second.counter("ingest_records_in_total") > 0
    # AISTACK_KAFKA_CLIENT_ID reaches the broker: it names each worker's consumer there.
    assert group_client_ids(infra, topics.app_id) == {"ingest-a", "ingest-b"}


def group_client_ids(infra: Infra, group: str) -> set[str]:
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(infra.kafka.client_config())
    (described,) = admin.describe_consumer_groups([group]).values()
    found = described.result(timeout=30)
    assert found.state == ConsumerGroupState.STABLE
    return {member.client_id for member in found.members}


def test_raw_json_from_a_non_python_producer_is_cleaned(
    infra: Infra, topics: Topics, workers: list[Worker], tmp_path: Path
) -> None:
    """Kafka's own console producer (Java) writes JSON lines with keys, no headers."""
    home = kafka_dist.ensure_kafka_jars(infra_cache_dir())
    now = int(time.time())
    lines = [
        "thermo-1|"
        + json.dumps(
            {
                "event_id": f"java-{i}",
                "device_id": "thermo-1",
                "timestamp": now - i,
                "metrics": {"temperature": {"value": 68 + i, "unit": "F"}},
            }
        )
        for i in range(5)
    ]
    lines.append(
        f'web-1|{{"host": "web-1", "time": {now}, "request": "GET / HTTP/1.1", "status": 200}}'
    )
    lines.append("thermo-1|{not json")
    java = shutil.which("java")
    assert java is not None
    subprocess.run(
        [
            java,
            "-cp",
            f"{home / 'libs'}/*",
            "kafka.tools.ConsoleProducer",
            "--bootstrap-server",
            infra.kafka.bootstrap,
            "--topic",
            topics.raw,
            "--property",
            "parse.key=true",
            "--property",
            "key.separator=|",
        ],
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        timeout=120,
        capture_output=True,
    )
    worker = Worker(infra, topics, tmp_path / "w")
    workers.append(worker)
    worker.wait_ready()

    written = read_outputs(infra.kafka, topics, expected_total=7, quiet=2)

    assert {f"java-{i}" for i in range(5)} <= set(written.clean_ids)
    assert sum(written.clean_ids.values()) == 6
    assert list(written.dead_letters.values()) == ["invalid_json"]


def infra_cache_dir() -> Path:
    from shared.settings import CommonSettings

    return Path(CommonSettings().cache_dir)


def test_ids_are_forgotten_after_the_dedup_window(
    infra: Infra, topics: Topics, workers: list[Worker], tmp_path: Path
) -> None:
    worker = Worker(
        infra, topics, tmp_path / "w", extra_env={"AISTACK_INGEST_DEDUP_WINDOW_SECONDS": "1"}
    )
    workers.append(worker)
    worker.wait_ready()
    records = generate("sensors", 2, fmt="json", seed=5)
    first, filler = records

    publish(infra, topics.raw, [first, first])  # a retry within the window
    wait_until(lambda: worker.counter("ingest_records_in_total") == 2, 30, "not processed")
    time.sleep(2.5)
    publish(infra, topics.raw, [filler])  # its batch expires what is older than 1 s
    wait_until(lambda: worker.counter("ingest_records_in_total") == 3, 30, "not processed")
    publish(infra, topics.raw, [first])  # long after: counts again

    written = read_outputs(infra.kafka, topics, expected_total=3, quiet=2)
    assert written.clean_ids == Counter({first.event_id: 2, filler.event_id: 1})
    assert worker.counter("ingest_records_total", '{outcome="duplicate"}') == 1
    assert tombstones_in(infra, f"{topics.app_id}-dedup-changelog") >= 1


def tombstones_in(infra: Infra, topic: str) -> int:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            **infra.kafka.client_config(),
            "group.id": f"tombstones-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    found = 0
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            for record in consumer.consume(100, timeout=0.5):
                if not record.error() and record.value() is None:
                    found += 1
    finally:
        consumer.close()
    return found


def test_device_payloads_of_every_accepted_shape_are_cleaned(
    infra: Infra, topics: Topics, workers: list[Worker], tmp_path: Path
) -> None:
    """A flat reading, a SenML pack, a Telegraf batch and line protocol, through the worker."""
    now = int(time.time())

    def record(key: bytes, value: bytes, content_type: str) -> RawRecord:
        headers = [("content-type", content_type.encode())] if content_type else []
        return RawRecord(key, value, tuple(headers), "clean", "", "")

    flat = {
        "event_id": "flat-1",
        "device_id": "thermo-9",
        "timestamp": now,
        "metric": "temperature",
        "value": 68,
        "unit": "F",
    }
    pack = [
        {"bn": "urn:dev:ow:10e2073a01080063:", "bt": now, "bu": "Cel"},
        {"n": "temperature", "v": 21.5},
        {"n": "temperature", "t": -10, "v": 21.0},
    ]
    metric = {"name": "env", "tags": {"device": "sensor-7"}, "fields": {"co2": 415}}
    telegraf = {"metrics": [{**metric, "timestamp": now}, {**metric, "timestamp": now - 1}]}
    lines = f"env,host=gw-1 co2=400i {now}000000000\nenv,host=gw-1 co2=401i {now - 1}000000000"
    sums = [{"bn": "dev-1:", "n": "energy", "s": 10}]
    records = [
        record(b"thermo-9", json.dumps(flat).encode(), "application/json"),
        record(b"dev", json.dumps(pack).encode(), ""),  # a JSON array, sniffed as SenML
        record(b"sensor-7", json.dumps(telegraf).encode(), "application/json"),
        record(b"gw-1", lines.encode(), "text/plain"),
        record(b"dev-1", json.dumps(sums).encode(), "application/senml+json"),
    ]
    publish(infra, topics.raw, records)
    worker = Worker(infra, topics, tmp_path / "w")
    workers.append(worker)
    worker.wait_ready()

    written = read_outputs(infra.kafka, topics, expected_total=8, quiet=2)

    several = [content_hash(r.value or b"") for r in records[1:4]]
    assert written.clean_ids == Counter(
        ["flat-1", *(f"{base}-{i}" for base in several for i in (0, 1))]
    )
    assert list(written.dead_letters.values()) == ["invalid_field"]
    events = clean_events_in(infra, topics.clean)
    readings = sorted(
        (e.entity_id, m.metric, round(m.value, 6), m.unit)
        for e in events
        for m in e.sensor_reading.measurements
    )
    senml_device = "urn:dev:ow:10e2073a01080063"
    assert [r[0] for r in readings] == sorted(
        ["gw-1", "gw-1", "sensor-7", "sensor-7", "thermo-9", senml_device, senml_device]
    )
    by_entity = set(readings)
    assert ("thermo-9", "temperature", 20.0, "degC") in by_entity
    assert (senml_device, "temperature", 21.5, "degC") in by_entity
    assert ("sensor-7", "env.co2", 415.0, "") in by_entity
    assert ("gw-1", "env.co2", 401.0, "") in by_entity
    # Each clean event names the raw record it came from: one per entity here.
    sources: dict[str, set[tuple[str, int, int]]] = {}
    for e in events:
        sources.setdefault(e.entity_id, set()).add(
            (e.source.topic, e.source.partition, e.source.offset)
        )
    assert len(sources) == 4
    assert all(len(found) == 1 and next(iter(found))[0] == topics.raw for found in sources.values())


def clean_events_in(infra: Infra, topic: str) -> list[Any]:
    from confluent_kafka import Consumer

    from shared.contracts.aistack.v1 import events_pb2

    consumer = Consumer(
        {
            **infra.kafka.client_config(),
            "group.id": f"clean-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    found = []
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            for record in consumer.consume(100, timeout=0.5):
                if not record.error():
                    found.append(events_pb2.CleanEvent.FromString(record.value()))
    finally:
        consumer.close()
    return found
