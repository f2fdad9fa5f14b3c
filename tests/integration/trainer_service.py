"""``python -m svc_trainer`` as a real process, and a reader of what it
publishes (reports, model-ready events), for integration tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from shared.bus.consumer import BusTail
from shared.bus.producer import BusProducer
from shared.bus.topics import ensure_topics
from shared.contracts.aistack.v1 import common_pb2, models_pb2, tuning_pb2
from shared.settings import KafkaSettings
from svc_trainer.settings import topic_specs
from tests.infra import Infra


@dataclass(frozen=True)
class TrainerTopics:
    trials: str
    reports: str
    control: str
    models: str
    dlq: str

    @classmethod
    def unique(cls, suffix: str) -> TrainerTopics:
        return cls(
            f"trials.{suffix}",
            f"reports.{suffix}",
            f"control.{suffix}",
            f"models.{suffix}",
            f"dlq.{suffix}",
        )

    def create(self, kafka: KafkaSettings) -> None:
        ensure_topics(
            kafka,
            topic_specs(
                trials=self.trials,
                reports=self.reports,
                control=self.control,
                models=self.models,
                dlq=self.dlq,
            ),
        )


class TrainerProcess:
    """One replica with its own log file; replicas of a test share a group,
    a state directory (artifacts, checkpoints) and topics."""

    def __init__(
        self,
        infra: Infra,
        topics: TrainerTopics,
        group: str,
        state_dir: Path,
        name: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = state_dir / f"{name}.log"
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "svc_trainer"],
            env={
                **os.environ,
                "AISTACK_KAFKA_BOOTSTRAP": infra.kafka.bootstrap,
                "AISTACK_REDIS_URL": infra.redis.url,
                "AISTACK_STATE_DIR": str(state_dir),
                "AISTACK_LOG_FORMAT": "json",
                "AISTACK_TRAINER_TRIALS_TOPIC": topics.trials,
                "AISTACK_TRAINER_REPORTS_TOPIC": topics.reports,
                "AISTACK_TRAINER_CONTROL_TOPIC": topics.control,
                "AISTACK_TRAINER_MODELS_TOPIC": topics.models,
                "AISTACK_TRAINER_DLQ_TOPIC": topics.dlq,
                "AISTACK_TRAINER_GROUP_ID": group,
                "AISTACK_TRAINER_TRAINER_ID": name,
                "AISTACK_TRAINER_DEVICE": "cpu",
                "AISTACK_TRAINER_HEARTBEAT_SECONDS": "1",
                "AISTACK_TRAINER_METRICS_PORT": "0",
                # TensorFlow's executor starts with the first TensorFlow trial.
                "AISTACK_TRAINER_WARM_FRAMEWORKS": "torch",
                # No spare for code packages: these trainers run none (but
                # tests/integration/user_stack.py's do).
                "AISTACK_TRAINER_SPARE_EXECUTORS": "",
                **(env or {}),
            },
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_events(self, event: str) -> list[dict[str, Any]]:
        """The replica's JSON log lines named ``event``, oldest first."""
        found = []
        for line in self.log_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == event:
                    found.append(record)
        return found

    def terminate(self, timeout: float = 180.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)

    def close(self) -> None:
        self.kill()
        self._log.close()


@dataclass
class BusRecorder:
    """Collects every message published on some topics from now on."""

    kafka: KafkaSettings
    topics: dict[str, type[Message]]
    received: list[tuple[str, Message]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tails = {
            topic: BusTail(self.kafka, topics=[topic], message_cls=cls)
            for topic, cls in self.topics.items()
        }
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for topic, tail in self._tails.items():
                for record in tail.poll_batch(100, timeout=0.1):
                    with self._lock:
                        self.received.append((topic, record.decode()))

    def messages(self, topic: str) -> list[Message]:
        with self._lock:
            return [message for t, message in self.received if t == topic]

    def wait_for(
        self, topic: str, predicate: Callable[[Message], bool], *, timeout: float
    ) -> Message:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for message in self.messages(topic):
                if predicate(message):
                    return message
            time.sleep(0.1)
        raise AssertionError(f"nothing on {topic} matched within {timeout}s")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for tail in self._tails.values():
            tail.close()


def trial_request(
    study: str,
    number: int,
    *,
    framework: int = common_pb2.FRAMEWORK_TORCH,
    strategy: str = "single",
    epochs: int = 2,
    world_size: int = 0,
    dataset: str = "digits",
    model_family: str = "cnn",
    metric: str = "val_error",
    params: dict[str, float | int | str] | None = None,
    options: dict[str, str] | None = None,
) -> tuning_pb2.TrialRequested:
    request = tuning_pb2.TrialRequested(
        trial_id=f"{study}/{number}",
        study_id=study,
        trial_number=number,
        task=tuning_pb2.TrainingTask(
            dataset=dataset,
            model_family=model_family,
            framework=framework,  # type: ignore[arg-type]
            strategy=strategy,
            world_size=world_size,
            epochs=epochs,
            options=options or {},
        ),
        objective=common_pb2.Objective(metric=metric, direction=common_pb2.DIRECTION_MINIMIZE),
        attempt=1,
        seed=7,
    )
    for name, value in (params or {"filters": 8, "units": 32}).items():
        if isinstance(value, str):
            request.params[name].string_value = value
        elif isinstance(value, int):
            request.params[name].int_value = value
        else:
            request.params[name].float_value = value
    return request


def publish(kafka: KafkaSettings, topic: str, *requests: Message, key: str = "") -> None:
    producer = BusProducer(kafka, source="test")
    for request in requests:
        trial_id = getattr(request, "trial_id", key)
        producer.publish(topic, request, key=trial_id)
    producer.flush()


def reports_of(recorder: BusRecorder, topic: str, trial_id: str) -> list[tuning_pb2.TrialReport]:
    return [
        r
        for r in recorder.messages(topic)
        if isinstance(r, tuning_pb2.TrialReport) and r.trial_id == trial_id
    ]


def final_report(
    recorder: BusRecorder, topic: str, trial_id: str, *, timeout: float
) -> tuning_pb2.TrialReport:
    message = recorder.wait_for(
        topic,
        lambda r: isinstance(r, tuning_pb2.TrialReport)
        and r.trial_id == trial_id
        and r.WhichOneof("event") in ("completed", "failed", "pruned"),
        timeout=timeout,
    )
    assert isinstance(message, tuning_pb2.TrialReport)
    return message


def model_ready(recorder: BusRecorder, topic: str, trial_id: str) -> models_pb2.ModelReady:
    """The one model-ready event of ``trial_id`` (published before its final
    report, but read from another topic: wait for it)."""
    ready = recorder.wait_for(
        topic,
        lambda m: isinstance(m, models_pb2.ModelReady) and m.lineage.trial_id == trial_id,
        timeout=30,
    )
    assert isinstance(ready, models_pb2.ModelReady)
    same = [m for m in recorder.messages(topic) if m.lineage.trial_id == trial_id]  # type: ignore[attr-defined]
    assert len(same) == 1, same
    return ready


class Stack:
    """Trainer replicas on unique topics, a group, and a recorder of what
    they publish."""

    def __init__(self, infra: Infra, root: Path) -> None:
        suffix = uuid.uuid4().hex[:12]
        self.infra = infra
        self.topics = TrainerTopics.unique(suffix)
        self.topics.create(infra.kafka)
        self.group = f"trainers-{suffix}"
        self.state = root
        self.recorder = BusRecorder(
            infra.kafka,
            {
                self.topics.reports: tuning_pb2.TrialReport,
                self.topics.models: models_pb2.ModelReady,
            },
        )
        self.trainers: list[TrainerProcess] = []

    def trainer(self, name: str, env: dict[str, str] | None = None) -> TrainerProcess:
        started = TrainerProcess(self.infra, self.topics, self.group, self.state, name, env)
        self.trainers.append(started)
        return started

    def send(self, *requests: tuning_pb2.TrialRequested) -> None:
        publish(self.infra.kafka, self.topics.trials, *requests)

    def final(self, trial_id: str, timeout: float = 300) -> tuning_pb2.TrialReport:
        return final_report(self.recorder, self.topics.reports, trial_id, timeout=timeout)

    def reports(self, trial_id: str) -> list[tuning_pb2.TrialReport]:
        return reports_of(self.recorder, self.topics.reports, trial_id)

    def logs(self) -> str:
        return "\n".join(t.log_text()[-3000:] for t in self.trainers)

    def close(self) -> None:
        for trainer in self.trainers:
            trainer.close()
        self.recorder.close()
