"""The part of the stack a user's code meets, as real processes on topics of
their own: svc_tuner, two svc_trainer replicas (one consumer group, one
artifact store) and svc_model; an ``aistack.Client`` pointed at them; and a
recorder of what the trainers publish. One per test module: starting the
processes costs seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from aistack.client import Client
from aistack.settings import (
    ArtifactClientSettings,
    ClientSettings,
    LineageSettings,
    ModelClientSettings,
    TunerClientSettings,
)
from shared.contracts.aistack.v1 import models_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.ports import free_port
from tests.infra import Infra, wait_until
from tests.integration.trainer_service import BusRecorder, TrainerProcess, TrainerTopics
from tests.integration.tuner_service import TunerProcess, TunerTopics

ROOT = Path(__file__).resolve().parents[2]
#: The trainers' limits in these tests: a silent loop is found out in
#: seconds, a runaway allocation well before the machine runs short.
STALL_SECONDS = 20
MEMORY_LIMIT_MB = 3000


def study_spec(name: str, task: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """A one-trial study of `task` (torch unless it says), its name made unique."""
    document: dict[str, Any] = {
        "name": f"{name}-{uuid.uuid4().hex[:6]}",
        "objective": {"metric": "val_loss", "direction": "DIRECTION_MINIMIZE"},
        "params": [{"name": "width", "categorical": {"choices": [{"int_value": 8}]}}],
        "sampler": {"kind": "SAMPLER_KIND_GRID"},
        "pruner": {"kind": "PRUNER_KIND_NONE"},
        "budget": {"max_trials": 1, "max_parallel": 1, "trial_timeout": "120s"},
        "task": {"framework": "FRAMEWORK_TORCH", "epochs": 3, **task},
        "seed": 3,
    }
    document.update(overrides)
    return document


class UserStack:
    def __init__(
        self,
        infra: Infra,
        state: Path,
        *,
        trainers: int = 2,
        trainer_env: Mapping[str, str] | None = None,
    ) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.infra = infra
        self.state = state
        self.tuner_topics = TunerTopics.unique(suffix)
        self.tuner_topics.create(infra.kafka)
        self.topics = TrainerTopics(
            trials=self.tuner_topics.trials,
            reports=self.tuner_topics.reports,
            control=self.tuner_topics.control,
            models=f"models.{suffix}",
            dlq=self.tuner_topics.dlq,
        )
        self.topics.create(infra.kafka)
        self.group = f"trainers-{suffix}"
        self.recorder = BusRecorder(
            infra.kafka,
            {
                self.topics.reports: tuning_pb2.TrialReport,
                self.topics.models: models_pb2.ModelReady,
                self.topics.control: tuning_pb2.TrialControl,
            },
        )
        self.tuner = TunerProcess(infra, self.tuner_topics, f"tuner-{suffix}", state)
        self._trainer_env = dict(trainer_env or {})
        self.trainers = [self.trainer(f"trainer-{i}") for i in range(1, trainers + 1)]
        self.model_port = free_port()
        self._model_log = (state / "model.log").open("ab")
        self.model_server = subprocess.Popen(
            [sys.executable, "-m", "svc_model"],
            cwd=ROOT,
            env={
                **os.environ,
                "AISTACK_KAFKA_BOOTSTRAP": infra.kafka.bootstrap,
                "AISTACK_REDIS_URL": infra.redis.url,
                "AISTACK_MODEL_GRPC_ADDRESS": f"127.0.0.1:{self.model_port}",
                "AISTACK_MODEL_MODELS_TOPIC": self.topics.models,
                "AISTACK_MODEL_DLQ_TOPIC": self.topics.dlq,
                "AISTACK_MODEL_METRICS_PORT": "0",
                "AISTACK_MODEL_POLICY": "latest",
                "AISTACK_STATE_DIR": str(state / "model-server"),
                "AISTACK_LOG_FORMAT": "json",
            },
            stdout=self._model_log,
            stderr=subprocess.STDOUT,
        )
        self.settings = ClientSettings(
            tuner=TunerClientSettings(target=self.tuner.target),
            model=ModelClientSettings(target=f"127.0.0.1:{self.model_port}"),
            artifacts=ArtifactClientSettings(artifact_root=str(state / "artifacts")),
            lineage=LineageSettings(
                kafka=infra.kafka, models_topic=self.topics.models, timeout_seconds=60
            ),
        )
        self.client = Client(settings=self.settings)
        wait_until(self._tuner_answers, 60, f"the tuner did not answer:\n{self.logs()}")

    def trainer(self, name: str) -> TrainerProcess:
        return TrainerProcess(
            self.infra,
            self.topics,
            self.group,
            self.state,
            name,
            {
                "AISTACK_TRAINER_THREADS": "1",
                "AISTACK_TRAINER_EXECUTOR_STALL_SECONDS": str(STALL_SECONDS),
                "AISTACK_TRAINER_TRIAL_MEMORY_LIMIT_MB": str(MEMORY_LIMIT_MB),
                "AISTACK_TRAINER_ARTIFACT_ROOT": str(self.state / "artifacts"),
                "AISTACK_TRAINER_SPARE_EXECUTORS": "torch",
                **self._trainer_env,
            },
        )

    def _tuner_answers(self) -> bool:
        try:
            self.client.trials("none-such")
        except Exception as exc:  # NotFound once it answers
            return type(exc).__name__ == "NotFound"
        return True

    def run_study(
        self,
        spec: dict[str, Any] | Path,
        *,
        code: Path | None = None,
        timeout: float = 300,
        progress: TextIO | None = None,
    ) -> api.Study:
        """Create the study, wait for its end (its progress lines on `progress`); the study as
        it ended."""
        study = self.client.create_study(spec, code=code)
        try:
            return self.client.wait(study.study_id, progress=progress or False, timeout=timeout)
        except Exception:
            print(self.logs())
            raise

    def reports(
        self, trial_id: str, *, ended: bool = True, timeout: float = 30
    ) -> list[tuning_pb2.TrialReport]:
        """The trial's reports; when `ended`, read once its terminal one is on the recorder
        (which may lag the tuner, which has already seen it)."""
        if ended:
            self.recorder.wait_for(
                self.topics.reports,
                lambda r: isinstance(r, tuning_pb2.TrialReport)
                and r.trial_id == trial_id
                and r.WhichOneof("event") in ("completed", "failed", "pruned"),
                timeout=timeout,
            )
        return [
            r
            for r in self.recorder.messages(self.topics.reports)
            if isinstance(r, tuning_pb2.TrialReport) and r.trial_id == trial_id
        ]

    def model_ready(self, name: str, version: str, timeout: float = 30) -> models_pb2.ModelReady:
        found = self.recorder.wait_for(
            self.topics.models,
            lambda m: isinstance(m, models_pb2.ModelReady)
            and m.model_name == name
            and m.version == version,
            timeout=timeout,
        )
        assert isinstance(found, models_pb2.ModelReady)
        return found

    def predict(self, model: str, x: np.ndarray, version: str = "") -> dict[str, Any]:
        """``aistack.Client.predict`` (tritonclient) in a process of its own:
        this one may hold aistack's own ``inference`` protos."""
        path = self.state / f"x-{uuid.uuid4().hex[:6]}.npy"
        np.save(path, x)
        done = subprocess.run(
            [sys.executable, "-m", "tests.integration.client_predict",
             self.settings.model.target, model, version, str(path)],
            cwd=ROOT, capture_output=True, text=True, timeout=150,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:] + self.logs()
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    def cli(
        self, *args: str, timeout: float = 180, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The ``aistack`` command with this stack's settings (and ``env``)."""
        given = env or {}
        env = {
            **os.environ,
            "AISTACK_KAFKA_BOOTSTRAP": self.infra.kafka.bootstrap,
            "AISTACK_TUNER_TARGET": self.tuner.target,
            "AISTACK_MODEL_TARGET": self.settings.model.target,
            "AISTACK_TRAINER_ARTIFACT_ROOT": str(self.state / "artifacts"),
            "AISTACK_LINEAGE_MODELS_TOPIC": self.topics.models,
            "AISTACK_SCORE_MODELS_TOPIC": self.topics.models,
            "AISTACK_STATE_DIR": str(self.state / "cli"),
            "AISTACK_SPARK_MASTER": "local[1]",
            **given,
        }
        return subprocess.run(
            [sys.executable, "-m", "aistack.cli", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def logs(self) -> str:
        parts = [f"--- tuner\n{self.tuner.log_text()[-3000:]}"]
        parts += [f"--- {t.name}\n{t.log_text()[-4000:]}" for t in self.trainers]
        parts.append(f"--- model\n{(self.state / 'model.log').read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)

    def wait_for(self, what: str, condition: Any, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} within {timeout} s\n{self.logs()}")
            time.sleep(0.2)

    def close(self) -> None:
        self.client.close()
        self.model_server.terminate()
        try:
            self.model_server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.model_server.kill()
        self._model_log.close()
        for trainer in self.trainers:
            trainer.close()
        self.tuner.close()
        self.recorder.close()
