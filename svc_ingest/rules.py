"""What the cleaner accepts: limits and per-metric ranges, from settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from svc_ingest.units import DEFAULT_RANGES


@dataclass(frozen=True, slots=True)
class CleaningRules:
    max_payload_bytes: int = 1_048_576
    max_nesting_depth: int = 32
    # How far ahead of the worker's clock an event time may be (clock skew).
    max_future_skew_us: int = 300_000_000
    # Canonical-unit (low, high) per metric, inclusive.
    metric_ranges: Mapping[str, tuple[float, float]] = field(
        default_factory=lambda: dict(DEFAULT_RANGES)
    )
    max_id_length: int = 256
    max_metrics: int = 256
    # Readings in one record (a SenML pack, a Telegraf batch, lines of text).
    max_events: int = 1024
