"""The embedded default: a real Kafka broker (KRaft) and a real redis-server
as local processes (run by ``compose.processes``), no Docker. Data lives
under the state directory.

``up`` is idempotent (a running stack is left alone, stale pid files are
cleaned) and all-or-nothing (a failure stops what this call started).
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from compose import kafka_dist
from compose.processes import ManagedProcess, Readiness, Supervisor, port_open
from compose.settings import InfraSettings
from shared.errors import AistackError, ConfigError, Unavailable

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


class LocalStack:
    def __init__(self, settings: InfraSettings) -> None:
        self.settings = settings
        self.root = settings.common.state_dir / "infra"
        self.cache_dir = settings.common.cache_dir
        host = settings.host
        self.kafka = Server(
            "kafka",
            "kafka.Kafka",
            self.root / "kafka.pid",
            self.root / "kafka.log",
            settings.kafka_port,
            f"{host}:{settings.kafka_port}",
        )
        self.redis = Server(
            "redis",
            "redis-server",
            self.root / "redis.pid",
            self.root / "redis.log",
            settings.redis_port,
            f"redis://{host}:{settings.redis_port}/0",
        )
        self._supervisor = Supervisor()

    # ---- public ----

    @property
    def kafka_bootstrap(self) -> str:
        return self.kafka.address

    @property
    def redis_url(self) -> str:
        return self.redis.address

    def server(self, name: str) -> Server:
        """ "kafka" or "redis"; KeyError for any other name."""
        return {"kafka": self.kafka, "redis": self.redis}[name]

    def up(self) -> list[ServerStatus]:
        """Start whatever is not running and wait until both answer."""
        self.root.mkdir(parents=True, exist_ok=True)
        redis_server = shutil.which("redis-server")
        if redis_server is None:
            raise ConfigError(
                "redis-server not found: run `make setup` or `apt-get install redis-server`"
            )
        if shutil.which("java") is None:
            raise ConfigError(
                "java not found: Kafka needs a JRE 17, `apt-get install openjdk-17-jre-headless`"
            )
        kafka_dist.ensure_kafka_jars(self.cache_dir)

        # Check every port first, so a taken one fails before anything starts.
        for server in (self.kafka, self.redis):
            if self._alive_pid(server) is None:
                self._check_port_free(server)
        started: list[Server] = []
        try:
            for server, start, ready in (
                (self.kafka, self._start_kafka, self._kafka_ready),
                (self.redis, lambda: self._start_redis(redis_server), self._redis_ready),
            ):
                if self._alive_pid(server) is not None:
                    self._wait(server, ready)
                    continue
                self._check_port_free(server)
                start()
                started.append(server)
                self._wait(server, ready)
        except BaseException:
            for server in reversed(started):
                self.stop_server(server.name)
            raise
        return self.status()

    def down(self, timeout: float = STOP_TIMEOUT) -> list[ServerStatus]:
        """Stop both servers cleanly (SIGTERM, then SIGKILL after ``timeout``)."""
        for server in (self.redis, self.kafka):
            self.stop_server(server.name, timeout)
        return self.status()

    def stop_server(self, name: str, timeout: float = STOP_TIMEOUT) -> None:
        """Stop "kafka" or "redis" alone (SIGTERM, then SIGKILL after ``timeout``)."""
        self._supervisor.stop([self.server(name)], timeout)

    def status(self) -> list[ServerStatus]:
        return [
            ServerStatus(
                s.name, (pid := self._alive_pid(s)) is not None, pid, s.address, s.log_file
            )
            for s in (self.kafka, self.redis)
        ]

    # ---- Kafka ----

    def _kafka_dir(self) -> Path:
        return self.root / "kafka"

    def _write_kafka_config(self) -> Path:
        s = self.settings
        data = self._kafka_dir() / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self._kafka_dir() / "server.properties"
        config.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@{s.host}:{s.kafka_controller_port}",
                    f"listeners=PLAINTEXT://{s.host}:{s.kafka_port},"
                    f"CONTROLLER://{s.host}:{s.kafka_controller_port}",
                    f"advertised.listeners=PLAINTEXT://{s.host}:{s.kafka_port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={data}",
                    # A single node: internal topics cannot have more replicas,
                    # or consumer groups and transactions hang.
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "min.insync.replicas=1",
                    "default.replication.factor=1",
                    "num.partitions=1",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=false",
                    "log.retention.hours=168",
                    "",
                ]
            )
        )
        (self._kafka_dir() / "log4j.properties").write_text(
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

    def _java(
        self, main: str, *args: str, heap: str = "256m", initial_heap: str = "64m"
    ) -> list[str]:
        return [
            "java",
            f"-Xmx{heap}",
            f"-Xms{initial_heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self._kafka_dir() / 'log4j.properties'}",
            "-cp",
            kafka_dist.classpath(self.cache_dir),
            main,
            *args,
        ]

    def _start_kafka(self) -> None:
        config = self._write_kafka_config()
        if not (self._kafka_dir() / "data" / "meta.properties").exists():
            cluster_id = _kafka_cluster_id()
            result = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)
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
            self.kafka,
            self._java(
                "kafka.Kafka",
                str(config),
                heap=self.settings.kafka_heap,
                initial_heap=self.settings.kafka_heap,
            ),
        )

    def _kafka_ready(self) -> bool:
        from confluent_kafka.admin import AdminClient

        if not port_open(self.settings.host, self.settings.kafka_port):
            return False
        try:
            admin = AdminClient(
                {"bootstrap.servers": self.kafka.address, "socket.timeout.ms": 2000}
            )
            metadata = admin.list_topics(timeout=3)
            return bool(metadata.brokers)
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
                "--port",
                str(self.settings.redis_port),
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

    def _redis_ready(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(self.redis.address, socket_timeout=2).ping())
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
            raise PortTaken(
                f"port {server.port} on {self.settings.host} is already taken by another process; "
                f"stop it or set AISTACK_INFRA_{server.name.upper()}_PORT"
            )
        if server is self.kafka and port_open(
            self.settings.host, self.settings.kafka_controller_port
        ):
            raise PortTaken(
                f"port {self.settings.kafka_controller_port} on {self.settings.host} is already "
                "taken; stop it or set AISTACK_INFRA_KAFKA_CONTROLLER_PORT"
            )


def _kafka_cluster_id() -> str:
    # Kafka's cluster ids are 16 random bytes in URL-safe base64, unpadded.
    import base64

    # As Kafka's own Uuid.randomUuid: an id starting with "-" would be read
    # as an option by kafka-storage (that failed 1 start in 64).
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found
