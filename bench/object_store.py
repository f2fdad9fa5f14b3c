"""What the object store costs against local disk, in one run: the same
work twice, once with its files on this machine's disk, once on an
S3-compatible object store (S3Proxy, the local stack's, over HTTP with
signed requests, on this machine; a store across a network costs more).

1. **The offline store's write**: svc_transform's Parquet sink
   (``WindowSink.to_parquet``, each batch replacing its own partitions) on
   the same synthetic windows, BATCHES batches of WINDOWS windows each, one
   Spark session (local[2]) warm before the clock, to a directory and to
   ``s3a://`` (Hadoop's S3A with the cloud committers).
2. **A study's checkpoint traffic**: ``bench.user_code``'s study (the
   example project's PyTorch loop: a checkpoint every epoch, the model
   exported at the end, the code shipped with the study) run by
   ``python -m svc_tuner`` and one ``python -m svc_trainer``, with the
   trainer's artifact store (``AISTACK_TRAINER_ARTIFACT_ROOT``) on the
   bucket (each epoch's checkpoint uploaded, the models and the code package
   stored there), then on disk.

Higher always better (wall time on disk / wall time on the bucket); both
are aistack against itself, on two stores:

    offline_store_s3_vs_disk: ratio R (goal 0.5)
    trial_s3_vs_disk: ratio R (goal 0.9)

Needs a broker and Redis (``aistack infra up``); starts its own object store.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import profiling
from bench.harness import print_ratio
from bench.user_code import on_the_bus, write_table
from compose.object_store import Standalone
from shared.settings import CommonSettings, ObjectStoreSettings

GOAL_OFFLINE = 0.5
GOAL_TRIAL = 0.9
BATCHES = 10
WINDOWS = 2_000


# ---- the offline store's write ----------------------------------------------------------


def windows_frame(spark: Any, batch: int) -> Any:
    """WINDOWS closed windows as svc_transform's window query hands them to
    its sink (every offline column and the partitions but ``batch``): one
    minute's tumbling windows of 200 sensors and ten metrics, cached."""
    from pyspark.sql import functions as F

    from shared.feature_store import OFFLINE_COLUMNS, PARTITION_COLUMNS

    start = 1_767_225_600 + batch * 60
    value = (F.col("id") * 0.5 + batch).cast("double")
    source = F.struct(
        F.lit("aistack.events.clean").alias("topic"),
        (F.col("id") % 3).cast("int").alias("partition"),
        F.col("id").alias("min_offset"),
        (F.col("id") + 10).alias("max_offset"),
        F.lit(11).cast("long").alias("count"),
    )
    columns = {
        "window_key": F.concat(F.lit("w-"), F.col("id").cast("string")),
        "entity_id": F.concat(F.lit("sensor-"), (F.col("id") % 200).cast("string")),
        "path": F.lit(""),
        "unit": F.lit("celsius"),
        "window_start": F.timestamp_seconds(F.lit(start)),
        "window_end": F.timestamp_seconds(F.lit(start + 60)),
        "window_size": F.lit(60_000_000).cast("long"),
        "window_slide": F.lit(60_000_000).cast("long"),
        "count": F.lit(11).cast("long"),
        **{name: value for name in ("mean", "min", "max", "stddev", "last", "p50", "p95")},
        "error_rate": F.lit(0.0),
        "last_event_time": F.timestamp_seconds(F.lit(start + 59)),
        "sources": F.array(source),
        "date": F.lit("2026-01-01"),
        "metric": F.concat(F.lit("m"), (F.col("id") % 10).cast("string")),
        "window": F.lit("tumbling-60s"),
    }
    wanted = [*OFFLINE_COLUMNS, *(c for c in PARTITION_COLUMNS if c != "batch")]
    return spark.range(WINDOWS).select(*[columns[c].alias(c) for c in wanted]).cache()


def offline_writes(spark: Any, path: str, frames: list[Any]) -> float:
    """Seconds for the sink to write every batch to ``path``."""
    from shared.settings import KafkaSettings, RedisSettings
    from svc_transform.sinks import WindowSink

    sink = WindowSink(
        kafka=KafkaSettings(),
        redis=RedisSettings(),
        features_topic="unused",
        offline_path=path,
        online_key_prefix="unused",
        online_ttl_seconds=60,
    )
    started = time.perf_counter()
    for batch_id, frame in enumerate(frames):
        sink.to_parquet(frame, batch_id)
    return time.perf_counter() - started


def offline_store(store: Standalone, scratch: Path) -> tuple[float, float]:
    """(seconds on disk, seconds on the bucket) for the same batches."""
    from shared.settings import SparkSettings
    from svc_transform.spark import session

    spark = session(
        SparkSettings(master="local[2]"),
        "bench-object-store",
        cache_dir=CommonSettings().cache_dir,
        work_dir=scratch / "spark",
        object_store=store.settings,
    )
    try:
        frames = [windows_frame(spark, batch) for batch in range(BATCHES)]
        for frame in frames:
            frame.count()
        # Warm: each writer's first write (class loading, the S3A client).
        offline_writes(spark, str(scratch / "warm"), frames[:1])
        offline_writes(spark, store.url("bench/warm", "s3a"), frames[:1])
        suffix = uuid.uuid4().hex[:8]
        disk = offline_writes(spark, str(scratch / f"offline-{suffix}"), frames)
        bucket = offline_writes(spark, store.url(f"bench/offline-{suffix}", "s3a"), frames)
        return disk, bucket
    finally:
        spark.stop()


# ---- a study's checkpoint traffic --------------------------------------------------------


def study(
    trials: int, table: str, state: Path, artifacts: str, store: ObjectStoreSettings | None
) -> float:
    """Wall seconds of ``bench.user_code``'s study with the trainer's
    artifact store at ``artifacts``."""
    state.mkdir(parents=True, exist_ok=True)
    return on_the_bus(trials, table, state, artifacts=artifacts, object_store=store).wall


def timed(what: str, run: Callable[[], float]) -> float:
    seconds = run()
    print(f"{what}: {seconds:.1f} s", flush=True)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=6)
    profiling.add_flag(parser, "object_store", own_children=True)
    trials = parser.parse_args().trials

    with tempfile.TemporaryDirectory(prefix="aistack-bench-") as tmp:
        scratch = Path(tmp)
        store = Standalone(scratch / "object-store", CommonSettings().cache_dir)
        store.start()
        try:
            disk, bucket = offline_store(store, scratch)
            print(
                f"offline store, {BATCHES} batches of {WINDOWS} windows: "
                f"disk {disk:.1f} s, bucket {bucket:.1f} s",
                flush=True,
            )
            table = write_table(scratch / "table.parquet")
            # The bucket's first: what a first study pays once (files not
            # yet in the page cache) counts against the store, not for it.
            on_bucket = timed(
                f"study of {trials} trials, artifacts on the bucket",
                lambda: study(
                    trials, table, scratch / "bucket", store.url("bench/artifacts"), store.settings
                ),
            )
            on_disk = timed(
                f"study of {trials} trials, artifacts on disk",
                lambda: study(trials, table, scratch / "disk", str(scratch / "artifacts"), None),
            )
        finally:
            store.stop()
    print_ratio("offline_store_s3_vs_disk", disk / bucket, GOAL_OFFLINE, itself=True)
    print_ratio("trial_s3_vs_disk", on_disk / on_bucket, GOAL_TRIAL, itself=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
