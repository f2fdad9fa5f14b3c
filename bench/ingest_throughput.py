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
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from bench.harness import ROOT, kafka_settings, print_ratio, python_module, round_order
from bench.services import fill, run_worker
from shared.bus.topics import TopicSpec, ensure_topics
from shared.settings import KafkaSettings

GOAL_RATIO = 0.5
GOAL_RATE = 20_000.0


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
    """The passthrough in a process of its own, as the worker runs in its own."""
    out = subprocess.run(
        python_module("bench.ingest_throughput", "--passthrough", source, "--count", str(count)),
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passthrough", metavar="TOPIC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    kafka = kafka_settings()
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
            rates: dict[str, float] = {}
            for who in round_order(("passthrough", "cleaner"), round_):
                if who == "passthrough":
                    rates[who] = run_passthrough(source, args.count)
                else:
                    rates[who] = run_worker(kafka, source, args.count, Path(state))
            cleaner, bare = rates["cleaner"], rates["passthrough"]
            print(f"round {round_ + 1}: cleaner {cleaner:,.0f}/s, passthrough {bare:,.0f}/s")
            ratios.append(cleaner / bare)
            cleaner_rates.append(cleaner)
            bare_rates.append(bare)
    print(f"cleaner (median): {statistics.median(cleaner_rates):,.0f} events/s")
    print(f"passthrough (median): {statistics.median(bare_rates):,.0f} events/s")
    print_ratio("cleaner_vs_passthrough", statistics.median(ratios), GOAL_RATIO)
    print_ratio("cleaner_vs_20k_per_s", statistics.median(cleaner_rates) / GOAL_RATE, 1.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
