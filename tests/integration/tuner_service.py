"""``python -m svc_tuner`` as a real process, and a small real trainer that
evaluates an analytic objective in place of svc_trainer, for integration tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shared import search_space
from shared.bus.consumer import BusConsumer
from shared.bus.producer import BusProducer
from shared.bus.topics import ensure_topics
from shared.contracts.aistack.v1 import tuning_pb2
from shared.ports import free_port
from shared.settings import KafkaSettings
from svc_tuner.settings import topic_specs
from tests.infra import Infra


@dataclass(frozen=True)
class TunerTopics:
    trials: str
    reports: str
    control: str
    results: str
    dlq: str
    drift: str

    @classmethod
    def unique(cls, suffix: str) -> TunerTopics:
        return cls(
            f"trials.{suffix}",
            f"reports.{suffix}",
            f"control.{suffix}",
            f"results.{suffix}",
            f"dlq.{suffix}",
            f"drift.{suffix}",
        )

    def create(self, kafka: KafkaSettings) -> None:
        ensure_topics(
            kafka,
            topic_specs(
                trials=self.trials,
                reports=self.reports,
                control=self.control,
                results=self.results,
                dlq=self.dlq,
                drift=self.drift,
            ),
        )


class TunerProcess:
    """The service with its own gRPC port, Redis prefix and log file."""

    def __init__(
        self,
        infra: Infra,
        topics: TunerTopics,
        prefix: str,
        log_dir: Path,
        *,
        trainer_group: str = "svc_trainer",
    ) -> None:
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.log_path = log_dir / f"tuner-{self.port}.log"
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "svc_tuner"],
            env={
                **os.environ,
                "AISTACK_KAFKA_BOOTSTRAP": infra.kafka.bootstrap,
                "AISTACK_REDIS_URL": infra.redis.url,
                "AISTACK_LOG_FORMAT": "json",
                "AISTACK_TUNER_GRPC_ADDRESS": self.target,
                "AISTACK_TUNER_TRIALS_TOPIC": topics.trials,
                "AISTACK_TUNER_REPORTS_TOPIC": topics.reports,
                "AISTACK_TUNER_CONTROL_TOPIC": topics.control,
                "AISTACK_TUNER_RESULTS_TOPIC": topics.results,
                "AISTACK_TUNER_DLQ_TOPIC": topics.dlq,
                "AISTACK_TUNER_DRIFT_TOPIC": topics.drift,
                "AISTACK_TUNER_GROUP_ID": f"tuner-{prefix}",
                "AISTACK_TUNER_TRAINER_GROUP_ID": trainer_group,
                "AISTACK_TUNER_STORAGE_PREFIX": prefix,
                "AISTACK_TUNER_TICK_SECONDS": "0.2",
                "AISTACK_TUNER_METRICS_PORT": "0",
            },
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 30.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)

    def close(self) -> None:
        self.kill()
        self._log.close()


def quadratic(request: tuning_pb2.TrialRequested) -> float:
    """Smallest (0) at x = 1, y = -2."""
    x = search_space.python_value(request.params["x"])
    y = search_space.python_value(request.params["y"])
    assert isinstance(x, float) and isinstance(y, int)
    return (x - 1.0) ** 2 + (y + 2) ** 2


@dataclass
class AnalyticTrainer:
    """Consumes trial requests as one consumer-group member, and for each
    reports ``epochs`` intermediate values converging on the objective, then
    the result. Runs in a thread until ``stop``."""

    kafka: KafkaSettings
    topics: TunerTopics
    group: str
    # Its trainer id: in its reports and, as its client id, in the group.
    name: str = "analytic"
    # More consumer settings (an assignor, say).
    consumer_config: dict[str, str] = field(default_factory=dict)
    epochs: int = 2
    objective: Callable[[tuning_pb2.TrialRequested], float] = quadratic
    # Further metrics of a completed trial (a baseline's value, say).
    metrics: Callable[[tuning_pb2.TrialRequested], dict[str, float]] = lambda request: {}
    # Return a TrialFailed to fail a trial instead of training it.
    failure: Callable[[tuning_pb2.TrialRequested], tuning_pb2.TrialFailed | None] = (
        lambda request: None
    )
    # True: the trainer "dies" on this request (no report at all).
    vanish: Callable[[tuning_pb2.TrialRequested], bool] = lambda request: False
    received: list[tuning_pb2.TrialRequested] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    partitions: dict[str, int] = field(default_factory=dict)
    max_in_flight: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> AnalyticTrainer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        consumer: BusConsumer[tuning_pb2.TrialRequested] = BusConsumer(
            self.kafka,
            group_id=self.group,
            topics=[self.topics.trials],
            message_cls=tuning_pb2.TrialRequested,
            config={"client.id": self.name, **self.consumer_config},
        )
        producer = BusProducer(self.kafka, source="analytic-trainer")
        pending: list[tuning_pb2.TrialRequested] = []
        try:
            while not self._stop.is_set():
                records = consumer.poll_batch(100, timeout=0.05)
                # The tuner's proposals arrive back to back but not in one
                # fetch: drain them all before training one, so
                # max_in_flight counts every request the tuner has out.
                while more := consumer.poll_batch(100, timeout=0.05):
                    records += more
                for record in records:
                    request = record.decode()
                    self.received.append(request)
                    self.partitions[request.trial_id] = record.partition
                    pending.append(request)
                self.max_in_flight = max(self.max_in_flight, len(pending))
                if pending:
                    self._train(producer, pending.pop(0))
                consumer.commit(records)
        finally:
            consumer.close()
            producer.flush()

    def _train(self, producer: BusProducer, request: tuning_pb2.TrialRequested) -> None:
        def send(**event: object) -> None:
            report = tuning_pb2.TrialReport(
                trial_id=request.trial_id,
                study_id=request.study_id,
                attempt=request.attempt,
                trainer_id=self.name,
                **event,  # type: ignore[arg-type]
            )
            producer.publish(self.topics.reports, report, key=request.study_id)

        if self.vanish(request):
            return
        failure = self.failure(request)
        if failure is not None:
            send(failed=failure)
        else:
            value = self.objective(request)
            for step in range(1, self.epochs + 1):
                # Converges on the final value: what a learning curve does.
                progress = value * (1 + (self.epochs - step) / self.epochs)
                send(progress=tuning_pb2.TrialProgress(step=step, value=progress))
            send(completed=tuning_pb2.TrialCompleted(value=value, metrics=self.metrics(request)))
        producer.flush()
        self.completed.append(request.trial_id)
