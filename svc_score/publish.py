"""``aistack score --publish``: the rows of a written output, one
``BatchPrediction`` each, to ``aistack.predictions.batch``.

The executors publish what the job wrote (the Parquet output, read back), not
what it computed, so the topic holds the output's rows and nothing a failed
write left behind. Delivery is at least once: a retried task publishes its
partition again. Every record names its run, and only a run that completed
has a lineage file naming that run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import predictions_pb2
from shared.object_store import hadoop_url
from shared.settings import KafkaSettings
from svc_score.plan import Plan

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Spark SQL types a window bound is published from (as a Timestamp).
_TIMESTAMPS = frozenset({"timestamp", "timestamp_ntz"})
# Serve delivery reports every this many records: a partition of a million
# rows would otherwise fill the producer's queue before its first report.
_POLL_EVERY = 5_000


@dataclass(frozen=True)
class Publication:
    """Where a run's predictions go."""

    kafka: KafkaSettings
    topic: str


@dataclass(frozen=True)
class Layout:
    """What a record holds, from the plan: plain values, so that the
    executors' function captures no protobuf."""

    model_name: str
    model_version: str
    keys: tuple[str, ...]
    outputs: tuple[str, ...]
    timestamp_keys: frozenset[str]  # window bounds of a timestamp type

    @classmethod
    def of(cls, chosen: Plan, key_types: Mapping[str, str]) -> Layout:
        return cls(
            chosen.event.model_name,
            chosen.event.version,
            chosen.keys,
            tuple(name for name, _, _ in chosen.outputs),
            frozenset(key for key in chosen.keys if key_types.get(key) in _TIMESTAMPS),
        )


def messages(
    batch: Any, layout: Layout, run_id: str
) -> Iterator[tuple[str, predictions_pb2.BatchPrediction]]:
    """(key, message) for each row of ``batch``, an Arrow record batch of
    the output's columns. The key is the row's entity, else the model's
    name. A window bound that is not a timestamp is left out."""
    for values in batch.to_pylist():
        message = predictions_pb2.BatchPrediction(
            run_id=run_id, model_name=layout.model_name, model_version=layout.model_version
        )
        for key in layout.keys:
            value = values[key]
            if value is None:
                continue
            if key == "sources":
                for source in value:
                    message.window_sources.add(**source)
            elif key in ("window_start", "window_end"):
                if key in layout.timestamp_keys:
                    getattr(message, key).FromDatetime(value)
            else:
                setattr(message, key, str(value))
        for output in layout.outputs:
            flat = np.asarray(values[output], dtype=np.float64).reshape(-1)
            message.outputs.add(name=output, values=flat.tolist())
        yield message.entity_id or layout.model_name, message


def publish(
    spark: SparkSession, output: Path | str, layout: Layout, run_id: str, to: Publication
) -> int:
    """Publish every row of the Parquet at ``output`` (a path, or a URL on
    the object store: read as ``s3a://``) from the executors; return how many
    records were delivered. A record not delivered fails its task, and so the
    job (Unavailable, in the worker's last line)."""
    frame = spark.read.parquet(hadoop_url(str(output)))
    counts = frame.mapInArrow(_publisher(layout, run_id, to), "published long")
    return int(sum(row.published for row in counts.collect()))


def _publisher(
    layout: Layout, run_id: str, to: Publication
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    def run(frames: Iterable[Any]) -> Iterator[Any]:
        producer = BusProducer(to.kafka, source="svc_score")
        sent = 0
        for frame in frames:
            for key, message in messages(frame, layout, run_id):
                producer.publish(to.topic, message, key=key)
                sent += 1
                if sent % _POLL_EVERY == 0:
                    producer.poll(0)
        producer.flush()
        yield pa.RecordBatch.from_pydict({"published": pa.array([sent], pa.int64())})

    return run
