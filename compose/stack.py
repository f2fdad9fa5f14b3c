"""The whole local stack: Kafka and Redis (the LocalStack) and every service as
its own process (``aistack up | down | status | logs``).

Each service is ``python -m svc_…`` started in its own session, with its
output appended to ``<state dir>/stack/<name>.log`` and its pid in
``<name>.pid``. A pid file whose process is gone marks the service "exited"
(it died; ``up`` restarts it, ``down`` clears it) until ``up`` or ``down``.

``up`` is idempotent (what runs is left alone) and all-or-nothing (a failure
stops what that call started). Each service stays runnable alone; the stack
only chooses its environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from compose.local import LocalStack, PortTaken, _is_our_process, _pid_running, _port_open
from compose.settings import TRAINER_METRICS_PORT_STEP, PortUse, StackSettings
from shared.errors import NotFound, Unavailable
from shared.settings import KafkaSettings, load_settings

#: The directory holding pyproject.toml: services run from here so that
#: ``python -m svc_…`` finds the project's packages.
PROJECT_ROOT = Path(__file__).resolve().parents[1]

#: How many log lines an exited service (or a failed start) shows.
LAST_LINES = 10

INFRA = ("kafka", "redis")

# Stopping what a failed ``up`` started: it never got to do any work worth a
# long graceful stop.
_STOP_AFTER_FAILURE = 15.0


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    #: "running", "stopped", or "exited": it was started and died (its pid
    #: file remains, its process is gone).
    state: str
    pid: int | None
    addresses: tuple[str, ...]
    log_file: Path
    #: For "exited": the last lines of its log.
    last_lines: str = ""


@dataclass(frozen=True)
class _Service:
    name: str
    module: str
    pid_file: Path
    log_file: Path
    addresses: tuple[str, ...]
    # The port whose accepting connections means "ready", on this host.
    ready_host: str
    ready_port: int
    # Variables this service gets on top of the common ones.
    env: tuple[tuple[str, str], ...]


class ServiceStack:
    """The local infrastructure plus svc_ingest, svc_transform, svc_tuner,
    ``settings.trainers`` svc_trainer replicas and svc_model."""

    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.infra = LocalStack(settings.infra)
        self.root = settings.infra.common.state_dir / "stack"
        host = settings.infra.host
        s = settings

        def service(
            name: str,
            module: str,
            addresses: tuple[str, ...],
            ready: tuple[str, int],
            **env: str,
        ) -> _Service:
            return _Service(
                name,
                module,
                self.root / f"{name}.pid",
                self.root / f"{name}.log",
                addresses,
                ready[0],
                ready[1],
                tuple(env.items()),
            )

        # Prometheus' exporter listens on every interface: probe it on loopback.
        local = "127.0.0.1"
        services = [
            service(
                "svc_ingest",
                "svc_ingest",
                (f"metrics :{s.ingest_metrics_port}",),
                (local, s.ingest_metrics_port),
                AISTACK_INGEST_METRICS_PORT=str(s.ingest_metrics_port),
            ),
            service(
                "svc_transform",
                "svc_transform",
                (f"metrics :{s.transform_metrics_port}",),
                (local, s.transform_metrics_port),
                AISTACK_TRANSFORM_METRICS_PORT=str(s.transform_metrics_port),
            ),
            # svc_tuner and svc_model are ready when their gRPC port accepts
            # calls (svc_model listens only once the models topic is replayed);
            # their metrics come up earlier.
            service(
                "svc_tuner",
                "svc_tuner",
                (f"grpc {host}:{s.tuner_port}", f"metrics :{s.tuner_metrics_port}"),
                (host, s.tuner_port),
                AISTACK_TUNER_GRPC_ADDRESS=f"{host}:{s.tuner_port}",
                AISTACK_TUNER_METRICS_PORT=str(s.tuner_metrics_port),
            ),
        ]
        for i, name in enumerate(s.trainer_names()):
            port = s.trainer_metrics_port + TRAINER_METRICS_PORT_STEP * i
            services.append(
                service(
                    name,
                    "svc_trainer",
                    (f"metrics :{port}",),
                    (local, port),
                    AISTACK_TRAINER_TRAINER_ID=f"trainer-{i + 1}",
                    AISTACK_TRAINER_METRICS_PORT=str(port),
                    AISTACK_TRAINER_THREADS=str(s.threads_per_trainer()),
                )
            )
        services.append(
            service(
                "svc_model",
                "svc_model",
                (f"grpc {host}:{s.model_port}", f"metrics :{s.model_metrics_port}"),
                (host, s.model_port),
                AISTACK_MODEL_GRPC_ADDRESS=f"{host}:{s.model_port}",
                AISTACK_MODEL_METRICS_PORT=str(s.model_metrics_port),
            )
        )
        self._services = {svc.name: svc for svc in services}
        # Children started by this object: their exit status, and reaping them.
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # ---- public ----

    @property
    def names(self) -> list[str]:
        """Every name ``status`` reports, in start order: infrastructure first."""
        return [*INFRA, *self._services]

    @property
    def kafka_bootstrap(self) -> str:
        return self.infra.kafka_bootstrap

    @property
    def redis_url(self) -> str:
        return self.infra.redis_url

    @property
    def tuner_target(self) -> str:
        """Where svc_tuner's gRPC ``aistack.v1.TunerService`` answers."""
        return f"{self.settings.infra.host}:{self.settings.tuner_port}"

    @property
    def model_target(self) -> str:
        """Where svc_model's Open Inference Protocol answers."""
        return f"{self.settings.infra.host}:{self.settings.model_port}"

    def up(
        self, *, progress: Callable[[ServiceStatus], object] | None = None
    ) -> list[ServiceStatus]:
        """Start what is not running and wait until every service is ready.

        ``progress`` is called with each service's status as it becomes ready.
        Raises PortTaken (before anything starts) when a port the stack needs
        is held by another process; ConfigError for a bad ``AISTACK_KAFKA_*``
        setting or when Java or redis-server is missing; Unavailable when a
        service exits during start-up (at once) or is not ready within
        ``start_timeout``. On any failure what this call started is stopped
        again.
        """
        self._check_ports()
        kafka = self._kafka_settings()  # a bad AISTACK_KAFKA_* fails before anything starts
        self.root.mkdir(parents=True, exist_ok=True)
        infra_before = {name: self._infra_pid(name) is not None for name in INFRA}
        started: list[_Service] = []
        try:
            self.infra.up()
            self._prepare_topics(kafka)
            env = self._common_env()
            for svc in self._services.values():
                if self._pid(svc) is None:
                    self._reap_leftovers(svc)
                    self._spawn(svc, env)
                    started.append(svc)
            self._wait_ready(list(self._services.values()), progress)
        except BaseException:
            self._stop_services(started, _STOP_AFTER_FAILURE)
            # LocalStack cleans up its own failed start; this stops only the
            # servers that this call started and that came up.
            for name, server in (("kafka", self.infra.kafka), ("redis", self.infra.redis)):
                if not infra_before[name]:
                    self.infra._stop(server, _STOP_AFTER_FAILURE)
            raise
        return self.status()

    def down(self, timeout: float = 60) -> list[ServiceStatus]:
        """Stop every service, then Kafka and Redis.

        Services get SIGTERM in reverse start order (they finish or hand back
        in-flight work); whatever of a service's process group is left after
        ``timeout`` seconds gets SIGKILL. Exited services' pid files are
        cleared and their orphaned children stopped. Raises nothing for
        services that are not running.
        """
        self._stop_services(list(reversed(self._services.values())), timeout)
        self.infra.down(timeout)
        return self.status()

    def status(self) -> list[ServiceStatus]:
        """One status per name in ``names``; reads pid files, changes nothing."""
        return [self._status(name) for name in self.names]

    def log_file(self, name: str) -> Path:
        """The log of ``name`` (a service, "kafka" or "redis"); raises NotFound
        for any other name."""
        if name == "kafka":
            return self.infra.kafka.log_file
        if name == "redis":
            return self.infra.redis.log_file
        return self._service(name).log_file

    def service_env(self, name: str) -> dict[str, str]:
        """The whole environment the service ``name`` is started with: this
        process's, plus where Kafka, Redis and the state live, plus its ports.
        Raises NotFound for a name that is not a service."""
        svc = self._service(name)
        return {**self._common_env(), **dict(svc.env)}

    def _kafka_settings(self) -> KafkaSettings:
        # The services' own AISTACK_KAFKA_* (partitions, security) pass through
        # to them; the bootstrap is the stack's.
        return load_settings(KafkaSettings).model_copy(
            update={"bootstrap": self.infra.kafka_bootstrap}
        )

    def _prepare_topics(self, kafka: KafkaSettings) -> None:
        """Create every aistack topic once before the services start (each
        creates its own too): on a fresh broker that spares them racing each
        other to create the same topics."""
        from shared.bus.topics import TOPICS, ensure_topics

        ensure_topics(kafka, TOPICS)

    # ---- ports ----

    def _check_ports(self) -> None:
        """Raise PortTaken for the first port the stack needs that another
        process holds; ports of our own running processes are ours."""
        running = {s.name for s in self.status() if s.state == "running"}
        for use in self.settings.ports():
            if use.service in running:
                continue
            # Metrics servers bind every interface; the others the infra host.
            host = "0.0.0.0" if use.role == "metrics" else self.settings.infra.host
            if port_taken(host, use.port):
                raise PortTaken(port_taken_message(use))

    # ---- processes ----

    def _service(self, name: str) -> _Service:
        try:
            return self._services[name]
        except KeyError:
            raise NotFound(
                f"no service {name!r} in the stack; known: {', '.join(self.names)}"
            ) from None

    def _common_env(self) -> dict[str, str]:
        common = self.settings.infra.common
        # The launcher hands its own environment down (PATH, JAVA_HOME, the
        # user's AISTACK_* tuning); where things are is the stack's to say.
        env = dict(os.environ)
        env.update(
            AISTACK_KAFKA_BOOTSTRAP=self.infra.kafka_bootstrap,
            AISTACK_REDIS_URL=self.infra.redis_url,
            AISTACK_STATE_DIR=str(common.state_dir),
            AISTACK_CACHE_DIR=str(common.cache_dir),
        )
        env.setdefault("AISTACK_LOG_FORMAT", "json")
        # local[*] on a laptop would let Spark take every core from the others.
        env.setdefault("AISTACK_SPARK_MASTER", "local[2]")
        # Output goes to a file: unbuffered, so a crash's last words are in it.
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _spawn(self, svc: _Service, common_env: Mapping[str, str]) -> None:
        with svc.log_file.open("ab") as log:
            process = subprocess.Popen(
                self._command(svc),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=PROJECT_ROOT,
                env={**common_env, **dict(svc.env)},
                # Outlives the CLI, is not killed with its terminal, and its
                # children (Spark's JVM, trial processes) share its group.
                start_new_session=True,
            )
        svc.pid_file.write_text(f"{process.pid}\n")
        self._children[svc.name] = process

    def _command(self, svc: _Service) -> list[str]:
        return [sys.executable, "-m", svc.module]

    def _wait_ready(
        self,
        services: Sequence[_Service],
        progress: Callable[[ServiceStatus], object] | None,
    ) -> None:
        # All start together and are waited for together: on two cores their
        # imports and JVMs overlap with each other's waits on the broker.
        timeout = self.settings.start_timeout
        deadline = time.monotonic() + timeout
        pending = list(services)
        while pending:
            for svc in list(pending):
                if _port_open(svc.ready_host, svc.ready_port):
                    pending.remove(svc)
                    if progress is not None:
                        progress(self._status(svc.name))
                elif self._pid(svc) is None:
                    raise Unavailable(
                        f"{svc.name} exited during start-up{self._exit_status(svc)}; "
                        f"last lines of {svc.log_file}:\n"
                        + _indent(last_lines(svc.log_file, LAST_LINES))
                    )
            if pending and time.monotonic() > deadline:
                svc, *others = pending
                also = f" (nor {', '.join(o.name for o in others)})" if others else ""
                raise Unavailable(
                    f"{svc.name} is not ready on port {svc.ready_port} after {timeout:.0f}s"
                    f"{also}; raise AISTACK_STACK_START_TIMEOUT if it is only slow. "
                    f"Last lines of {svc.log_file}:\n"
                    + _indent(last_lines(svc.log_file, LAST_LINES))
                )
            if pending:
                time.sleep(0.25)

    def _exit_status(self, svc: _Service) -> str:
        child = self._children.get(svc.name)
        code = child.poll() if child is not None else None
        if code is None:
            return ""
        if code < 0:
            return f" (killed by {signal.Signals(-code).name})"
        return f" (exit status {code})"

    def _stop_services(self, services: Sequence[_Service], timeout: float) -> None:
        # Signal all, then wait for all under one deadline: services depend
        # only on Kafka and Redis, which stop after them.
        deadline = time.monotonic() + timeout
        groups: dict[str, int] = {}
        for svc in services:
            pid = self._pid(svc)
            if pid is not None:
                # The leader only: it stops its own children in order (Spark's
                # JVM after the queries, trials handed back); the group gets
                # SIGKILL if it overstays.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                groups[svc.name] = pid
            elif (pgid := self._leftover_group(svc)) is not None:
                _signal_group(pgid, signal.SIGTERM)
                groups[svc.name] = pgid
            else:
                svc.pid_file.unlink(missing_ok=True)
        # When each leader was first seen gone, to give its children a moment
        # to follow on their own (Spark's JVM exits when the driver's pipe
        # closes; a signal then races its shutdown hooks).
        orphaned: dict[str, float] = {}
        while groups and time.monotonic() < deadline:
            for name, pgid in list(groups.items()):
                if _pid_running(pgid):
                    continue
                if not _group_members(pgid):
                    del groups[name]
                    self._services[name].pid_file.unlink(missing_ok=True)
                elif time.monotonic() - orphaned.setdefault(name, time.monotonic()) > 5:
                    _signal_group(pgid, signal.SIGTERM)
            if groups:
                time.sleep(0.2)
        for name, pgid in groups.items():
            _signal_group(pgid, signal.SIGKILL)
            _wait_gone(pgid, 10.0)
            self._services[name].pid_file.unlink(missing_ok=True)
        for svc in services:
            child = self._children.pop(svc.name, None)
            if child is not None:
                child.poll()  # reaps it: no zombie left in a long-lived caller

    def _reap_leftovers(self, svc: _Service) -> None:
        """SIGKILL what a dead leader left behind (a trial, Spark's JVM) before
        a new one starts and competes with it for work and ports."""
        pgid = self._leftover_group(svc)
        if pgid is None:
            return
        _signal_group(pgid, signal.SIGKILL)
        _wait_gone(pgid, 10.0)

    def _leftover_group(self, svc: _Service) -> int | None:
        """The process group of an exited service if members of it remain."""
        pid = _read_pid(svc.pid_file)
        if pid is None or _pid_running(pid):
            # Alive: ours (then not a leftover) or a stranger that reused the
            # pid, whose group is not ours to touch.
            return None
        return pid if _group_members(pid) else None

    def _pid(self, svc: _Service) -> int | None:
        """The service's pid if it runs (a reused pid is not ours)."""
        pid = _read_pid(svc.pid_file)
        if pid is not None and _is_our_process(pid, f"-m {svc.module}"):
            return pid
        return None

    def _infra_pid(self, name: str) -> int | None:
        # LocalStack.status() would clean a stale pid file; read it without,
        # so that a crashed Kafka or Redis shows as "exited".
        server = self.infra.kafka if name == "kafka" else self.infra.redis
        pid = _read_pid(server.pid_file)
        if pid is not None and _is_our_process(pid, server.cmdline_marker):
            return pid
        return None

    def _status(self, name: str) -> ServiceStatus:
        if name in INFRA:
            server = self.infra.kafka if name == "kafka" else self.infra.redis
            pid_file, log_file = server.pid_file, server.log_file
            addresses: tuple[str, ...] = (server.address,)
            pid = self._infra_pid(name)
        else:
            svc = self._services[name]
            pid_file, log_file, addresses = svc.pid_file, svc.log_file, svc.addresses
            pid = self._pid(svc)
        if pid is not None:
            return ServiceStatus(name, "running", pid, addresses, log_file)
        if pid_file.exists():
            return ServiceStatus(
                name,
                "exited",
                None,
                addresses,
                log_file,
                last_lines(log_file, LAST_LINES),
            )
        return ServiceStatus(name, "stopped", None, addresses, log_file)


# ---- ports ----


def port_taken(host: str, port: int) -> bool:
    """Whether another process listens on, or holds, ``host:port``."""
    if _port_open("127.0.0.1" if host == "0.0.0.0" else host, port):
        return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the servers do: a closed connection's TIME_WAIT does not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def port_taken_message(use: PortUse) -> str:
    what = f"{use.service} {use.role}" if use.role else use.service
    how = f" ({use.note})" if use.note else ""
    return (
        f"port {use.port} ({what}) is taken by another process: stop it or set {use.setting}{how}"
    )


# ---- processes ----


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after "(comm)": state, ppid, pgrp, …; comm may hold ")".
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            members.append(int(entry.name))
    return members


def _wait_gone(pgid: int, timeout: float) -> None:
    # SIGKILL is not instant (a process in uninterruptible I/O finishes it
    # first), nor always final (D state): wait a while, never forever.
    deadline = time.monotonic() + timeout
    while (_pid_running(pgid) or _group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


# ---- logs ----


def last_lines(path: Path, count: int) -> str:
    """The last ``count`` lines of ``path`` ("" when it does not exist), read
    from the end: a Kafka log grows to hundreds of megabytes."""
    if count <= 0:
        return ""
    try:
        with path.open("rb") as file:
            end = file.seek(0, os.SEEK_END)
            position, data = end, b""
            while position > 0 and data.count(b"\n") <= count:
                step = min(65536, position)
                position -= step
                file.seek(position)
                data = file.read(step) + data
    except FileNotFoundError:
        return ""
    lines = data.decode(errors="replace").splitlines()
    return "\n".join(lines[-count:])


def follow(
    files: Mapping[str, Path], *, interval: float = 0.25, from_end: bool = True
) -> Iterator[tuple[str, str]]:
    """(name, line) for each line appended to ``files`` from now on, forever.

    A file that does not exist yet is waited for; one that shrinks (truncated
    or replaced) is read again from its start. Partial lines wait for their
    newline.
    """
    positions: dict[str, int] = {}
    pending: dict[str, bytes] = {}
    for name, path in files.items():
        try:
            positions[name] = path.stat().st_size if from_end else 0
        except FileNotFoundError:
            positions[name] = 0
        pending[name] = b""
    while True:
        for name, path in files.items():
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if size < positions[name]:
                positions[name], pending[name] = 0, b""
            if size == positions[name]:
                continue
            with path.open("rb") as file:
                file.seek(positions[name])
                data = file.read(size - positions[name])
            positions[name] += len(data)
            *complete, pending[name] = (pending[name] + data).split(b"\n")
            for line in complete:
                yield name, line.decode(errors="replace")
        time.sleep(interval)


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines()) or "    (no log)"
