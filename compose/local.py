"""The embedded default: a real Kafka broker (KRaft) and a real redis-server
as local processes (run by ``compose.processes``), no Docker. Data lives
under the state directory.

``AISTACK_INFRA_BROKERS=3`` (``aistack infra up --brokers 3``) makes Kafka a
cluster of three brokers on this machine, each its own controller too, with
replication factor 3 and ``min.insync.replicas`` 2 for its internal topics
(and, through :meth:`LocalStack.topic_defaults`, for aistack's). The count is
fixed when the state directory's cluster is first formatted; later commands
follow the state.

``up`` is idempotent (a running stack is left alone, stale pid files are
cleaned) and all-or-nothing (a failure stops what this call started).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from compose import kafka_class_archive, kafka_dist
from compose.grants import grant_principals, redis_acl
from compose.object_store import BUCKET, ObjectStoreServer
from compose.processes import ManagedProcess, Readiness, Supervisor, port_open
from compose.secure import ADMIN, SecureMaterial, ensure_material, write_private
from compose.secure_config import (
    SCRAM,
    admin_scram,
    broker_properties,
    principal_env,
    redis_options,
)
from compose.settings import KAFKA_PORT_STEP, InfraSettings
from shared.errors import AistackError, ConfigError, Unavailable
from shared.settings import KafkaSettings, ObjectStoreSettings, RedisSettings

#: How long ``down`` gives each server to stop before SIGKILL.
STOP_TIMEOUT = 60.0


class PortTaken(AistackError):
    reason = "port_taken"


@dataclass(frozen=True)
class ServerStatus:
    name: str
    running: bool
    pid: int | None
    address: str
    log_file: Path


@dataclass(frozen=True)
class Server(ManagedProcess):
    """Kafka or Redis: where it listens, and where clients find it."""

    port: int
    address: str


@dataclass(frozen=True)
class Broker(Server):
    """One Kafka broker (and KRaft controller) of the local cluster."""

    node_id: int
    controller_port: int
    directory: Path


#: The file in the state directory that records its Kafka cluster's shape:
#: how many brokers, and whether it is secure.
CLUSTER_FILE = "kafka-cluster.json"


@dataclass(frozen=True)
class ClusterShape:
    brokers: int
    secure: bool


class LocalStack:
    def __init__(self, settings: InfraSettings, *, jvm_options: list[str] | None = None) -> None:
        self.settings = settings
        self.root = settings.common.state_dir / "infra"
        self.cache_dir = settings.common.cache_dir
        # For every JVM on Kafka's class path: the broker's class archive,
        # where `aistack infra fetch` built one (compose.kafka_class_archive).
        self.jvm_options = (
            kafka_class_archive.java_options(self.cache_dir) if jvm_options is None else jvm_options
        )
        host = settings.host
        shape = self._cluster_shape()
        self.secure = shape.secure
        self.material = SecureMaterial(self.root / "secure")
        self.brokers = [self._broker(node) for node in range(1, shape.brokers + 1)]
        self.kafka = self.brokers[0]
        scheme = "rediss" if self.secure else "redis"
        self.redis = Server(
            "redis",
            "redis-server",
            self.root / "redis.pid",
            self.root / "redis.log",
            settings.redis_port,
            f"{scheme}://{host}:{settings.redis_port}/0",
        )
        self.object_store_server = ObjectStoreServer(
            self.root / "object-store", host, settings.object_store_port
        )
        # Started once in this state directory: every later command runs it too.
        self.object_store: Server | None = None
        if settings.object_store or self.object_store_server.directory.is_dir():
            self.object_store = Server(
                "object-store",
                "s3proxy",
                self.root / "object-store.pid",
                self.root / "object-store.log",
                settings.object_store_port,
                self.object_store_server.endpoint,
            )
        self._supervisor = Supervisor()

    # ---- public ----

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(broker.address for broker in self.brokers)

    @property
    def redis_url(self) -> str:
        return self.redis.address

    @property
    def names(self) -> list[str]:
        """Every server's name in start order: "kafka" (broker 1), "kafka-2", …, "redis"."""
        return [server.name for server in self._servers()]

    def server(self, name: str) -> Server:
        """A server by its name in ``names``; KeyError for any other name."""
        return {server.name: server for server in self._servers()}[name]

    def topic_defaults(self) -> dict[str, str]:
        """The replication aistack's topics get on this cluster, as the
        settings that say it: factor 3 and two in sync on three brokers or
        more; one broker keeps 1 and 1."""
        factor = self._replication_factor()
        return {
            "AISTACK_KAFKA_TOPIC_REPLICATION_FACTOR": str(factor),
            "AISTACK_KAFKA_TOPIC_MIN_INSYNC_REPLICAS": str(_min_insync(factor)),
        }

    def kafka_settings(self, principal: str = ADMIN) -> KafkaSettings:
        """How ``principal`` reaches this Kafka: every broker, and in secure
        mode TLS (this stack's CA) and SCRAM as that principal. Secure mode's
        material exists once ``up`` has run."""
        factor = self._replication_factor()
        plain = KafkaSettings(
            bootstrap=self.kafka_bootstrap,
            topic_replication_factor=factor,
            topic_min_insync_replicas=_min_insync(factor),
        )
        if not self.secure:
            return plain
        return KafkaSettings(
            bootstrap=plain.bootstrap,
            security_protocol="SASL_SSL",
            sasl_mechanism=SCRAM,
            sasl_username=principal,
            sasl_password=self.material.password(principal),
            ssl_cafile=self.material.ca_cert,
            client_id=principal,
            topic_replication_factor=plain.topic_replication_factor,
            topic_min_insync_replicas=plain.topic_min_insync_replicas,
        )

    def redis_settings(self, principal: str = ADMIN) -> RedisSettings:
        """How ``principal`` reaches this Redis: in secure mode TLS and its ACL user."""
        if not self.secure:
            return RedisSettings(url=self.redis_url)
        return RedisSettings(
            url=self.redis_url,
            username=principal,
            password=self.material.password(principal),
            ssl_ca_certs=self.material.ca_cert,
        )

    def object_store_settings(self) -> ObjectStoreSettings | None:
        """How a client reaches this stack's object store; None without one."""
        return None if self.object_store is None else self.object_store_server.settings()

    def client_env(self, principal: str) -> dict[str, str]:
        """``kafka_settings``, ``redis_settings`` of ``principal`` and the
        object store's as the environment of a process started with them."""
        kafka = self.kafka_settings(principal)
        redis_settings = self.redis_settings(principal)
        env = {
            "AISTACK_KAFKA_BOOTSTRAP": kafka.bootstrap,
            "AISTACK_REDIS_URL": redis_settings.url,
            **self.topic_defaults(),
        }
        if self.secure:
            env.update(principal_env(self.material, principal))
        if self.object_store is not None:
            env.update(self.object_store_server.client_env())
        return env

    def up(self) -> list[ServerStatus]:
        """Start whatever is not running and wait until both answer."""
        self.root.mkdir(parents=True, exist_ok=True)
        redis_server = shutil.which("redis-server")
        if redis_server is None:
            raise ConfigError(
                "redis-server not found: run `make setup` or `apt-get install redis-server`"
            )
        # Check every port first, so a taken one fails before anything starts.
        for server in self._servers():
            if self._alive_pid(server) is None:
                self._check_port_free(server)
        started: list[Server] = []
        try:
            started += self.start_brokers()
            if self._alive_pid(self.redis) is None:
                self._check_port_free(self.redis)
                self._start_redis(redis_server)
                started.append(self.redis)
            self._wait(self.redis, self._redis_ready)
            if self.object_store is not None:
                if self._alive_pid(self.object_store) is None:
                    self._check_port_free(self.object_store)
                    self._spawn(self.object_store, self.object_store_server.command(self.cache_dir))
                    started.append(self.object_store)
                self._wait(self.object_store, self.object_store_server.ready)
                self.object_store_server.create_buckets(BUCKET)
        except BaseException:
            self._supervisor.stop(started, STOP_TIMEOUT)
            raise
        return self.status()

    def start_brokers(self) -> list[Broker]:
        """Start the brokers not running and wait until each answers; the
        ones it started. (``up`` starts them so, then the other servers.)"""
        self._prepare_kafka()
        started: list[Broker] = []
        try:
            # Every broker first, then wait: none is ready before a majority
            # of the controllers runs.
            for broker in self.brokers:
                if self._alive_pid(broker) is None:
                    self._check_port_free(broker)
                    self._start_kafka(broker)
                    started.append(broker)
            for broker in self.brokers:
                self._wait(broker, partial(self._kafka_ready, broker))
            if self.secure:
                grant_principals(self.kafka_settings(ADMIN), self.material.passwords())
        except BaseException:
            self._supervisor.stop(started, STOP_TIMEOUT)
            raise
        return started

    def _prepare_kafka(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if shutil.which("java") is None:
            raise ConfigError(
                "java not found: Kafka needs a JRE 17, `apt-get install openjdk-17-jre-headless`"
            )
        kafka_dist.ensure_kafka_jars(self.cache_dir)
        self._record_cluster_shape()
        if self.secure:
            ensure_material(self.material.directory, [self.settings.host])

    def down(self, timeout: float = STOP_TIMEOUT) -> list[ServerStatus]:
        """Stop every server cleanly (SIGTERM, then SIGKILL after ``timeout``):
        the object store, Redis, then the brokers together (a broker stopping
        alone after the others would wait for a controller quorum that is gone)."""
        if self.object_store is not None:
            self.stop_server(self.object_store.name, timeout)
        self.stop_server(self.redis.name, timeout)
        self._supervisor.stop(self.brokers, timeout)
        return self.status()

    def stop_server(self, name: str, timeout: float = STOP_TIMEOUT) -> None:
        """Stop one server by name (SIGTERM, then SIGKILL after ``timeout``)."""
        self._supervisor.stop([self.server(name)], timeout)

    def status(self) -> list[ServerStatus]:
        return [
            ServerStatus(
                s.name, (pid := self._alive_pid(s)) is not None, pid, s.address, s.log_file
            )
            for s in self._servers()
        ]

    # ---- Kafka ----

    def _replication_factor(self) -> int:
        return min(3, len(self.brokers))

    def _servers(self) -> list[Server]:
        extra = [] if self.object_store is None else [self.object_store]
        return [*self.brokers, self.redis, *extra]

    def _broker(self, node: int) -> Broker:
        s = self.settings
        name = "kafka" if node == 1 else f"kafka-{node}"
        port = s.kafka_port + KAFKA_PORT_STEP * (node - 1)
        return Broker(
            name,
            "kafka.Kafka",
            self.root / f"{name}.pid",
            self.root / f"{name}.log",
            port,
            f"{s.host}:{port}",
            node,
            s.kafka_controller_port + KAFKA_PORT_STEP * (node - 1),
            self.root / name,
        )

    def _cluster_shape(self) -> ClusterShape:
        """The shape the state's cluster was formatted with; a different one
        asked for explicitly is a ConfigError. A state from before the shape
        was recorded holds one plain broker."""
        asked = ClusterShape(self.settings.brokers, self.settings.secure)
        recorded_file = self.root / CLUSTER_FILE
        if recorded_file.exists():
            recorded = ClusterShape(**json.loads(recorded_file.read_text()))
        elif (self.root / "kafka" / "data" / "meta.properties").exists():
            recorded = ClusterShape(brokers=1, secure=False)
        else:
            return asked
        explicit = self.settings.model_fields_set
        if "brokers" in explicit and asked.brokers != recorded.brokers:
            raise ConfigError(
                f"AISTACK_INFRA_BROKERS={asked.brokers}, but the state directory "
                f"{self.root} holds a {recorded.brokers}-broker Kafka cluster: `aistack infra "
                "down` and remove it, or use another AISTACK_STATE_DIR"
            )
        if "secure" in explicit and asked.secure != recorded.secure:
            held = "secure" if recorded.secure else "plaintext"
            raise ConfigError(
                f"AISTACK_INFRA_SECURE={str(asked.secure).lower()}, but the state directory "
                f"{self.root} holds a {held} Kafka cluster: `aistack infra down` and remove "
                "it, or use another AISTACK_STATE_DIR"
            )
        return recorded

    def _record_cluster_shape(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        shape = {"brokers": len(self.brokers), "secure": self.secure}
        (self.root / CLUSTER_FILE).write_text(json.dumps(shape) + "\n")

    def _write_kafka_config(self, broker: Broker) -> Path:
        s = self.settings
        data = broker.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = broker.directory / "server.properties"
        voters = ",".join(f"{b.node_id}@{s.host}:{b.controller_port}" for b in self.brokers)
        # Internal topics (consumer offsets, transactions) as replicated as the
        # cluster allows: with fewer replicas than asked, groups and
        # transactions hang.
        factor = self._replication_factor()
        client = "SASL_SSL" if self.secure else "PLAINTEXT"
        config.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    f"node.id={broker.node_id}",
                    f"controller.quorum.voters={voters}",
                    f"listeners={client}://{s.host}:{broker.port},"
                    f"CONTROLLER://{s.host}:{broker.controller_port}",
                    f"advertised.listeners={client}://{s.host}:{broker.port}",
                    "controller.listener.names=CONTROLLER",
                    f"inter.broker.listener.name={client}",
                    *(self._secure_kafka_config() if self.secure else _PLAIN_KAFKA_CONFIG),
                    f"log.dirs={data}",
                    f"offsets.topic.replication.factor={factor}",
                    f"transaction.state.log.replication.factor={factor}",
                    f"transaction.state.log.min.isr={_min_insync(factor)}",
                    f"min.insync.replicas={_min_insync(factor)}",
                    f"default.replication.factor={factor}",
                    "num.partitions=1",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=false",
                    "log.retention.hours=168",
                    "",
                ]
            )
        )
        (broker.directory / "log4j.properties").write_text(
            "\n".join(
                [
                    "log4j.rootLogger=INFO, stdout",
                    "log4j.appender.stdout=org.apache.log4j.ConsoleAppender",
                    "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout",
                    "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n",
                    "log4j.logger.kafka=INFO",
                    "log4j.logger.org.apache.kafka=INFO",
                    "",
                ]
            )
        )
        return config

    def _secure_kafka_config(self) -> list[str]:
        return broker_properties(self.material, ["SASL_SSL"])

    def _java(
        self,
        broker: Broker,
        main: str,
        *args: str,
        heap: str = "256m",
        initial_heap: str = "64m",
    ) -> list[str]:
        return [
            "java",
            f"-Xmx{heap}",
            f"-Xms{initial_heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            *self.jvm_options,
            f"-Dlog4j.configuration=file:{broker.directory / 'log4j.properties'}",
            "-cp",
            kafka_dist.classpath(self.cache_dir),
            main,
            *args,
        ]

    def _start_kafka(self, broker: Broker) -> None:
        config = self._write_kafka_config(broker)
        if not (broker.directory / "data" / "meta.properties").exists():
            cluster_id = self._cluster_id()
            result = subprocess.run(
                self._java(
                    broker,
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(config),
                    *self._format_scram(),
                ),
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise Unavailable(
                    f"formatting Kafka storage failed: {result.stderr.strip()[-500:]}"
                )
        self._spawn(
            broker,
            self._java(
                broker,
                "kafka.Kafka",
                str(config),
                heap=self.settings.kafka_heap,
                initial_heap=self.settings.kafka_heap,
            ),
        )

    def _format_scram(self) -> list[str]:
        """The admin's SCRAM credential, in the metadata from the start: the
        brokers authenticate to each other with it before any admin call."""
        return ["--add-scram", admin_scram(self.material)] if self.secure else []

    def _cluster_id(self) -> str:
        """The id a broker already formatted carries (all of one cluster share
        it), or a new one."""
        for broker in self.brokers:
            meta = broker.directory / "data" / "meta.properties"
            if meta.exists():
                for line in meta.read_text().splitlines():
                    key, _, value = line.partition("=")
                    if key.strip() == "cluster.id":
                        return value.strip()
        return _kafka_cluster_id()

    def _kafka_ready(self, broker: Broker) -> bool:
        """The broker answers and the cluster counts it among its brokers."""
        from confluent_kafka.admin import AdminClient

        if not port_open(self.settings.host, broker.port):
            return False
        try:
            config = self.kafka_settings(ADMIN).client_config()
            admin = AdminClient(
                {**config, "bootstrap.servers": broker.address, "socket.timeout.ms": 2000}
            )
            metadata = admin.list_topics(timeout=3)
            return broker.node_id in metadata.brokers
        except Exception:
            return False

    # ---- Redis ----

    def _start_redis(self, redis_server: str) -> None:
        data = self.root / "redis"
        data.mkdir(parents=True, exist_ok=True)
        self._spawn(
            self.redis,
            [
                redis_server,
                "--bind",
                self.settings.host,
                *(self._secure_redis_options() if self.secure else self._plain_redis_options()),
                "--dir",
                str(data),
                # The tuner's studies live here: survive a restart.
                "--appendonly",
                "yes",
                "--daemonize",
                "no",
                "--protected-mode",
                "yes",
            ],
        )

    def _plain_redis_options(self) -> list[str]:
        return ["--port", str(self.settings.redis_port)]

    def _secure_redis_options(self) -> list[str]:
        """TLS only, and an ACL user per principal; the default user is off."""
        acl_file = self.material.directory / "users.acl"
        write_private(acl_file, redis_acl(self.material.passwords()).encode())
        return redis_options(self.material, self.settings.redis_port, acl_file)

    def _redis_ready(self) -> bool:
        import redis

        from shared.redis_client import make_redis

        try:
            client = make_redis(self.redis_settings(ADMIN))
            return bool(client.ping())
        except redis.RedisError:
            return False

    # ---- processes ----

    def _spawn(self, server: Server, command: list[str]) -> None:
        self._supervisor.spawn(server, command, cwd=self.root)

    def _wait(self, server: Server, ready: Callable[[], bool]) -> None:
        self._supervisor.wait_ready(
            [Readiness(server, ready, f"on {server.address}")],
            timeout=self.settings.start_timeout,
            hint="raise AISTACK_INFRA_START_TIMEOUT if it is only slow",
        )

    def _alive_pid(self, server: Server) -> int | None:
        """The server's pid if it is running; removes a stale pid file."""
        pid = server.pid()
        if pid is None:
            server.pid_file.unlink(missing_ok=True)
        return pid

    def _check_port_free(self, server: Server) -> None:
        if port_open(self.settings.host, server.port):
            setting = (
                "KAFKA" if isinstance(server, Broker) else server.name.upper().replace("-", "_")
            )
            raise PortTaken(
                f"port {server.port} on {self.settings.host} is already taken by another process; "
                f"stop it or set AISTACK_INFRA_{setting}_PORT"
            )
        if isinstance(server, Broker) and port_open(self.settings.host, server.controller_port):
            raise PortTaken(
                f"port {server.controller_port} on {self.settings.host} is already "
                "taken; stop it or set AISTACK_INFRA_KAFKA_CONTROLLER_PORT"
            )


_PLAIN_KAFKA_CONFIG = ["listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"]


def _min_insync(factor: int) -> int:
    """Two in sync of three: one broker may be down and acks=all writes go on."""
    return max(1, factor - 1)


def _kafka_cluster_id() -> str:
    # Kafka's cluster ids are 16 random bytes in URL-safe base64, unpadded.
    import base64

    # As Kafka's own Uuid.randomUuid: an id starting with "-" would be read
    # as an option by kafka-storage (that failed 1 start in 64).
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found
