"""How soon a restarted Kafka broker answers: the local launcher's, which
maps the broker JVM's class archive (``compose.kafka_class_archive``),
against the same broker started as Apache Kafka ships it (the same jars,
heap and flags, no archive).

``python -m bench.broker_start [--rounds 5]`` starts one broker of its own (on
free ports, in a throw-away state directory), then restarts it ``rounds``
times each way, the two ways in alternating order; a restart is timed from
SIGTERM's end (the broker gone) to the cluster counting it again. Prints the
median of each and ``broker_restart_vs_stock: ratio R (goal G)``, stock
over the launcher's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench import profiling
from bench.harness import print_ratio, round_order
from compose import kafka_class_archive
from compose.local import LocalStack
from shared.settings import CommonSettings

GOAL = 1.5
WAYS = ("archive", "stock")


def restart(stack: LocalStack, options: list[str]) -> float:
    """Seconds from the broker stopped to it answering again, started with ``options``."""
    stack.stop_server(stack.kafka.name)
    stack.jvm_options = options
    started = time.perf_counter()
    stack.start_brokers()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    profiling.add_flag(parser, "broker_start")
    rounds = parser.parse_args().rounds

    cache = CommonSettings().cache_dir
    # Built by make setup: a no-op here, unless the cache was emptied since.
    archived = [f"-XX:SharedArchiveFile={kafka_class_archive.ensure(cache)}"]
    options = {"archive": archived, "stock": []}
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="aistack-bench-") as tmp:
        stack = LocalStack(kafka_class_archive.one_broker_settings(cache, Path(tmp)))
        stack.start_brokers()
        try:
            for number in range(rounds):
                for way in round_order(WAYS, number):
                    seconds[way].append(restart(stack, options[way]))
        finally:
            stack.down()
    median = {way: statistics.median(seconds[way]) for way in WAYS}
    for way in WAYS:
        runs = ", ".join(f"{s:.2f}" for s in seconds[way])
        print(f"broker restart, {way}: median {median[way]:.2f} s ({runs})", flush=True)
    print_ratio("broker_restart_vs_stock", median["stock"] / median["archive"], GOAL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
