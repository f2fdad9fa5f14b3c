"""svc_ingest's cleaning worker against a bare aiokafka consume → produce passthrough.

Both read the same pre-filled topic of ~200-byte JSON sensor events on the
same broker, each in its own process, alternating which goes first. The
worker runs as deployed (``python -m svc_ingest``: exactly_once, dedup table
on RocksDB); its rate is read off its own records-in counter. Prints:

    cleaner_vs_passthrough: ratio R (goal 0.5)
    cleaner_vs_20k_per_s: ratio R (goal 1.0)

Needs a broker: ``aistack infra up`` (or AISTACK_KAFKA_BOOTSTRAP).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.bus.producer import BusProducer  # noqa: E402
from shared.bus.topics import TopicSpec, ensure_topics  # noqa: E402
from shared.ports import free_port  # noqa: E402
from shared.settings import KafkaSettings, load_settings  # noqa: E402

GOAL_RATIO = 0.5
GOAL_RATE = 20_000.0


def sensor_event(i: int, now: float) -> bytes:
    doc = {
        "event_id": uuid.UUID(int=i + (1 << 64)).hex,
        "device_id": f"thermo-{i % 500:04d}",
        "timestamp": round(now - (i % 3600), 3),
        "metrics": {
            "temperature": {"value": 15 + (i % 200) / 10, "unit": "C"},
            "humidity": {"value": 30 + i % 50, "unit": "%"},
        },
        "site": "plant-a",
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def fill(kafka: KafkaSettings, topic: str, count: int) -> int:
    ensure_topics(kafka, [TopicSpec(topic, None)])
    producer = BusProducer(kafka, source="bench")
    now = time.time()
    size = 0
    for i in range(count):
        value = sensor_event(i, now)
        size += len(value)
        producer.publish_raw(
            topic,
            value,
            key=f"thermo-{i % 500:04d}".encode(),
            headers=[("content-type", b"application/json")],
        )
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush()
    return size // count


async def passthrough(kafka: KafkaSettings, source: str, target: str, count: int) -> float:
    """Bare aiokafka: read, forward each record unchanged, commit per batch."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    config = kafka.aiokafka_config()
    consumer = AIOKafkaConsumer(
        source,
        group_id=f"bench-passthrough-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        **config,
    )
    producer = AIOKafkaProducer(
        compression_type="lz4", linger_ms=5, max_batch_size=512 * 1024, acks="all", **config
    )
    await consumer.start()
    await producer.start()
    seen = 0
    started = 0.0
    try:
        while seen < count:
            batch = await consumer.getmany(timeout_ms=1000, max_records=2000)
            if batch and not started:
                started = time.perf_counter()
            pending = []
            for records in batch.values():
                for record in records:
                    pending.append(
                        await producer.send(
                            target, record.value, key=record.key, headers=list(record.headers)
                        )
                    )
                seen += len(records)
            if pending:
                await asyncio.gather(*pending)
                await consumer.commit()
        return seen / (time.perf_counter() - started)
    finally:
        await consumer.stop()
        await producer.stop()


def run_passthrough(source: str, count: int) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--passthrough", source, "--count", str(count)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return float(out.stdout.strip().splitlines()[-1])


def run_worker(kafka: KafkaSettings, source: str, count: int, state: Path) -> float:
    """Start a worker on ``source``; its rate from first to last record, by its counter."""
    suffix = uuid.uuid4().hex[:8]
    port = free_port()
    env = {
        **os.environ,
        "AISTACK_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "AISTACK_STATE_DIR": str(state),
        "AISTACK_LOG_LEVEL": "WARNING",
        "AISTACK_INGEST_APP_ID": f"bench-ingest-{suffix}",
        "AISTACK_INGEST_SOURCE_TOPIC": source,
        "AISTACK_INGEST_CLEAN_TOPIC": f"bench.clean.{suffix}",
        "AISTACK_INGEST_DLQ_TOPIC": f"bench.dlq.{suffix}",
        "AISTACK_INGEST_METRICS_PORT": str(port),
        "AISTACK_INGEST_MAX_FUTURE_SKEW_SECONDS": "86400",
    }
    log = (state / f"worker-{suffix}.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "svc_ingest"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        first_at = first_n = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if worker.poll() is not None:
                raise RuntimeError(f"worker exited {worker.returncode}; see {log.name}")
            seen = _records_in(port)
            now = time.perf_counter()
            if seen and first_at is None:
                first_at, first_n = now, seen
            if seen >= count and first_at is not None and first_n is not None:
                return (seen - first_n) / (now - first_at)
            time.sleep(0.2)  # scraping is not free: keep it out of the measurement
        raise RuntimeError("worker did not finish in time")
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        log.close()


def _records_in(port: int) -> float:
    return read_metric(port, "aistack_ingest_records_in_total")


def read_metric(port: int, series: str) -> float:
    """``series`` (name and labels) from a process's /metrics; 0 before it answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    wanted = f"{series} "
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(wanted))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passthrough", metavar="TOPIC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    kafka = load_settings(KafkaSettings)
    if args.passthrough:
        target = f"bench.passthrough.{uuid.uuid4().hex[:8]}"
        ensure_topics(kafka, [TopicSpec(target, None)])
        print(asyncio.run(passthrough(kafka, args.passthrough, target, args.count)))
        return 0

    source = f"bench.raw.{uuid.uuid4().hex[:8]}"
    size = fill(kafka, source, args.count)
    print(f"{args.count} JSON sensor events of {size} bytes in {source}")
    ratios, cleaner_rates, bare_rates = [], [], []
    with tempfile.TemporaryDirectory(prefix="aistack-bench-") as state:
        for round_ in range(args.rounds):
            if round_ % 2 == 0:
                bare = run_passthrough(source, args.count)
                cleaner = run_worker(kafka, source, args.count, Path(state))
            else:
                cleaner = run_worker(kafka, source, args.count, Path(state))
                bare = run_passthrough(source, args.count)
            print(f"round {round_ + 1}: cleaner {cleaner:,.0f}/s, passthrough {bare:,.0f}/s")
            ratios.append(cleaner / bare)
            cleaner_rates.append(cleaner)
            bare_rates.append(bare)
    print(f"cleaner (median): {statistics.median(cleaner_rates):,.0f} events/s")
    print(f"passthrough (median): {statistics.median(bare_rates):,.0f} events/s")
    print(f"cleaner_vs_passthrough: ratio {statistics.median(ratios):.2f} (goal {GOAL_RATIO})")
    rate_ratio = statistics.median(cleaner_rates) / GOAL_RATE
    print(f"cleaner_vs_20k_per_s: ratio {rate_ratio:.2f} (goal 1.0)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
