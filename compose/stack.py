"""The whole local stack: Kafka and Redis (the LocalStack) and every service as
its own process (``aistack up | down | status | logs``).

Each service is ``python -m svc_…`` started in its own session
(``compose.processes``), with its output appended to
``<state dir>/stack/<name>.log`` and its pid in ``<name>.pid``. A pid file
whose process is gone marks the service "exited" (it died; ``up`` restarts
it, ``down`` clears it) until ``up`` or ``down``.

``up`` is idempotent (what runs is left alone) and all-or-nothing (a failure
stops what that call started). Each service stays runnable alone; the stack
only chooses its environment.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from compose.local import LocalStack, PortTaken
from compose.logs import last_lines
from compose.object_store import BUCKET_LOCATIONS
from compose.processes import (
    LAST_LINES,
    ManagedProcess,
    Readiness,
    Supervisor,
    port_open,
    port_taken,
)
from compose.secure import ADMIN
from compose.secure_config import grpc_server_env
from compose.settings import (
    DASHBOARDS,
    TRAINER_METRICS_PORT_STEP,
    PortUse,
    StackSettings,
    inherited_environment,
)
from shared import object_store
from shared.errors import NotFound, Unavailable
from shared.rpc.client import Endpoint
from shared.settings import KafkaSettings, ObjectStoreSettings, RedisSettings, load_settings

#: The directory holding pyproject.toml: services run from here so that
#: ``python -m svc_…`` finds the project's packages.
PROJECT_ROOT = Path(__file__).resolve().parents[1]


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
class _Service(ManagedProcess):
    module: str
    addresses: tuple[str, ...]
    # The port whose accepting connections means "ready", on this host.
    ready_host: str
    ready_port: int
    # Variables this service gets on top of the common ones.
    env: tuple[tuple[str, str], ...]
    # Its Kafka principal and Redis user in secure mode (replicas share one).
    principal: str
    # Arguments after ``python -m module``.
    args: tuple[str, ...] = ()


class ServiceStack:
    """The local infrastructure plus svc_ingest, svc_transform, svc_tuner,
    ``settings.trainers`` svc_trainer replicas, svc_model and svc_monitor."""

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
            *,
            principal: str = "",
            args: tuple[str, ...] = (),
            **env: str,
        ) -> _Service:
            return _Service(
                name,
                # What tells our process from a stranger that reused its pid.
                f"-m {module}",
                self.root / f"{name}.pid",
                self.root / f"{name}.log",
                module,
                addresses,
                ready[0],
                ready[1],
                tuple(env.items()),
                principal or module,  # svc_trainer-2 is svc_trainer
                args,
            )

        # Metrics listen on AISTACK_METRICS_HOST: loopback, or 0.0.0.0, which holds it too.
        local = "127.0.0.1"
        services = [
            service(
                "svc_ingest",
                "svc_ingest",
                (f"metrics :{s.ingest_metrics_port}",),
                (local, s.ingest_metrics_port),
                AISTACK_INGEST_METRICS_PORT=str(s.ingest_metrics_port),
                # Static membership: restarted after a crash, it takes its
                # partitions back at once instead of after the session timeout.
                AISTACK_INGEST_INSTANCE_ID="svc_ingest-1",
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
        # The drift monitor serves metrics before it replays its topics.
        services.append(
            service(
                "svc_monitor",
                "svc_monitor",
                (f"metrics :{s.monitor_metrics_port}",),
                (local, s.monitor_metrics_port),
                AISTACK_MONITOR_METRICS_PORT=str(s.monitor_metrics_port),
            )
        )
        self._services = {svc.name: svc for svc in services}
        # Started only when asked for (``dashboards_up``), stopped by ``down``.
        optuna_url = f"http://{host}:{s.optuna_dashboard_port}"
        tensorboard_url = f"http://{host}:{s.tensorboard_port}"
        dashboards = [
            # The tuner's own entry point: its journal, its Redis user.
            service(
                DASHBOARDS[0],
                "svc_tuner.dashboard",
                (optuna_url,),
                (host, s.optuna_dashboard_port),
                principal="svc_tuner",
                AISTACK_TUNER_DASHBOARD_HOST=host,
                AISTACK_TUNER_DASHBOARD_PORT=str(s.optuna_dashboard_port),
            ),
            service(
                DASHBOARDS[1],
                "tensorboard.main",
                (tensorboard_url,),
                (host, s.tensorboard_port),
                principal="svc_trainer",
                args=(f"--host={host}", f"--port={s.tensorboard_port}"),
            ),
        ]
        self._dashboards = {svc.name: svc for svc in dashboards}
        self._supervisor = Supervisor()

    # ---- public ----

    @property
    def names(self) -> list[str]:
        """Every name ``status`` reports, in start order: infrastructure first."""
        return [*self.infra.names, *self._services]

    def tensorboard_dir(self) -> str:
        """Where the trainers write their TensorBoard runs (one per trial): a
        directory, or a URL on the object store."""
        from svc_trainer.settings import TrainerSettings

        on_the_bucket = self.storage_locations().get("AISTACK_TRAINER_TENSORBOARD_DIR")
        if on_the_bucket:
            return on_the_bucket
        trainer = load_settings(TrainerSettings)
        common = self.settings.infra.common  # the state dir the stack gives the trainers
        return trainer.model_copy(update={"common": common}).tensorboard_location()

    def dashboards_up(
        self, *, progress: Callable[[ServiceStatus], object] | None = None
    ) -> list[ServiceStatus]:
        """Start optuna-dashboard (on the tuner's journal in this stack's
        Redis) and TensorBoard (on the trainers' runs) unless they run, and
        wait until both answer; their statuses. Raises Unavailable when Redis
        is not running (``up`` first), PortTaken for a port another process
        holds; on a failure what this call started is stopped again."""
        if self._infra_pid("redis") is None:
            raise Unavailable("Redis is not running: start the stack first (aistack up)")
        self._check_ports(set(self._dashboards))
        self.root.mkdir(parents=True, exist_ok=True)
        started: list[_Service] = []
        try:
            for svc in self._dashboards.values():
                if svc.pid() is None:
                    self._supervisor.kill_leftovers(svc)
                    self._supervisor.spawn(
                        svc, self._command(svc), cwd=PROJECT_ROOT, env=self.service_env(svc.name)
                    )
                    started.append(svc)
            self._wait_ready(list(self._dashboards.values()), progress)
        except BaseException:
            self._supervisor.stop(started, _STOP_AFTER_FAILURE)
            raise
        return [self._status(name) for name in self._dashboards]

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
        self._check_ports(set(self.names))
        self._kafka_settings()  # a bad AISTACK_KAFKA_* fails before anything starts
        self.root.mkdir(parents=True, exist_ok=True)
        infra_before = {name: self._infra_pid(name) is not None for name in self.infra.names}
        started: list[_Service] = []
        try:
            self.infra.up()
            # In secure mode topics are the admin's to create.
            self._prepare_topics(self._kafka_as(ADMIN))
            for svc in self._services.values():
                if svc.pid() is None:
                    self._supervisor.kill_leftovers(svc)
                    self._supervisor.spawn(
                        svc, self._command(svc), cwd=PROJECT_ROOT, env=self.service_env(svc.name)
                    )
                    started.append(svc)
            self._wait_ready(list(self._services.values()), progress)
        except BaseException:
            self._supervisor.stop(started, _STOP_AFTER_FAILURE)
            # LocalStack cleans up its own failed start; this stops only the
            # servers that this call started and that came up.
            for name in self.infra.names:
                if not infra_before[name]:
                    self.infra.stop_server(name, _STOP_AFTER_FAILURE)
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
        # Signalled all at once and waited for under one deadline: services
        # (and the dashboards) depend only on Kafka and Redis, which stop after them.
        stopping = [*self._dashboards.values(), *reversed(self._services.values())]
        self._supervisor.stop(stopping, timeout)
        self.infra.down(timeout)
        return self.status()

    def stop_service(self, name: str, timeout: float = 60) -> ServiceStatus:
        """Stop the one service ``name``: SIGTERM, then SIGKILL after
        ``timeout`` s. Raises NotFound for a name that is not a service."""
        svc = self._service(name)
        self._supervisor.stop([svc], timeout)
        return self._status(name)

    def start_service(self, name: str, *, env: Mapping[str, str] | None = None) -> ServiceStatus:
        """Start the service ``name`` (stopped: ``stop_service``) with ``env``
        over its environment, and wait until it is ready. Raises NotFound for
        a name that is not a service, Unavailable when it does not come up."""
        svc = self._service(name)
        self._supervisor.kill_leftovers(svc)
        self._supervisor.spawn(
            svc,
            self._command(svc),
            cwd=PROJECT_ROOT,
            env={**self.service_env(name), **(env or {})},
        )
        self._wait_ready([svc], None)
        return self._status(name)

    def status(self) -> list[ServiceStatus]:
        """One status per name in ``names``, then each dashboard that was
        started (running, or exited); reads pid files, changes nothing."""
        dashboards = [name for name, svc in self._dashboards.items() if svc.pid_file.exists()]
        return [self._status(name) for name in [*self.names, *dashboards]]

    def log_file(self, name: str) -> Path:
        """The log of ``name`` (a service, "kafka" or "redis"); raises NotFound
        for any other name."""
        if name in self.infra.names:
            return self.infra.server(name).log_file
        return self._service(name).log_file

    def service_env(self, name: str) -> dict[str, str]:
        """The whole environment the service ``name`` is started with: this
        process's, plus where Kafka, Redis and the state live, plus its ports.
        Raises NotFound for a name that is not a service."""
        svc = self._service(name)
        env = {**self._common_env(), **dict(svc.env), **self._security_env(svc)}
        if svc.name == DASHBOARDS[1] and object_store.is_object_url(self.tensorboard_dir()):
            env.update(object_store.boto3_env(self.object_store_settings()))
        return env

    @property
    def secure(self) -> bool:
        return self.infra.secure

    def client_kafka(self) -> KafkaSettings:
        """How the user's side (the CLI, the demo, tests) reaches this
        stack's Kafka: as ``client`` in secure mode."""
        return self._kafka_as("client")

    def client_redis(self) -> RedisSettings:
        """How the user's side reads this stack's Redis: as ``client`` in secure mode."""
        return self.infra.redis_settings("client")

    def tuner(self) -> Endpoint:
        """svc_tuner's gRPC endpoint, with the CA and token secure mode needs."""
        return self._endpoint(self.tuner_target, "svc_tuner")

    def model(self) -> Endpoint:
        """svc_model's gRPC endpoint, with the CA and token secure mode needs."""
        return self._endpoint(self.model_target, "svc_model")

    def client_env(self) -> dict[str, str]:
        """The environment of a process on the user's side of this stack (the
        CLI, ``aistack.Client``): where everything is and, in secure mode, the
        ``client`` principal's credentials, the CA and the gRPC tokens."""
        env = {
            **self.infra.client_env("client"),
            **self._object_store_env(),
            "AISTACK_TUNER_TARGET": self.tuner_target,
            "AISTACK_MODEL_TARGET": self.model_target,
        }
        if self.secure:
            for prefix, endpoint in (("TUNER", self.tuner()), ("MODEL", self.model())):
                env[f"AISTACK_{prefix}_TLS_CA_FILE"] = str(endpoint.tls_ca_file)
                env[f"AISTACK_{prefix}_AUTH_TOKEN"] = endpoint.token or ""
        return env

    def _kafka_as(self, principal: str) -> KafkaSettings:
        """The services' Kafka settings (partitions, replication) with
        ``principal``'s connection in secure mode."""
        kafka = self._kafka_settings()
        if not self.secure:
            return kafka
        own = self.infra.kafka_settings(principal)
        fields = (
            "security_protocol",
            "sasl_mechanism",
            "sasl_username",
            "sasl_password",
            "ssl_cafile",
            "client_id",
        )
        return kafka.model_copy(update={field: getattr(own, field) for field in fields})

    def _endpoint(self, target: str, server: str) -> Endpoint:
        if not self.secure:
            return Endpoint(target)
        material = self.infra.material
        return Endpoint(target, material.ca_cert, material.token(server).get_secret_value())

    def _security_env(self, svc: _Service) -> dict[str, str]:
        """In secure mode: the service's own principal for Kafka and Redis and,
        for a gRPC server, the stack's certificate and its token."""
        if not self.secure:
            return {}
        defaults = self.infra.topic_defaults()
        env = {
            key: value
            for key, value in self.infra.client_env(svc.principal).items()
            if key not in defaults  # the replication is _replication_env's to say
        }
        env.update(grpc_server_env(self.infra.material, svc.principal))
        return env

    def _kafka_settings(self) -> KafkaSettings:
        # The services' own AISTACK_KAFKA_* (partitions, security) pass through
        # to them; the bootstrap is the stack's, and so is the replication,
        # unless they set it.
        update: dict[str, object] = {"bootstrap": self.infra.kafka_bootstrap}
        for variable, value in self._replication_env().items():
            field = variable.removeprefix("AISTACK_KAFKA_").lower()
            update[field] = int(value)
        return load_settings(KafkaSettings).model_copy(update=update)

    def storage_locations(self) -> dict[str, str]:
        """The services' file locations the stack sets (its variables: the
        bucket's, with the infra's object store), where the environment
        does not set them; empty without an object store."""
        if self.infra.object_store is None:
            return {}
        environment = inherited_environment()
        return {k: v for k, v in BUCKET_LOCATIONS.items() if k not in environment}

    def offline_store(self) -> str:
        """Where svc_transform writes the offline store, as its readers name
        it: a directory, or an ``s3://`` URL (``object_store_settings``)."""
        from svc_transform.settings import TransformSettings

        located = self.storage_locations().get("AISTACK_TRANSFORM_OFFLINE_DIR")
        if located:
            return object_store.fsspec_url(located)
        transform = load_settings(TransformSettings)
        common = self.settings.infra.common
        return object_store.fsspec_url(
            transform.model_copy(update={"common": common}).offline_path()
        )

    def object_store_settings(self) -> ObjectStoreSettings:
        """The infra's object store, else the one the environment names."""
        return self.infra.object_store_settings() or load_settings(ObjectStoreSettings)

    def _object_store_env(self) -> dict[str, str]:
        """With the infra's object store: how to reach it, and the services'
        files on its bucket (``storage_locations``)."""
        if self.infra.object_store is None:
            return {}
        return {**self.infra.object_store_server.client_env(), **self.storage_locations()}

    def _replication_env(self) -> dict[str, str]:
        """The cluster's topic replication settings that the environment leaves unset."""
        environment = inherited_environment()
        return {
            variable: value
            for variable, value in self.infra.topic_defaults().items()
            if variable not in environment
        }

    def _prepare_topics(self, kafka: KafkaSettings) -> None:
        """Create every aistack topic once before the services start (each
        creates its own too): on a fresh broker that spares them racing each
        other to create the same topics."""
        from shared.bus.topics import TOPICS, ensure_topics

        ensure_topics(kafka, TOPICS)

    # ---- ports ----

    def _check_ports(self, starting: set[str]) -> None:
        """Raise PortTaken for the first port of ``starting`` (names) that
        another process holds; ports of our own running processes are ours."""
        running = {s.name for s in self.status() if s.state == "running"}
        for use in self.settings.ports():
            if use.service in running or use.service not in starting:
                continue
            # A metrics port held on any interface would clash (AISTACK_METRICS_HOST
            # may widen ours to all of them); the others bind the infra host.
            host = "0.0.0.0" if use.role == "metrics" else self.settings.infra.host
            if port_taken(host, use.port):
                raise PortTaken(port_taken_message(use))

    # ---- services ----

    def _service(self, name: str) -> _Service:
        try:
            return {**self._services, **self._dashboards}[name]
        except KeyError:
            known = [*self.names, *self._dashboards]
            raise NotFound(f"no service {name!r} in the stack; known: {', '.join(known)}") from None

    def _common_env(self) -> dict[str, str]:
        common = self.settings.infra.common
        # The launcher hands its own environment down (PATH, JAVA_HOME, the
        # user's AISTACK_* tuning); where things are is the stack's to say.
        env = inherited_environment()
        env.update(
            AISTACK_KAFKA_BOOTSTRAP=self.infra.kafka_bootstrap,
            AISTACK_REDIS_URL=self.infra.redis_url,
            AISTACK_STATE_DIR=str(common.state_dir),
            AISTACK_CACHE_DIR=str(common.cache_dir),
        )
        env.update(self._replication_env())
        env.update(self._object_store_env())
        env.setdefault("AISTACK_LOG_FORMAT", "json")
        # local[*] on a laptop would let Spark take every core from the others.
        env.setdefault("AISTACK_SPARK_MASTER", "local[2]")
        # Output goes to a file: unbuffered, so a crash's last words are in it.
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _command(self, svc: _Service) -> list[str]:
        args = svc.args
        module = svc.module
        if svc.name == DASHBOARDS[1]:
            # Read when TensorBoard starts: a bad AISTACK_TRAINER_* fails it alone.
            logdir = self.tensorboard_dir()
            args = (f"--logdir={logdir}", *args)
            if object_store.is_object_url(logdir):
                # TensorBoard's own S3 reader: the TensorFlow installed beside
                # it reads no s3://, and its fast loader neither.
                module = "svc_trainer.tensorboard"
                args = (*args, "--load_fast=false")
        return [sys.executable, "-m", module, *args]

    def _wait_ready(
        self,
        services: Sequence[_Service],
        progress: Callable[[ServiceStatus], object] | None,
    ) -> None:
        def ready(process: ManagedProcess) -> None:
            if progress is not None:
                progress(self._status(process.name))

        self._supervisor.wait_ready(
            [
                Readiness(
                    svc,
                    partial(port_open, svc.ready_host, svc.ready_port),
                    f"on port {svc.ready_port}",
                )
                for svc in services
            ],
            timeout=self.settings.start_timeout,
            hint="raise AISTACK_STACK_START_TIMEOUT if it is only slow",
            on_ready=ready,
        )

    def _infra_pid(self, name: str) -> int | None:
        # LocalStack.status() would clean a stale pid file; read it without,
        # so that a crashed Kafka or Redis shows as "exited".
        return self.infra.server(name).pid()

    def _status(self, name: str) -> ServiceStatus:
        if name in self.infra.names:
            server = self.infra.server(name)
            pid_file, log_file = server.pid_file, server.log_file
            addresses: tuple[str, ...] = (server.address,)
            pid = self._infra_pid(name)
        else:
            svc = self._service(name)
            pid_file, log_file, addresses = svc.pid_file, svc.log_file, svc.addresses
            pid = svc.pid()
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


def port_taken_message(use: PortUse) -> str:
    what = f"{use.service} {use.role}" if use.role else use.service
    how = f" ({use.note})" if use.note else ""
    return (
        f"port {use.port} ({what}) is taken by another process: stop it or set {use.setting}{how}"
    )
