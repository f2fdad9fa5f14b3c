"""``python -m svc_transform`` as a real process, and what it wrote, for integration tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer
from google.protobuf.message import DecodeError

from shared.bus.topics import (
    EVENTS_CLEAN,
    EVENTS_DLQ,
    FEATURES_WINDOWS,
    TOPICS_BY_NAME,
    ensure_topics,
)
from shared.contracts.aistack.v1 import common_pb2, events_pb2
from shared.ports import free_port
from shared.settings import KafkaSettings
from tests.infra import Infra, metric_value


@dataclass(frozen=True)
class TransformTopics:
    clean: str
    features: str
    dlq: str
    redis_prefix: str

    @classmethod
    def unique(cls, suffix: str) -> TransformTopics:
        return cls(
            f"clean.{suffix}", f"features.{suffix}", f"dlq.{suffix}", f"test:{suffix}:features:"
        )

    def create(self, kafka: KafkaSettings) -> None:
        ensure_topics(
            kafka,
            [
                TOPICS_BY_NAME[EVENTS_CLEAN].named(self.clean),
                TOPICS_BY_NAME[FEATURES_WINDOWS].named(self.features),
                TOPICS_BY_NAME[EVENTS_DLQ].named(self.dlq),
            ],
        )


class TransformJob:
    """The job with its own state directory (checkpoints, Parquet), log file and metrics port."""

    def __init__(self, infra: Infra, topics: TransformTopics, state_dir: Path, **env: str) -> None:
        self.metrics_port = free_port()
        self.state_dir = state_dir
        self.offline_dir = state_dir / "features" / "windows"
        self.log_path = state_dir / f"transform-{self.metrics_port}.log"
        state_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "svc_transform"],
            env={
                **os.environ,
                "AISTACK_KAFKA_BOOTSTRAP": infra.kafka.bootstrap,
                "AISTACK_REDIS_URL": infra.redis.url,
                "AISTACK_STATE_DIR": str(state_dir),
                "AISTACK_LOG_FORMAT": "json",
                "AISTACK_SPARK_MASTER": "local[2]",
                "AISTACK_TRANSFORM_SOURCE_TOPIC": topics.clean,
                "AISTACK_TRANSFORM_FEATURES_TOPIC": topics.features,
                "AISTACK_TRANSFORM_DLQ_TOPIC": topics.dlq,
                "AISTACK_TRANSFORM_ONLINE_KEY_PREFIX": topics.redis_prefix,
                "AISTACK_TRANSFORM_METRICS_PORT": str(self.metrics_port),
                "AISTACK_TRANSFORM_TRIGGER_SECONDS": "1",
                "AISTACK_TRANSFORM_DEAD_LETTER_TRIGGER_SECONDS": "1",
                "AISTACK_TRANSFORM_TUMBLING_WINDOW_SECONDS": "10",
                "AISTACK_TRANSFORM_SLIDING_WINDOW_SECONDS": "0",
                "AISTACK_TRANSFORM_WATERMARK_SECONDS": "5",
                **env,
            },
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Its own process group: kill reaches Spark's JVM too, as kill -9 of a pod would.
            start_new_session=True,
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def counter(self, name: str, labels: str = "") -> float:
        return metric_value(self.metrics_port, f"aistack_{name}", labels)

    def terminate(self, timeout: float = 90.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        """kill -9 of the job and its JVM, mid-batch or not."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)

    def close(self) -> None:
        self.kill()
        self._log.close()


#: (topic, partition, min_offset, max_offset, count): an aistack.v1.OffsetRange.
Range = tuple[str, int, int, int, int]


def clean_positions(kafka: KafkaSettings, topic: str, wanted: int) -> dict[str, tuple[int, int]]:
    """Each CleanEvent's (partition, offset) on ``topic``, by event id, once
    ``wanted`` have been read (records that are no CleanEvent are skipped)."""
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": f"positions-{topic}-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    positions: dict[str, tuple[int, int]] = {}
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline and len(positions) < wanted:
            for record in consumer.consume(100, timeout=0.5):
                if record.error():
                    continue
                try:
                    event = events_pb2.CleanEvent.FromString(record.value())
                except DecodeError:
                    continue
                if event.event_id:
                    positions[event.event_id] = (record.partition(), record.offset())
    finally:
        consumer.close()
    return positions


def expected_sources(
    topic: str, positions: dict[str, tuple[int, int]], event_ids: Iterable[str]
) -> list[Range]:
    """The offset ranges of a window of exactly these events, as svc_transform orders them."""
    by_partition: dict[int, list[int]] = {}
    for event_id in event_ids:
        partition, offset = positions[event_id]
        by_partition.setdefault(partition, []).append(offset)
    return [
        (topic, p, min(offsets), max(offsets), len(offsets))
        for p, offsets in sorted(by_partition.items())
    ]


def ranges(sources: Iterable[common_pb2.OffsetRange]) -> list[Range]:
    """A FeatureWindow's ``sources`` as tuples (the offline store's structs are
    such tuples already: ``[tuple(s) for s in row.sources]``)."""
    return [(s.topic, s.partition, s.min_offset, s.max_offset, s.count) for s in sources]
