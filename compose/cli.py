"""The ``aistack`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from compose import demo, models, predict, study
from compose.settings import apply_infra_flags
from shared.errors import AistackError
from shared.settings import load_settings

if TYPE_CHECKING:
    from compose.stack import ServiceStatus


def _infra(args: argparse.Namespace) -> int:
    from compose import kafka_dist
    from compose.local import LocalStack
    from compose.settings import InfraSettings
    from svc_transform import jars as transform_jars

    apply_infra_flags(args)
    settings = load_settings(InfraSettings)
    if args.action == "fetch":
        cache = settings.common.cache_dir
        home = kafka_dist.ensure_kafka_jars(cache)
        print(f"kafka {kafka_dist.KAFKA_VERSION} jars in {home / 'libs'}")
        # svc_transform's own build: its Spark connectors and JVM functions.
        for line in transform_jars.build(cache).describe():
            print(line)
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
        print(f"{s.name:<7} {state:<22} {s.address:<28} log: {s.log_file}")
    if args.action == "up":
        # What a service started by hand needs to use this Kafka as `aistack up` does.
        exports = {"AISTACK_KAFKA_BOOTSTRAP": stack.kafka_bootstrap, **stack.topic_defaults()}
        print("services: " + " ".join(f"{key}={value}" for key, value in exports.items()))
        if stack.secure:
            print(
                f"secure: CA {stack.material.ca_cert}, passwords (one per principal) in "
                f"{stack.material.credentials}"
            )
    if args.action == "status":
        return 0 if all(s.running for s in statuses) else 3
    return 0


def _stack_line(status: ServiceStatus) -> str:
    pid = str(status.pid) if status.pid is not None else "-"
    return (
        f"{status.name:<14} {status.state:<8} {pid:<8} "
        f"{', '.join(status.addresses):<44} log: {status.log_file}"
    )


def _print_stack(statuses: list[ServiceStatus]) -> None:
    for status in statuses:
        print(_stack_line(status))
        if status.state == "exited":
            for line in (status.last_lines or "(empty log)").splitlines():
                print(f"    {line}")


def _stack(args: argparse.Namespace) -> int:
    from compose.settings import StackSettings
    from compose.stack import ServiceStack

    apply_infra_flags(args)
    stack = ServiceStack(load_settings(StackSettings))
    if args.command == "up":
        services = len(stack.names) - len(stack.infra.names)
        print(f"starting Kafka, Redis and {services} services …", flush=True)
        statuses = stack.up(progress=lambda s: print(f"ready: {s.name}", flush=True))
    elif args.command == "down":
        statuses = stack.down()
    else:
        statuses = stack.status()
    _print_stack(statuses)
    if args.command == "status":
        return 0 if all(s.state == "running" for s in statuses) else 3
    return 0


def _env(args: argparse.Namespace) -> int:
    """``export`` lines for a shell on the user's side of the stack: where
    everything is and, in secure mode, the client's credentials and tokens."""
    import shlex

    from compose.settings import StackSettings
    from compose.stack import ServiceStack

    stack = ServiceStack(load_settings(StackSettings))
    if stack.secure and not stack.infra.material.credentials.exists():
        raise AistackError("the secure stack has no credentials yet: run `aistack up` first")
    for key, value in stack.client_env().items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


def _logs(args: argparse.Namespace) -> int:
    from compose.logs import follow, last_lines
    from compose.settings import StackSettings
    from compose.stack import ServiceStack

    stack = ServiceStack(load_settings(StackSettings))
    names = [args.service] if args.service else stack.names
    files = {name: stack.log_file(name) for name in names}
    # One service: its lines as they are; several: each prefixed with its name.
    width = max(len(name) for name in names)

    def show(name: str, line: str) -> None:
        print(line if args.service else f"{name:<{width}} | {line}", flush=True)

    for name, path in files.items():
        for line in last_lines(path, args.lines).splitlines():
            show(name, line)
    if args.follow:
        try:
            for name, line in follow(files):
                show(name, line)
        except KeyboardInterrupt:
            pass
    return 0


def _non_negative(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {number}")
    return number


def _produce(args: argparse.Namespace) -> int:
    from loadgen.publish import run

    return run(args)


def _score(args: argparse.Namespace) -> int:
    from pathlib import Path

    from svc_score import app
    from svc_score.settings import ScoreSettings

    columns = tuple(c.strip() for c in args.columns.split(",") if c.strip()) if args.columns else ()
    try:
        scored = app.run(
            load_settings(ScoreSettings),
            args.model,
            input_path=args.input,
            output=Path(args.output),
            columns=columns,
            where=args.where or "",
            publish=args.publish,
            row_sources=args.row_sources,
        )
    except AistackError as exc:
        print(f"aistack score: {exc}", file=sys.stderr)
        return 1
    lineage = scored.lineage
    published = lineage.get("published")
    also = f" and {published['records']} records to {published['topic']}" if published else ""
    print(
        f"scored {scored.rows} rows with {lineage['model']} version {lineage['version']} "
        f"into {scored.output}{also}"
    )
    return 0


def _lineage(args: argparse.Namespace) -> int:
    import json

    from aistack import lineage
    from aistack.settings import LineageSettings

    try:
        tree = lineage.trace(load_settings(LineageSettings), args.target)
    except AistackError as exc:
        print(f"aistack lineage: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(tree.to_json(), indent=2, default=str))
    else:
        print("\n".join(tree.lines()))
    return 0


SECURE_HELP = (
    "Kafka over TLS with SCRAM and ACLs, Redis over TLS with ACL users, the gRPC servers "
    "with TLS and a token (AISTACK_INFRA_SECURE); fixed when the state's cluster is formatted"
)
BROKERS_HELP = (
    "Kafka brokers on this machine (AISTACK_INFRA_BROKERS; 3: replication factor 3, "
    "two in sync); fixed when the state's cluster is first formatted"
)


def parser() -> argparse.ArgumentParser:
    """The ``aistack`` command's parser: every subcommand and its options."""
    parser = argparse.ArgumentParser(
        prog="aistack", description="aistack: the event-driven ML platform"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    infra = commands.add_parser("infra", help="the local Kafka (KRaft) and Redis servers")
    infra.add_argument("action", choices=["up", "down", "status", "fetch"])
    infra.add_argument("--brokers", type=int, choices=range(1, 10), help=BROKERS_HELP)
    infra.add_argument("--secure", action="store_true", default=None, help=SECURE_HELP)
    infra.set_defaults(run=_infra)
    for command, help_text in (
        ("up", "start Kafka, Redis and every service as local processes; wait until ready"),
        ("down", "stop every service (SIGTERM, then SIGKILL), then Kafka and Redis"),
        ("status", "one line per service; exit status 3 when any is not running"),
    ):
        stack_command = commands.add_parser(command, help=help_text)
        stack_command.set_defaults(run=_stack)
        if command == "up":
            stack_command.add_argument(
                "--brokers", type=int, choices=range(1, 10), help=BROKERS_HELP
            )
            stack_command.add_argument(
                "--secure", action="store_true", default=None, help=SECURE_HELP
            )
    commands.add_parser(
        "env",
        help='export lines for the user\'s side of the stack (`eval "$(aistack env)"`): '
        "where it is and, in secure mode, the client's credentials",
    ).set_defaults(run=_env)
    logs = commands.add_parser("logs", help="the last lines of a service's log, or of all")
    logs.add_argument("service", nargs="?", help="kafka, redis, svc_… (default: every one)")
    logs.add_argument(
        "-n", "--lines", type=_non_negative, default=20, help="lines to show (default 20)"
    )
    logs.add_argument("-f", "--follow", action="store_true", help="follow until Ctrl-C")
    logs.set_defaults(run=_logs)
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
    score = commands.add_parser(
        "score", help="score a Parquet file with a model's version in a Spark job"
    )
    score.add_argument(
        "model",
        metavar="MODEL[@VERSION]",
        help="default version: the one served (AISTACK_MODEL_POLICY)",
    )
    score.add_argument("--input", required=True, help="Parquet file or directory to score")
    score.add_argument("--output", required=True, help="a new directory for the predictions")
    score.add_argument(
        "--columns",
        help="input columns, comma-separated, in the model's input order "
        "(default: the offline store's feature stats, for a model of that width)",
    )
    score.add_argument(
        "--where",
        help="score only the rows matching this Spark SQL condition, "
        "e.g. \"metric = 'temperature' AND window = 'tumbling-60s'\"",
    )
    score.add_argument(
        "--publish",
        action="store_true",
        help="also publish each scored row to aistack.predictions.batch "
        "(AISTACK_SCORE_PREDICTIONS_TOPIC), with its window's sources",
    )
    score.add_argument(
        "--row-sources",
        action="store_true",
        help="keep each row's sources (its window's clean-event offsets) in the output; "
        "each file's lineage in _lineage.json has them merged either way",
    )
    score.set_defaults(run=_score)
    lineage = commands.add_parser(
        "lineage", help="walk a prediction or a model version back to the raw records under it"
    )
    lineage.add_argument(
        "target", metavar="REQUEST_ID|MODEL@VERSION", help="a logged prediction's request id"
    )
    lineage.add_argument("--json", action="store_true", help="the tree as JSON")
    lineage.set_defaults(run=_lineage)
    study.add_parser(commands)
    models.add_parser(commands)
    predict.add_parser(commands)
    demo.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except AistackError as exc:
        print(f"aistack: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
