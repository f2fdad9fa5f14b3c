"""The ``aistack`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from compose import predict, study
from shared.errors import AistackError
from shared.settings import load_settings


def _infra(args: argparse.Namespace) -> int:
    from compose import kafka_dist, spark_dist
    from compose.local import LocalStack
    from compose.settings import InfraSettings

    settings = load_settings(InfraSettings)
    if args.action == "fetch":
        cache = settings.common.cache_dir
        home = kafka_dist.ensure_kafka_jars(cache)
        print(f"kafka {kafka_dist.KAFKA_VERSION} jars in {home / 'libs'}")
        jars = spark_dist.ensure_connector_jars(cache)
        print(f"spark {spark_dist.SPARK_VERSION} connectors: {len(jars)} jars in {jars[0].parent}")
        if spark_dist.pyspark_installed():
            print(f"svc_transform functions: {spark_dist.ensure_functions_jar(cache)}")
        return 0
    stack = LocalStack(settings)
    if args.action == "up":
        statuses = stack.up()
    elif args.action == "down":
        statuses = stack.down()
    else:
        statuses = stack.status()
    for s in statuses:
        state = f"running (pid {s.pid})" if s.running else "stopped"
        print(f"{s.name:<6} {state:<22} {s.address:<28} log: {s.log_file}")
    if args.action == "status":
        return 0 if all(s.running for s in statuses) else 3
    return 0


def _produce(args: argparse.Namespace) -> int:
    from loadgen.publish import run

    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="aistack", description="aistack: the event-driven ML platform"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    infra = commands.add_parser("infra", help="the local Kafka (KRaft) and Redis servers")
    infra.add_argument("action", choices=["up", "down", "status", "fetch"])
    infra.set_defaults(run=_infra)
    # Values are strings here and checked by loadgen, so a bad one is one line.
    produce = commands.add_parser(
        "produce", help="publish synthetic raw events (good, bad, duplicate) to Kafka"
    )
    produce.add_argument("kind", metavar="{sensors,weblogs}")
    produce.add_argument("--rate", help="events per second; 0 = as fast as possible")
    produce.add_argument("--count", help="how many records in all")
    produce.add_argument("--bad-fraction", default="0", help="share of malformed records")
    produce.add_argument(
        "--duplicate-fraction", default="0", help="share of exact re-sends of good records"
    )
    produce.add_argument(
        "--format", default="mixed", metavar="{json,protobuf,log,mixed}", help="payload format"
    )
    produce.add_argument("--seed", help="random seed (default: random, printed at the end)")
    produce.add_argument("--topic", help="target topic (default: aistack.events.raw)")
    produce.set_defaults(run=_produce)
    study.add_parser(commands)
    predict.add_parser(commands)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except AistackError as exc:
        print(f"aistack: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
