"""svc_ingest workers as real processes, and what they wrote, for integration tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer

from loadgen.records import RawRecord
from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import events_pb2
from shared.ports import free_port
from shared.settings import KafkaSettings
from svc_ingest.app import prepare_topics
from svc_ingest.settings import IngestSettings
from tests.infra import Infra, metric_value

READY_LINE = "Worker ready"


@dataclass(frozen=True)
class Topics:
    raw: str
    clean: str
    dlq: str
    app_id: str

    @classmethod
    def unique(cls, suffix: str) -> Topics:
        return cls(f"raw.{suffix}", f"clean.{suffix}", f"dlq.{suffix}", f"ingest-{suffix}")

    def env(self) -> dict[str, str]:
        return {
            "AISTACK_INGEST_SOURCE_TOPIC": self.raw,
            "AISTACK_INGEST_CLEAN_TOPIC": self.clean,
            "AISTACK_INGEST_DLQ_TOPIC": self.dlq,
            "AISTACK_INGEST_APP_ID": self.app_id,
        }


def prepare(infra: Infra, topics: Topics) -> None:
    """Create the topics as a worker would, before anything is published."""
    settings = IngestSettings(
        kafka=infra.kafka,
        source_topic=topics.raw,
        clean_topic=topics.clean,
        dlq_topic=topics.dlq,
    )
    prepare_topics(settings)


class Worker:
    """``python -m svc_ingest`` with its own state directory, log file and metrics port."""

    def __init__(
        self,
        infra: Infra,
        topics: Topics,
        state_dir: Path,
        *,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.metrics_port = free_port()
        self.state_dir = state_dir
        self.log_path = state_dir / f"worker-{self.metrics_port}.log"
        state_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "AISTACK_KAFKA_BOOTSTRAP": infra.kafka.bootstrap,
            "AISTACK_STATE_DIR": str(state_dir),
            "AISTACK_LOG_FORMAT": "json",
            "AISTACK_INGEST_METRICS_PORT": str(self.metrics_port),
            "AISTACK_INGEST_SESSION_TIMEOUT_SECONDS": "6",
            "AISTACK_INGEST_COMMIT_INTERVAL_SECONDS": "0.5",
            **topics.env(),
            **(extra_env or {}),
        }
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "svc_ingest"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def describe(self, lines: int = 12) -> str:
        """Whether the worker runs and its last log lines (each cut at 300
        characters): what a failure needs to say why records are missing."""
        code = self.process.poll()
        state = "running" if code is None else f"exited {code}"
        tail = [line[:300] for line in self.log_text().splitlines()[-lines:]]
        return f"\n--- worker :{self.metrics_port} {state}; log tail:\n" + "\n".join(tail)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY_LINE in self.log_text():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"worker not ready; log tail:\n{self.log_text()[-3000:]}")

    def counter(self, name: str, labels: str = "") -> float:
        """A counter's value from the worker's /metrics, e.g. ``ingest_records_in_total``."""
        return metric_value(self.metrics_port, f"aistack_{name}", labels)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def terminate(self, timeout: float = 60.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self._log.close()


def publish(infra: Infra, topic: str, records: list[RawRecord]) -> None:
    producer = BusProducer(
        infra.kafka, source="tests", config={"message.max.bytes": 8 * 1024 * 1024}
    )
    for record in records:
        producer.publish_raw(topic, record.value, key=record.key, headers=list(record.headers))
    producer.flush()


@dataclass
class Written:
    """What the workers committed: clean event ids and dead letters by source position."""

    clean_ids: Counter[str] = field(default_factory=Counter)
    dead_letters: dict[tuple[int, int], str] = field(default_factory=dict)
    dead_letter_count: int = 0
    dead_letters_raw: list[events_pb2.DeadLetter] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.clean_ids.values()) + self.dead_letter_count


def read_outputs(
    kafka: KafkaSettings,
    topics: Topics,
    expected_total: int,
    *,
    timeout: float = 120.0,
    quiet: float = 4.0,
) -> Written:
    """Read the clean and dead-letter topics (committed transactions only) until
    ``expected_total`` records arrived and then nothing more for ``quiet`` seconds."""
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": f"reader-{topics.app_id}-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topics.clean, topics.dlq])
    written = Written()
    deadline = time.monotonic() + timeout
    last_new = time.monotonic()
    try:
        while time.monotonic() < deadline:
            batch = consumer.consume(1000, timeout=0.5)
            for record in batch:
                if record.error():
                    continue
                last_new = time.monotonic()
                if record.topic() == topics.clean:
                    event = events_pb2.CleanEvent.FromString(record.value())
                    written.clean_ids[event.event_id] += 1
                else:
                    letter = events_pb2.DeadLetter.FromString(record.value())
                    written.dead_letters[(letter.source.partition, letter.source.offset)] = (
                        letter.reason
                    )
                    written.dead_letter_count += 1
                    written.dead_letters_raw.append(letter)
            if written.total >= expected_total and time.monotonic() - last_new >= quiet:
                break
    finally:
        consumer.close()
    return written
