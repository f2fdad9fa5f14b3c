"""``aistack infra …``, ``up``, ``down``, ``status``, ``env`` and ``logs``:
the stack on this machine, run by the local launcher (``compose``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from aistack.cli import terminal
from shared.errors import AistackError
from shared.settings import load_settings

if TYPE_CHECKING:
    from compose.local import ServerStatus
    from compose.stack import ServiceStack, ServiceStatus

SECURE_HELP = (
    "Kafka over TLS with SCRAM and ACLs, Redis over TLS with ACL users, the gRPC servers "
    "with TLS and a token (AISTACK_INFRA_SECURE); fixed when the state's cluster is formatted"
)
BROKERS_HELP = (
    "Kafka brokers on this machine (AISTACK_INFRA_BROKERS; 3: replication factor 3, "
    "two in sync); fixed when the state's cluster is first formatted"
)

Brokers = Annotated[int | None, typer.Option(min=1, max=9, help=BROKERS_HELP)]
Secure = Annotated[bool, typer.Option("--secure", help=SECURE_HELP)]
ObjectStore = Annotated[
    bool,
    typer.Option(
        "--object-store",
        help="also an S3-compatible object store (S3Proxy) with the bucket "
        "'aistack'; later commands in this state directory run it too",
    ),
]

infra = typer.Typer(help="The local Kafka (KRaft) and Redis servers.", no_args_is_help=True)


@infra.command("up")
def infra_up(
    brokers: Brokers = None, secure: Secure = False, object_store: ObjectStore = False
) -> int:
    """Start Kafka and Redis (and the object store); print what a service
    started by hand needs."""
    return _infra("up", brokers, secure, object_store)


@infra.command("down")
def infra_down() -> int:
    """Stop Redis and Kafka."""
    return _infra("down")


@infra.command("status")
def infra_status() -> int:
    """One line per server; exit status 3 when any is not running."""
    return _infra("status")


@infra.command("fetch")
def infra_fetch() -> int:
    """Download Kafka's jars (and build its broker's class archive), build svc_transform's."""
    return _infra("fetch")


def _infra(
    action: str, brokers: int | None = None, secure: bool = False, object_store: bool = False
) -> int:
    from compose import kafka_class_archive, kafka_dist
    from compose import object_store as object_store_dist
    from compose.local import LocalStack
    from compose.settings import InfraSettings, apply_infra_flags
    from shared import hadoop_s3a
    from svc_transform import jars as transform_jars

    apply_infra_flags(brokers, secure, object_store)
    settings = load_settings(InfraSettings)
    if action == "fetch":
        cache = settings.common.cache_dir
        home = kafka_dist.ensure_kafka_jars(cache)
        print(f"kafka {kafka_dist.KAFKA_VERSION} jars in {home / 'libs'}")
        print(f"kafka broker class archive: {kafka_class_archive.ensure(cache)}")
        home = object_store_dist.ensure_jars(cache)
        print(f"s3proxy {object_store_dist.S3PROXY_VERSION} jars in {home / 'libs'}")
        s3a = hadoop_s3a.ensure_jars(cache)
        print(f"hadoop {hadoop_s3a.HADOOP_VERSION} S3A: {len(s3a)} jars in {s3a[0].parent}")
        # svc_transform's own build: its Spark connectors and JVM functions.
        for line in transform_jars.build(cache).describe():
            print(line)
        return 0
    stack = LocalStack(settings)
    if action == "up":
        statuses = stack.up()
    elif action == "down":
        statuses = stack.down()
    else:
        statuses = stack.status()
    _print_infra(statuses)
    if action == "up":
        # What a service started by hand needs to use this Kafka as `aistack up` does.
        exports = {"AISTACK_KAFKA_BOOTSTRAP": stack.kafka_bootstrap, **stack.topic_defaults()}
        print("services: " + " ".join(f"{key}={value}" for key, value in exports.items()))
        if stack.object_store is not None:
            secret = stack.object_store_server.directory / "credentials.json"
            print(
                f"object store: {stack.object_store.address}, bucket "
                f"s3://{object_store_dist.BUCKET}, path-style, key "
                f"{object_store_dist.ACCESS_KEY_ID} (its secret in {secret})"
            )
        if stack.secure:
            print(
                f"secure: CA {stack.material.ca_cert}, passwords (one per principal) in "
                f"{stack.material.credentials}"
            )
    if action == "status":
        return 0 if all(s.running for s in statuses) else 3
    return 0


def _print_infra(statuses: list[ServerStatus]) -> None:
    rows = [
        (s.name, f"running (pid {s.pid})" if s.running else "stopped", s.address, str(s.log_file))
        for s in statuses
    ]
    terminal.table(
        "infra",
        ("server", "state", "address", "log"),
        rows,
        [f"{name:<12} {state:<22} {address:<28} log: {log}" for name, state, address, log in rows],
    )


def up(
    brokers: Brokers = None,
    secure: Secure = False,
    object_store: ObjectStore = False,
    dashboard: Annotated[
        bool, typer.Option("--dashboard", help="then start the dashboards (aistack dashboard)")
    ] = False,
) -> int:
    """Start Kafka, Redis (the object store) and every service as local
    processes; wait until ready. With an object store every service keeps
    its files on its bucket."""
    from compose.settings import apply_infra_flags

    apply_infra_flags(brokers, secure, object_store)
    stack = _service_stack()
    services = len(stack.names) - len(stack.infra.names)
    store = ", the object store" if stack.infra.object_store is not None else ""
    print(f"starting Kafka, Redis{store} and {services} services …", flush=True)
    _print_stack(stack.up(progress=lambda s: print(f"ready: {s.name}", flush=True)))
    if dashboard:
        _dashboards_up(stack)
    return 0


def dashboard() -> int:
    """Start optuna-dashboard (the tuner's studies) and TensorBoard (the trainers' runs)
    beside the running stack and print their URLs; `aistack down` stops them."""
    _dashboards_up(_service_stack())
    return 0


def _dashboards_up(stack: ServiceStack) -> None:
    print("starting optuna-dashboard and TensorBoard …", flush=True)
    what = {
        "optuna-dashboard": "the tuner's studies: history, importances, intermediate values",
        "tensorboard": "the trainers' runs: one per trial, with its hyperparameters",
    }
    statuses = stack.dashboards_up()
    _print_stack(statuses)
    for status in statuses:
        print(f"{status.name}: {status.addresses[0]}  ({what.get(status.name, '')})")


def down() -> int:
    """Stop every service (SIGTERM, then SIGKILL), then Kafka and Redis."""
    _print_stack(_service_stack().down())
    return 0


def status() -> int:
    """One line per service; exit status 3 when any is not running."""
    statuses = _service_stack().status()
    _print_stack(statuses)
    return 0 if all(s.state == "running" for s in statuses) else 3


def env() -> int:
    """Export lines for the user's side of the stack (`eval "$(aistack env)"`): where it
    is and, in secure mode, the client's credentials."""
    import shlex

    stack = _service_stack()
    if stack.secure and not stack.infra.material.credentials.exists():
        raise AistackError("the secure stack has no credentials yet: run `aistack up` first")
    for key, value in stack.client_env().items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


def logs(
    service: Annotated[
        str | None, typer.Argument(help="kafka, redis, svc_… (default: every one)")
    ] = None,
    lines: Annotated[int, typer.Option("-n", "--lines", min=0, help="lines to show")] = 20,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="follow until Ctrl-C")] = False,
) -> int:
    """The last lines of a service's log, or of all."""
    from compose.logs import follow as follow_files
    from compose.logs import last_lines

    stack = _service_stack()
    names = [service] if service else stack.names
    files = {name: stack.log_file(name) for name in names}
    # One service: its lines as they are; several: each prefixed with its name.
    width = max(len(name) for name in names)

    def show(name: str, line: str) -> None:
        print(line if service else f"{name:<{width}} | {line}", flush=True)

    for name, path in files.items():
        for line in last_lines(path, lines).splitlines():
            show(name, line)
    if follow:
        try:
            for name, line in follow_files(files):
                show(name, line)
        except KeyboardInterrupt:
            pass
    return 0


def _service_stack() -> ServiceStack:
    from compose.settings import StackSettings
    from compose.stack import ServiceStack

    return ServiceStack(load_settings(StackSettings))


def _print_stack(statuses: list[ServiceStatus]) -> None:
    rows = [
        (
            s.name,
            s.state,
            str(s.pid) if s.pid is not None else "-",
            ", ".join(s.addresses),
            str(s.log_file),
        )
        for s in statuses
    ]
    # A service that exited shows its last log lines: under its own line off
    # a terminal, under the table on one.
    last_lines = {
        s.name: [f"    {line}" for line in (s.last_lines or "(empty log)").splitlines()]
        for s in statuses
        if s.state == "exited"
    }
    plain = []
    for name, state, pid, addresses, log in rows:
        plain.append(f"{name:<16} {state:<8} {pid:<8} {addresses:<44} log: {log}")
        plain.extend(last_lines.get(name, []))
    terminal.table("stack", ("service", "state", "pid", "addresses", "log"), rows, plain)
    if terminal.on_terminal():
        for name, lines in last_lines.items():
            print(f"{name} exited; its last lines:", *lines, sep="\n")
