"""aistack's services started as deployed (``python -m svc_...``), each on
topics of the run's own, for the benchmarks that measure them or measure
against them: svc_ingest's peak rate (ingest_throughput, transform_latency),
svc_tuner (tuner_overhead, study_speedup, tuning_gain) and svc_trainer
replicas (study_speedup, tuning_gain).

Needs a broker and, for the tuner, Redis: ``aistack infra up``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from aistack.studies import load_spec
from bench.harness import (
    child_env,
    kafka_settings,
    next_scrape_in,
    python_module,
    read_metric,
    redis_settings,
    spawn,
)
from shared.bus.producer import BusProducer
from shared.bus.topics import TopicSpec, ensure_topics
from shared.contracts.aistack.v1 import common_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub
from shared.ports import free_port
from shared.rpc.client import open_channel
from shared.settings import KafkaSettings
from svc_tuner.settings import topic_specs

# ---- svc_ingest ----


def sensor_event(i: int, now: float) -> bytes:
    """Raw event ``i``: a JSON sensor reading of about 200 bytes, as loadgen sends."""
    doc = {
        "event_id": uuid.UUID(int=i + (1 << 64)).hex,
        "device_id": f"thermo-{i % 500:04d}",
        "timestamp": round(now - (i % 3600), 3),
        "metrics": {
            "temperature": {"value": 15 + (i % 200) / 10, "unit": "C"},
            "humidity": {"value": 30 + i % 50, "unit": "%"},
        },
        "site": "plant-a",
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def fill(kafka: KafkaSettings, topic: str, count: int) -> int:
    """``count`` raw sensor events into ``topic``; their mean size in bytes."""
    ensure_topics(kafka, [TopicSpec(topic, None)])
    producer = BusProducer(kafka, source="bench")
    now = time.time()
    size = 0
    for i in range(count):
        value = sensor_event(i, now)
        size += len(value)
        producer.publish_raw(
            topic,
            value,
            key=f"thermo-{i % 500:04d}".encode(),
            headers=[("content-type", b"application/json")],
        )
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush()
    return size // count


def ingest_env(
    kafka: KafkaSettings,
    source: str,
    suffix: str,
    *,
    guarantee: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The settings an ingest worker, or a peer measured against it, runs
    under: ``source`` in, clean and dead-letter topics of its own
    (``suffix``), under ``guarantee`` (else svc_ingest's default)."""
    return child_env(
        {
            "AISTACK_LOG_LEVEL": "WARNING",
            "AISTACK_INGEST_APP_ID": f"bench-ingest-{suffix}",
            "AISTACK_INGEST_SOURCE_TOPIC": source,
            "AISTACK_INGEST_CLEAN_TOPIC": f"bench.clean.{suffix}",
            "AISTACK_INGEST_DLQ_TOPIC": f"bench.dlq.{suffix}",
            "AISTACK_INGEST_MAX_FUTURE_SKEW_SECONDS": "86400",
            **({"AISTACK_INGEST_PROCESSING_GUARANTEE": guarantee} if guarantee else {}),
            **(extra or {}),
        },
        kafka=kafka,
    )


def run_worker(
    kafka: KafkaSettings, source: str, count: int, state: Path, guarantee: str | None = None
) -> float:
    """Start a worker on ``source`` (under ``guarantee``, else its default);
    its rate from first to last record, by its counter."""
    suffix = uuid.uuid4().hex[:8]
    port = free_port()
    env = ingest_env(
        kafka,
        source,
        suffix,
        guarantee=guarantee,
        extra={"AISTACK_STATE_DIR": str(state), "AISTACK_INGEST_METRICS_PORT": str(port)},
    )
    log = (state / f"worker-{suffix}.log").open("wb")
    worker = spawn(python_module("svc_ingest"), env, log)
    try:
        first_at = first_n = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if worker.poll() is not None:
                raise RuntimeError(f"worker exited {worker.returncode}; see {log.name}")
            seen = read_metric(port, "aistack_ingest_records_in_total")
            now = time.perf_counter()
            if seen and first_at is None:
                first_at, first_n = now, seen
            rate = None
            if first_at is not None and first_n is not None and now > first_at:
                if seen >= count:
                    return (seen - first_n) / (now - first_at)
                rate = (seen - first_n) / (now - first_at)
            time.sleep(next_scrape_in(seen, count, rate))
        raise RuntimeError("worker did not finish in time")
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        log.close()


# ---- svc_tuner ----


class TunerUnderTest:
    """``python -m svc_tuner`` on topics, a gRPC port and a journal of its own."""

    def __init__(self, state: Path) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.kafka = kafka_settings()
        self.topics = {
            name: f"bench.{name}.{suffix}"
            for name in ("trials", "reports", "control", "results", "dlq")
        }
        ensure_topics(
            self.kafka,
            topic_specs(**self.topics),
            partitions=6,
        )
        self.grpc = f"127.0.0.1:{free_port()}"
        self.metrics_port = free_port()
        # Its trainers' group (Trainers joins it), which it places trials by.
        self.trainer_group = f"bench-trainers-{suffix}"
        env = child_env(
            {
                "AISTACK_LOG_LEVEL": "WARNING",
                "AISTACK_TUNER_GRPC_ADDRESS": self.grpc,
                "AISTACK_TUNER_STORAGE_PREFIX": f"bench:tuner:{suffix}",
                "AISTACK_TUNER_GROUP_ID": f"bench-tuner-{suffix}",
                "AISTACK_TUNER_TRAINER_GROUP_ID": self.trainer_group,
                "AISTACK_TUNER_METRICS_PORT": str(self.metrics_port),
                **{f"AISTACK_TUNER_{n.upper()}_TOPIC": t for n, t in self.topics.items()},
            },
            kafka=self.kafka,
            redis=redis_settings(),
        )
        self._log = (state / f"tuner-{suffix}.log").open("wb")
        self.process = spawn(python_module("svc_tuner"), env, self._log)

    def engine_seconds(self) -> float:
        return read_metric(self.metrics_port, "aistack_tuner_engine_seconds_total")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self._log.close()


async def run_study(
    tuner: TunerUnderTest, spec_text: str, *, code: common_pb2.CodePackage | None = None
) -> tuple[float, float]:
    """Wall seconds of the study and its best value; ``code``: the shipped
    package its task names."""
    async with open_channel(tuner.grpc) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=60)
        stub = TunerServiceStub(channel)  # type: ignore[no-untyped-call]
        spec = load_spec(spec_text)
        if code is not None:
            spec.task.code.CopyFrom(code)
        started = time.perf_counter()
        await stub.CreateStudy(api.CreateStudyRequest(spec=spec))
        async for update in stub.WatchStudy(api.WatchStudyRequest(study_id=spec.name)):
            if update.study_state != api.STUDY_STATE_RUNNING:
                break
        wall = time.perf_counter() - started
        best = await stub.GetBestTrial(api.GetBestTrialRequest(study_id=spec.name))
        return wall, best.trial.value


# ---- svc_trainer ----


class Trainers:
    """``python -m svc_trainer`` replicas on the tuner's topics, warm."""

    def __init__(
        self,
        tuner: TunerUnderTest,
        count: int,
        state: Path,
        *,
        warm: str = "torch",
        extra: Mapping[str, str] | None = None,
    ) -> None:
        group = tuner.trainer_group
        self.logs = [state / f"trainer-{group}-{i}.log" for i in range(count)]
        self.processes = [
            spawn(
                python_module("svc_trainer"),
                child_env(
                    {
                        "AISTACK_STATE_DIR": str(state / group),
                        # wait_warm reads the readiness event off the JSON log.
                        "AISTACK_LOG_FORMAT": "json",
                        "AISTACK_TRAINER_TRIALS_TOPIC": tuner.topics["trials"],
                        "AISTACK_TRAINER_REPORTS_TOPIC": tuner.topics["reports"],
                        "AISTACK_TRAINER_CONTROL_TOPIC": tuner.topics["control"],
                        "AISTACK_TRAINER_DLQ_TOPIC": tuner.topics["dlq"],
                        "AISTACK_TRAINER_MODELS_TOPIC": f"bench.models.{group}",
                        "AISTACK_TRAINER_GROUP_ID": group,
                        "AISTACK_TRAINER_TRAINER_ID": f"{group}-{i}",
                        "AISTACK_TRAINER_DEVICE": "cpu",
                        "AISTACK_TRAINER_THREADS": "1",
                        "AISTACK_TRAINER_WARM_FRAMEWORKS": warm,
                        "AISTACK_TRAINER_METRICS_PORT": "0",
                        **(extra or {}),
                    },
                    kafka=tuner.kafka,
                ),
                log.open("wb"),
            )
            for i, log in enumerate(self.logs)
        ]

    def wait_warm(self, timeout: float = 300, *, executors: int = 1) -> None:
        """Until each replica's first ``executors`` executors are ready (its
        warm ones, and its spare for code packages when it keeps one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = [log.read_text(errors="replace").count('"executor.ready"') for log in self.logs]
            if all(count >= executors for count in ready):
                time.sleep(5)  # and the consumer group settles
                return
            if any(p.poll() is not None for p in self.processes):
                break
            time.sleep(0.5)
        raise RuntimeError(f"trainers not ready: {[log.read_text()[-2000:] for log in self.logs]}")

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(timeout=120)
