"""Settings of the ``aistack`` command: the local launcher (``aistack
infra``), the whole stack (``aistack up``) and the study client (``aistack
study``). The only module of ``compose`` that reads the environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.settings import CommonSettings


def apply_infra_flags(brokers: int | None, secure: bool, object_store: bool = False) -> None:
    """A command's ``--brokers N`` is ``AISTACK_INFRA_BROKERS=N``, its
    ``--secure`` ``AISTACK_INFRA_SECURE=true`` and its ``--object-store``
    ``AISTACK_INFRA_OBJECT_STORE=true``, for the command and all it starts."""
    if brokers is not None:
        os.environ["AISTACK_INFRA_BROKERS"] = str(brokers)
    if secure:
        os.environ["AISTACK_INFRA_SECURE"] = "true"
    if object_store:
        os.environ["AISTACK_INFRA_OBJECT_STORE"] = "true"


def inherited_environment() -> dict[str, str]:
    """A copy of this process's environment, which the services the stack
    starts inherit (PATH, JAVA_HOME, the user's own ``AISTACK_*`` tuning)."""
    return dict(os.environ)


class InfraSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AISTACK_INFRA_", frozen=True, extra="ignore")

    host: str = "127.0.0.1"
    kafka_port: int = Field(default=9092, ge=1, le=65535)
    kafka_controller_port: int = Field(default=9093, ge=1, le=65535)
    redis_port: int = Field(default=6379, ge=1, le=65535)
    # Kafka brokers on this machine: 1, or a cluster (3: replication factor 3,
    # two in sync). Broker n listens on kafka_port + KAFKA_PORT_STEP·(n-1),
    # its controller likewise. Fixed when the state's cluster is formatted.
    brokers: int = Field(default=1, ge=1, le=9)
    # Secure mode: Kafka over TLS with SCRAM and ACLs (a principal per
    # service), Redis over TLS with an ACL user each. Fixed when the state's
    # cluster is formatted.
    secure: bool = False
    # An S3-compatible object store (S3Proxy) beside Kafka and Redis, with
    # the bucket the stack's files go to. Once started in a state directory,
    # later commands there run it too.
    object_store: bool = False
    object_store_port: int = Field(default=9000, ge=1, le=65535)
    kafka_heap: str = Field(default="512m", pattern=r"^\d+[mMgG]$")
    start_timeout: float = Field(default=120.0, gt=0)

    common: CommonSettings = Field(default_factory=CommonSettings)


#: Broker n of a local cluster listens on kafka_port + STEP·(n-1) (and its
#: controller on kafka_controller_port + STEP·(n-1)).
KAFKA_PORT_STEP = 100


class PortUse(NamedTuple):
    """One port the stack listens on, and the setting that moves it."""

    service: str
    role: str
    port: int
    setting: str
    # How the port follows from the setting, when it is not the setting itself.
    note: str = ""


#: Replica i of svc_trainer serves metrics on trainer_metrics_port + STEP·(i-1).
TRAINER_METRICS_PORT_STEP = 10


#: The dashboards beside the stack, started only when asked for.
DASHBOARDS = ("optuna-dashboard", "tensorboard")


class StackSettings(BaseSettings):
    """``aistack up``: the local infrastructure plus every service as a process.

    One object configures both: ``infra`` is read from ``AISTACK_INFRA_*``,
    the rest from ``AISTACK_STACK_*``. Every port is a setting so that a second
    stack (a test's) can run beside the developer's.
    """

    model_config = SettingsConfigDict(env_prefix="AISTACK_STACK_", frozen=True, extra="ignore")

    trainers: int = Field(default=2, ge=1, le=64)
    # Intra-op threads of each trainer's training (AISTACK_TRAINER_THREADS);
    # 0: this machine's cores shared evenly among the trainers, so that two
    # trials side by side do not fight over the same cores.
    trainer_threads: int = Field(default=0, ge=0, le=1024)
    # How long the services may take, together, to become ready.
    start_timeout: float = Field(default=180.0, gt=0)
    tuner_port: int = Field(default=50051, ge=1, le=65535)
    model_port: int = Field(default=8001, ge=1, le=65535)
    # Metrics ports double as readiness probes: none may be 0 (off) here.
    ingest_metrics_port: int = Field(default=9102, ge=1, le=65535)
    transform_metrics_port: int = Field(default=9103, ge=1, le=65535)
    tuner_metrics_port: int = Field(default=9104, ge=1, le=65535)
    trainer_metrics_port: int = Field(default=9105, ge=1, le=65535)
    model_metrics_port: int = Field(default=9106, ge=1, le=65535)
    monitor_metrics_port: int = Field(default=9107, ge=1, le=65535)
    # The dashboards (``aistack dashboard``, ``aistack up --dashboard``).
    optuna_dashboard_port: int = Field(default=8080, ge=1, le=65535)
    tensorboard_port: int = Field(default=6006, ge=1, le=65535)

    infra: InfraSettings = Field(default_factory=InfraSettings)

    @model_validator(mode="after")
    def _check_ports(self) -> StackSettings:
        seen: dict[int, PortUse] = {}
        for use in self.ports():
            if not 0 < use.port < 65536:
                raise ValueError(
                    f"{use.setting} puts {use.service} {use.role} on port {use.port}, beyond 65535"
                )
            other = seen.setdefault(use.port, use)
            if other is not use:
                raise ValueError(
                    f"port {use.port} is given twice: {other.service} {other.role} "
                    f"({other.setting}) and {use.service} {use.role} ({use.setting})"
                )
        return self

    @classmethod
    def on_free_ports(cls, state_dir: Path, *, trainers: int = 2) -> StackSettings:
        """A stack of ``trainers`` replicas whose every port was free a
        moment ago, its state in ``state_dir`` (the cache dir stays the
        default: Kafka's jars and Spark's connectors are fetched there once).
        For a stack beside the developer's: tests, benchmarks."""
        from compose.processes import port_taken
        from shared.ports import free_ports

        ports = free_ports(14)
        trainer_base = ports[8]
        # Every replica's port must be free, and none of the others.
        steps = [TRAINER_METRICS_PORT_STEP * i for i in range(1, trainers)]
        while any(
            port_taken("0.0.0.0", trainer_base + step) or trainer_base + step in ports
            for step in steps
        ):
            (trainer_base,) = free_ports(1)
        return cls(
            infra=InfraSettings(
                kafka_port=ports[0],
                kafka_controller_port=ports[1],
                redis_port=ports[2],
                object_store_port=ports[13],
                common=CommonSettings(state_dir=state_dir),
            ),
            tuner_port=ports[3],
            model_port=ports[4],
            ingest_metrics_port=ports[5],
            transform_metrics_port=ports[6],
            tuner_metrics_port=ports[7],
            trainer_metrics_port=trainer_base,
            model_metrics_port=ports[9],
            monitor_metrics_port=ports[10],
            optuna_dashboard_port=ports[11],
            tensorboard_port=ports[12],
            trainers=trainers,
        )

    def threads_per_trainer(self) -> int:
        if self.trainer_threads:
            return self.trainer_threads
        return max(1, (os.cpu_count() or 1) // self.trainers)

    def trainer_names(self) -> list[str]:
        return [f"svc_trainer-{i}" for i in range(1, self.trainers + 1)]

    def ports(self) -> list[PortUse]:
        """Every port of the stack, infrastructure included, in start order."""
        infra = self.infra
        stack = "AISTACK_STACK_"
        uses: list[PortUse] = []
        for node in range(1, infra.brokers + 1):
            name = "kafka" if node == 1 else f"kafka-{node}"
            offset = KAFKA_PORT_STEP * (node - 1)
            note = f"AISTACK_INFRA_KAFKA_PORT + {offset}" if offset else ""
            uses += [
                PortUse(name, "", infra.kafka_port + offset, "AISTACK_INFRA_KAFKA_PORT", note),
                PortUse(
                    name,
                    "controller",
                    infra.kafka_controller_port + offset,
                    "AISTACK_INFRA_KAFKA_CONTROLLER_PORT",
                    note.replace("_PORT", "_CONTROLLER_PORT"),
                ),
            ]
        uses.append(PortUse("redis", "", infra.redis_port, "AISTACK_INFRA_REDIS_PORT"))
        if infra.object_store:
            uses.append(
                PortUse(
                    "object-store", "", infra.object_store_port, "AISTACK_INFRA_OBJECT_STORE_PORT"
                )
            )
        uses += [
            PortUse("svc_tuner", "gRPC", self.tuner_port, f"{stack}TUNER_PORT"),
            PortUse("svc_tuner", "metrics", self.tuner_metrics_port, f"{stack}TUNER_METRICS_PORT"),
            PortUse("svc_model", "gRPC", self.model_port, f"{stack}MODEL_PORT"),
            PortUse("svc_model", "metrics", self.model_metrics_port, f"{stack}MODEL_METRICS_PORT"),
            PortUse(
                "svc_ingest", "metrics", self.ingest_metrics_port, f"{stack}INGEST_METRICS_PORT"
            ),
            PortUse(
                "svc_transform",
                "metrics",
                self.transform_metrics_port,
                f"{stack}TRANSFORM_METRICS_PORT",
            ),
            PortUse(
                "svc_monitor", "metrics", self.monitor_metrics_port, f"{stack}MONITOR_METRICS_PORT"
            ),
        ]
        for i, name in enumerate(self.trainer_names()):
            offset = TRAINER_METRICS_PORT_STEP * i
            uses.append(
                PortUse(
                    name,
                    "metrics",
                    self.trainer_metrics_port + offset,
                    f"{stack}TRAINER_METRICS_PORT",
                    f"replica {i + 1} uses it + {offset}" if offset else "",
                )
            )
        uses += [
            PortUse(
                DASHBOARDS[0], "http", self.optuna_dashboard_port, f"{stack}OPTUNA_DASHBOARD_PORT"
            ),
            PortUse(DASHBOARDS[1], "http", self.tensorboard_port, f"{stack}TENSORBOARD_PORT"),
        ]
        return uses
