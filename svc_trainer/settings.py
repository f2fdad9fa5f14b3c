"""svc_trainer's settings: ``AISTACK_TRAINER_*`` and the shared ones."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from shared.bus.topics import (
    EVENTS_DLQ,
    MODELS_READY,
    TOPICS_BY_NAME,
    TUNING_CONTROL,
    TUNING_REPORTS,
    TUNING_TRIALS,
    TopicSpec,
)
from shared.settings import ServiceSettings, SparkSettings


class TrainerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="AISTACK_TRAINER_", frozen=True, extra="ignore")

    # Where trials with task.options.launcher "spark" run (svc_trainer.backends.torch.spark).
    spark: SparkSettings = Field(default_factory=SparkSettings)
    trials_topic: str = TUNING_TRIALS
    reports_topic: str = TUNING_REPORTS
    control_topic: str = TUNING_CONTROL
    models_topic: str = MODELS_READY
    dlq_topic: str = EVENTS_DLQ
    # Every replica joins this group: each takes whole trials.
    group_id: str = "svc_trainer"
    # Names this replica in reports; empty: host-pid.
    trainer_id: str = ""
    # Models and checkpoints: a directory or an fsspec URL (s3://bucket/prefix
    # with s3fs installed). Empty: <state dir>/artifacts.
    artifact_root: str = ""
    # One TensorBoard run per trial (HParams plugin). Empty: <state dir>/tensorboard.
    tensorboard_dir: str = ""
    # The offline feature store svc_transform writes (the "features" dataset).
    # Empty: <state dir>/features/windows, svc_transform's default.
    features_path: str = ""
    # MNIST's four IDX files, for trials with dataset "mnist" and no path option.
    mnist_path: str = ""
    # auto: the GPUs when there are any, else the CPU.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Intra-op threads per training process; 0: the framework's default
    # (DDP ranks on CPUs then share the cores).
    threads: int = Field(default=0, ge=0, le=1024)
    # Processes for a multi-process strategy whose trial names no world size;
    # 0: one per GPU, else 2.
    world_size: int = Field(default=0, ge=0, le=1024)
    # Heartbeats while training, unless the trial request sets its own.
    heartbeat_seconds: float = Field(default=10.0, gt=0, le=3600)
    # Multi-node TensorFlow: this host's TF_CONFIG (JSON) for the multi-worker
    # strategies. (Multi-node PyTorch: torchrun, svc_trainer.backends.torch.torchrun, or Spark,
    # svc_trainer.backends.torch.spark.)
    tf_config: str = ""
    metrics_port: int = Field(default=9105, ge=0, le=65535)
    # Warm executors: the frameworks whose executor starts with the trainer
    # (comma-separated; the others start with their first trial).
    warm_frameworks: str = "torch,tensorflow"
    # An executor is replaced after this many trials (0: never) ...
    executor_max_trials: int = Field(default=100, ge=0)
    # ... or once its resident memory passes this many MiB after a trial (0: never).
    executor_max_memory_mb: int = Field(default=4096, ge=0)
    # A training run that checks in with neither a batch nor a report for this
    # many seconds is taken for hung: its executor is killed and replaced, the
    # trial fails (retryable). 0: never.
    executor_stall_seconds: float = Field(default=600.0, ge=0)
    # Datasets an executor keeps loaded, least recently used out first.
    cached_datasets: int = Field(default=4, ge=0, le=64)
    # The memory a trial's processes (its executor and every process under it)
    # may hold, in MiB; past it they are killed and the trial fails
    # (memory_limit, not retryable). 0: three quarters of this machine's memory.
    trial_memory_limit_mb: int = Field(default=0, ge=0)
    # Executors kept warm for shipped code packages (one per package and
    # framework), the least recently used retiring first.
    code_executors: int = Field(default=2, ge=1, le=64)
    # Frameworks that keep one spare executor warm (comma-separated): the next
    # new code package takes it, so its first trial pays no process start.
    spare_executors: str = "torch"
    # More framework runners by name, as JSON: {"jax": "my_package.jax_runner:RUNNER"}
    # (a plan.Runner each); a trial picks one with a "framework" parameter.
    runners: dict[str, str] = Field(default_factory=dict)

    @field_validator("runners")
    @classmethod
    def _runner_paths(cls, value: dict[str, str]) -> dict[str, str]:
        from svc_trainer.runners import check_path

        return {name: check_path(path) for name, path in value.items()}

    @field_validator("warm_frameworks", "spare_executors")
    @classmethod
    def _framework_list(cls, value: str) -> str:
        names = [n.strip() for n in value.split(",") if n.strip()]
        return ",".join(names)

    @model_validator(mode="after")
    def _warm_frameworks_known(self) -> TrainerSettings:
        known = self.runner_paths()
        for variable, names in (
            ("AISTACK_TRAINER_WARM_FRAMEWORKS", self.warm_framework_names()),
            ("AISTACK_TRAINER_SPARE_EXECUTORS", self.spare_framework_names()),
        ):
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(
                    f"{variable} names {', '.join(unknown)}: "
                    f"no such runner (known: {', '.join(known)})"
                )
        return self

    def warm_framework_names(self) -> tuple[str, ...]:
        return tuple(n for n in self.warm_frameworks.split(",") if n)

    def spare_framework_names(self) -> tuple[str, ...]:
        return tuple(n for n in self.spare_executors.split(",") if n)

    def runner_paths(self) -> dict[str, str]:
        from svc_trainer.runners import registry

        return registry(self.runners)

    @field_validator("tf_config")
    @classmethod
    def _json_cluster(cls, value: str) -> str:
        if value:
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"expected TF_CONFIG JSON: {exc}") from exc
            if not isinstance(parsed, dict) or "cluster" not in parsed:
                raise ValueError('expected TF_CONFIG JSON with a "cluster"')
        return value

    def trial_memory_limit_bytes(self) -> int:
        if self.trial_memory_limit_mb:
            return self.trial_memory_limit_mb << 20
        from svc_trainer.executors.memory import machine_bytes

        return machine_bytes() * 3 // 4

    def replica_id(self) -> str:
        return self.trainer_id or f"{socket.gethostname()}-{os.getpid()}"

    def artifact_location(self) -> str:
        return self.artifact_root or str(self.common.state_dir / "artifacts")

    def tensorboard_location(self) -> str:
        """A directory, or a URL (``s3://…``) the runs are mirrored to."""
        return self.tensorboard_dir or str(self.common.state_dir / "tensorboard")

    def work_dir(self) -> Path:
        """This replica's own directory: exports, uploads, code packages."""
        from svc_trainer.trials import safe_name

        return self.common.state_dir / "trainer" / safe_name(self.replica_id())

    def spark_work_dir(self) -> Path:
        """The Spark driver's working directory (``launcher: spark`` trials)."""
        return self.common.state_dir / "trainer" / "spark"

    def features_location(self) -> str:
        return self.features_path or str(self.common.state_dir / "features" / "windows")

    def topic_specs(self) -> list[TopicSpec]:
        return topic_specs(
            trials=self.trials_topic,
            reports=self.reports_topic,
            control=self.control_topic,
            models=self.models_topic,
            dlq=self.dlq_topic,
        )


def topic_specs(
    *, trials: str, reports: str, control: str, models: str, dlq: str
) -> list[TopicSpec]:
    """The trainer's topics under the given names, each with its standard spec."""
    return [
        TOPICS_BY_NAME[TUNING_TRIALS].named(trials),
        TOPICS_BY_NAME[TUNING_REPORTS].named(reports),
        TOPICS_BY_NAME[TUNING_CONTROL].named(control),
        TOPICS_BY_NAME[MODELS_READY].named(models),
        TOPICS_BY_NAME[EVENTS_DLQ].named(dlq),
    ]
