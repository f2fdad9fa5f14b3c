"""svc_trainer's settings: ``AISTACK_TRAINER_*`` and the shared ones."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
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
from shared.settings import ServiceSettings


class TrainerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="AISTACK_TRAINER_", frozen=True, extra="ignore")

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
    # strategies. (Multi-node PyTorch runs under torchrun: svc_trainer.torch_launch.)
    tf_config: str = ""
    metrics_port: int = Field(default=9105, ge=0, le=65535)

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

    def replica_id(self) -> str:
        return self.trainer_id or f"{socket.gethostname()}-{os.getpid()}"

    def artifact_location(self) -> str:
        return self.artifact_root or str(self.common.state_dir / "artifacts")

    def tensorboard_location(self) -> Path:
        return Path(self.tensorboard_dir or self.common.state_dir / "tensorboard")

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
