"""svc_ingest's cleaning worker against three peers: a bare aiokafka
passthrough, a stock Faust agent and a Quix Streams application.

One topic is pre-filled with ~200-byte JSON sensor events
(``bench.services.fill``). In each round the worker and every peer read all
of it from the earliest offset, each in a process of its own, in an order
that alternates per round (``bench.harness.round_order``), each writing to
clean and dead-letter topics of its own. What is the same for all of them:

* the settings: ``AISTACK_INGEST_*`` as ``bench.services.ingest_env`` sets
  them, read through ``IngestSettings``; the processing guarantee
  (``--guarantee``, default svc_ingest's deployed one) and the commit
  interval (svc_ingest's ``commit_interval_seconds`` default, 1.0 s);
* the event loop: uvloop, except Quix Streams, which has none;
* the producer and fetch settings: lz4, 5 ms linger, 512 KiB batches,
  4 MiB fetches;
* the work, except the passthrough's: ``Cleaner.clean_all`` on each record,
  its clean events (or dead letter) serialized and published as svc_ingest
  does (``bench.ingest_peers.RecordOutputs``);
* the measure: records per second from the first record seen to the
  ``count``-th.

The worker runs as deployed (``python -m svc_ingest``: batches of up to
5,000 records, batch builders, dedup table on RocksDB); its rate is read off
its records-in counter. What each peer does, and what it does not (none
keeps a dedup table), is ``bench.ingest_peers``' docstring. Prints:

    guarantee: exactly_once, commit interval 1.0 s
    cleaner_vs_passthrough: ratio R (goal 0.4)
    cleaner_vs_stock_faust: ratio R (goal 3.0)
    cleaner_vs_quixstreams: ratio R (goal 2.0)
    cleaner_vs_20k_per_s: ratio R (goal 1.0) [aistack against itself]

Each ratio is the median over rounds of the worker's rate over the peer's.
Needs a broker: ``aistack infra up`` (or AISTACK_KAFKA_BOOTSTRAP).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import uuid
from pathlib import Path

from bench import profiling
from bench.harness import kafka_settings, print_ratio, round_order
from bench.ingest_peers import PEERS, run_peer
from bench.services import fill, ingest_env, run_worker
from svc_ingest.settings import IngestSettings

CLEANER = "cleaner"
GOALS = {"passthrough": 0.4, "stock_faust": 3.0, "quixstreams": 2.0}
GOAL_RATE = 20_000.0


def default_guarantee() -> str:
    return str(IngestSettings.model_fields["processing_guarantee"].default)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--guarantee", choices=("exactly_once", "at_least_once"), default=default_guarantee()
    )
    profiling.add_flag(parser, "ingest_throughput")
    args = parser.parse_args()
    kafka = kafka_settings()
    interval = IngestSettings.model_fields["commit_interval_seconds"].default
    print(f"guarantee: {args.guarantee}, commit interval {interval} s")

    source = f"bench.raw.{uuid.uuid4().hex[:8]}"
    size = fill(kafka, source, args.count)
    print(f"{args.count} JSON sensor events of {size} bytes in {source}")
    rates: dict[str, list[float]] = {who: [] for who in (CLEANER, *PEERS)}
    with tempfile.TemporaryDirectory(prefix="aistack-bench-") as state:
        for round_ in range(args.rounds):
            for who in round_order((CLEANER, *PEERS), round_):
                if who == CLEANER:
                    rate = run_worker(kafka, source, args.count, Path(state), args.guarantee)
                else:
                    suffix = uuid.uuid4().hex[:8]
                    env = ingest_env(kafka, source, suffix, guarantee=args.guarantee)
                    rate = run_peer(who, env, args.count)
                rates[who].append(rate)
            line = ", ".join(f"{who} {found[-1]:,.0f}/s" for who, found in rates.items())
            print(f"round {round_ + 1}: {line}", flush=True)
    for who, found in rates.items():
        print(f"{who} (median): {statistics.median(found):,.0f} events/s")
    cleaner = rates[CLEANER]
    for peer in PEERS:
        ratios = [mine / theirs for mine, theirs in zip(cleaner, rates[peer], strict=True)]
        print_ratio(f"cleaner_vs_{peer}", statistics.median(ratios), GOALS[peer])
    print_ratio("cleaner_vs_20k_per_s", statistics.median(cleaner) / GOAL_RATE, 1.0, itself=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
