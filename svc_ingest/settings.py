"""svc_ingest's settings: ``AISTACK_INGEST_*`` plus the shared Kafka/log ones."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from shared.bus.topics import EVENTS_CLEAN, EVENTS_DLQ, EVENTS_RAW
from shared.settings import ServiceSettings
from svc_ingest.rules import CleaningRules
from svc_ingest.units import DEFAULT_RANGES


class IngestSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="AISTACK_INGEST_", frozen=True, extra="ignore")

    # Faust app id: the consumer group every worker joins, and the prefix of
    # the dedup table's changelog topic and of transactional ids.
    app_id: str = Field(default="aistack-ingest", pattern=r"^[A-Za-z0-9._-]{1,200}$")
    processing_guarantee: Literal["exactly_once", "at_least_once"] = "exactly_once"
    source_topic: str = EVENTS_RAW
    clean_topic: str = EVENTS_CLEAN
    dlq_topic: str = EVENTS_DLQ
    # A repeated event id within this many seconds is a duplicate.
    dedup_window_seconds: float = Field(default=600.0, gt=0)
    # "auto": RocksDB when rocksdict is installed, else memory.
    store: Literal["auto", "rocksdb", "memory"] = "auto"
    max_payload_bytes: int = Field(default=1_048_576, gt=0)
    max_nesting_depth: int = Field(default=32, ge=1, le=1000)
    max_future_skew_seconds: float = Field(default=300.0, ge=0)
    # JSON object {"metric": [low, high]} in canonical units; merged over the
    # defaults (svc_ingest/units.py DEFAULT_RANGES).
    metric_ranges: dict[str, tuple[float, float]] = Field(default_factory=dict)
    batch_max: int = Field(default=5000, ge=1)
    batch_within_seconds: float = Field(default=0.05, gt=0)
    # How often offsets (and, under exactly_once, transactions) are committed.
    commit_interval_seconds: float = Field(default=1.0, gt=0)
    # A worker that stops heartbeating (kill -9, a hung host) loses its
    # partitions to the others after this long.
    session_timeout_seconds: float = Field(default=30.0, ge=6, le=300)
    # Static group membership (Kafka's group.instance.id): a worker restarted
    # under the same id within the session timeout takes its partitions back
    # at once, with no rebalance wait. Unique per worker (a second worker with
    # the same id is fenced); empty: dynamic membership.
    instance_id: str = Field(default="", pattern=r"^[A-Za-z0-9._-]{0,200}$")
    # Prometheus /metrics port; 0 turns it off.
    metrics_port: int = Field(default=9102, ge=0, le=65535)

    @field_validator("metric_ranges", mode="before")
    @classmethod
    def _parse_ranges(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = json.loads(value)
        if not isinstance(value, dict):
            raise ValueError('expected a JSON object like {"temperature": [-40, 60]}')
        for name, bounds in value.items():
            if not (
                isinstance(bounds, list | tuple) and len(bounds) == 2 and bounds[0] <= bounds[1]
            ):
                raise ValueError(f"range of {name!r} must be [low, high] with low <= high")
        return value

    def cleaning_rules(self) -> CleaningRules:
        return CleaningRules(
            max_payload_bytes=self.max_payload_bytes,
            max_nesting_depth=self.max_nesting_depth,
            max_future_skew_us=int(self.max_future_skew_seconds * 1_000_000),
            metric_ranges={**DEFAULT_RANGES, **self.metric_ranges},
        )
