"""svc_transform's settings: ``AISTACK_TRANSFORM_*``, ``AISTACK_SPARK_*`` and the shared ones."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from shared.bus.topics import EVENTS_CLEAN, EVENTS_DLQ, FEATURES_WINDOWS
from shared.feature_store import ONLINE_KEY_PREFIX
from shared.settings import ServiceSettings, SparkSettings


class TransformSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="AISTACK_TRANSFORM_", frozen=True, extra="ignore")

    spark: SparkSettings = Field(default_factory=SparkSettings)
    source_topic: str = EVENTS_CLEAN
    features_topic: str = FEATURES_WINDOWS
    dlq_topic: str = EVENTS_DLQ
    # Event-time windows: a tumbling one of this size, and sliding ones of
    # this size every slide; 0 turns the sliding windows off.
    tumbling_window_seconds: int = Field(default=60, ge=1)
    sliding_window_seconds: int = Field(default=300, ge=0)
    sliding_slide_seconds: int = Field(default=60, ge=1)
    # How late an event may be and still update its window.
    watermark_seconds: int = Field(default=30, ge=0)
    # The windows' micro-batch interval: the single query's while the open
    # windows are off, the closed-window query's of three.
    trigger_seconds: float = Field(default=5.0, gt=0)
    # "one": a single query and stateful operator gives the closed windows,
    # the open ones and the dead letters (svc_transform.single_query), on the
    # open windows' interval while they are on; "three": a query each, each
    # reading the clean topic (slower to read a backlog, its open windows a
    # little fresher: docs/benchmarks.md). Each shape checkpoints apart: a
    # change starts the other from AISTACK_TRANSFORM_STARTING_OFFSETS.
    queries: Literal["one", "three"] = "one"
    # With three queries, the dead-letter query's own interval: nobody waits
    # on dead letters, and each of its batches decodes every record again,
    # competing for cores.
    dead_letter_trigger_seconds: float = Field(default=10.0, gt=0)
    # With three queries, the dead-letter query's Kafka sink's asynchronous
    # progress tracking (Spark 3.4+): offsets are committed in the
    # background, which takes them off each batch's path.
    async_progress: bool = True
    # Where a query without a checkpoint starts: "earliest", "latest", or
    # Spark's per-partition JSON ({"aistack.events.clean": {"0": 42, ...}}),
    # which a fresh event-time epoch uses to start where the last one ended.
    starting_offsets: str = "earliest"
    # Most records a micro-batch reads (0: all there are); bounds a batch
    # after downtime, as Spark's maxOffsetsPerTrigger.
    max_offsets_per_trigger: int = Field(default=0, ge=0)
    # Where the query's checkpoint and the Parquet offline store live;
    # default: under the state directory.
    checkpoint_dir: str = ""
    offline_dir: str = ""
    # Online store: latest closed window per entity and metric.
    online_key_prefix: str = ONLINE_KEY_PREFIX
    online_ttl_seconds: int = Field(default=86_400, ge=1)
    # The open windows' running aggregates in the online store, every
    # micro-batch of the single query (or, with three, of a query of their
    # own, update output mode), on this trigger: 0 starts a batch as
    # soon as the last ends (idle, the query asks Kafka for new offsets every
    # 10 ms); an interval aligns each start to its next multiple, which adds
    # half an interval of staleness on average. "tumbling": the tumbling
    # kind's; "all" adds the sliding kind's (each event then updates every
    # sliding window that holds it, which on 2 cores costs a third of a
    # second of freshness); "none": closed windows only.
    open_windows: Literal["tumbling", "all", "none"] = "tumbling"
    open_window_trigger_seconds: float = Field(default=0.0, ge=0)
    # A closed-window batch of at most this many windows is written to Kafka
    # and Redis by the driver from one collect (no Kafka job, no Python
    # workers; the windows.written log line times each part); a larger one
    # by Spark's Kafka sink and its executors. With one query, a batch after
    # one of at most this many rows (windows and dead letters) is computed
    # and collected, every kind, by one job. 0: always by Spark.
    driver_write_max_windows: int = Field(default=20_000, ge=0)
    # A windows query's batch expected to hold at most this many rows runs
    # Spark's interpreted projections (svc_transform.codegen): generating
    # and compiling them in every task costs a small batch more than its
    # rows. 0: always generated code.
    interpreted_max_rows: int = Field(default=20_000, ge=0)
    metrics_port: int = Field(default=9103, ge=0, le=65535)

    @field_validator("starting_offsets")
    @classmethod
    def _check_starting_offsets(cls, value: str) -> str:
        if value in ("earliest", "latest"):
            return value
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        valid = isinstance(parsed, dict) and all(
            isinstance(by_partition, dict)
            and all(p.isdigit() and isinstance(o, int) for p, o in by_partition.items())
            for by_partition in parsed.values()
        )
        if not valid:
            raise ValueError(
                'expected earliest, latest or {"topic": {"partition": offset, ...}} as JSON'
            )
        return value

    @model_validator(mode="after")
    def _check_windows(self) -> TransformSettings:
        if self.tumbling_window_seconds < self.trigger_seconds:
            raise ValueError(
                f"AISTACK_TRANSFORM_TUMBLING_WINDOW_SECONDS ({self.tumbling_window_seconds}) "
                f"is shorter than AISTACK_TRANSFORM_TRIGGER_SECONDS ({self.trigger_seconds})"
            )
        if self.sliding_window_seconds:
            if self.sliding_slide_seconds > self.sliding_window_seconds:
                raise ValueError(
                    "AISTACK_TRANSFORM_SLIDING_SLIDE_SECONDS is longer than "
                    "AISTACK_TRANSFORM_SLIDING_WINDOW_SECONDS"
                )
            if self.sliding_window_seconds % self.sliding_slide_seconds:
                raise ValueError(
                    "AISTACK_TRANSFORM_SLIDING_WINDOW_SECONDS must be a multiple of "
                    "AISTACK_TRANSFORM_SLIDING_SLIDE_SECONDS"
                )
            if self.sliding_window_seconds < self.trigger_seconds:
                raise ValueError(
                    f"AISTACK_TRANSFORM_SLIDING_WINDOW_SECONDS ({self.sliding_window_seconds}) "
                    f"is shorter than AISTACK_TRANSFORM_TRIGGER_SECONDS ({self.trigger_seconds})"
                )
        return self

    def checkpoint_path(self) -> str:
        return self.checkpoint_dir or str(self.common.state_dir / "transform" / "checkpoint")

    def offline_path(self) -> str:
        return self.offline_dir or str(self.common.state_dir / "features" / "windows")
