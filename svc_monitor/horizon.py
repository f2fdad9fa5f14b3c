"""The sliding horizon: per feature, the latest windows of
``aistack.features.windows``, each with its statistics and where it was read.

A feature is an online-store field (``shared.feature_store.online_field``):
a metric and a window kind, and a request path for web requests; the fields
a window belongs to are ``shared.feature_store.window_fields``.

"Latest" is by window start (then window key), not by arrival: partitions
interleave as they please, and the horizon is the same whatever order they
were read in. The Kafka sink is at least once, so a window key seen again
is a repeat and changes nothing; a window older than a full horizon's
oldest is late and changes nothing either (a repeat of a window the
horizon has let go of is always such). Pure: no bus.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
from numpy.typing import NDArray

from shared.contracts.aistack.v1.features_pb2 import FeatureWindow
from shared.feature_store import FEATURE_STATS, window_fields

#: The statistics a window carries, by FeatureWindow field.
STATISTICS = (*FEATURE_STATS, "last", "error_rate")


class Outcome(Enum):
    NEW = "new"
    REPEATED = "repeated"
    LATE = "late"


@dataclass(frozen=True)
class Position:
    """Where a window was read on the windows topic."""

    partition: int
    offset: int


@dataclass(frozen=True)
class Entry:
    """One window in a horizon."""

    key: str
    start_us: int
    position: Position
    statistics: Mapping[str, float]

    @property
    def order(self) -> tuple[int, str]:
        return (self.start_us, self.key)


def entry_of(window: FeatureWindow, position: Position) -> Entry:
    return Entry(
        key=window.window_key,
        start_us=window.window_start.ToMicroseconds(),
        position=position,
        statistics={name: float(getattr(window, name)) for name in STATISTICS},
    )


class Horizon:
    """One feature's latest ``capacity`` windows, oldest first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a horizon holds at least one window, not {capacity}")
        self.capacity = capacity
        self._entries: list[Entry] = []
        self._keys: set[str] = set()

    def add(self, entry: Entry) -> Outcome:
        """Take ``entry`` in its place by start, letting the oldest go when
        full; a key already held is a repeat, a window older than a full
        horizon's oldest is late."""
        if entry.key in self._keys:
            return Outcome.REPEATED
        full = len(self._entries) >= self.capacity
        if full and entry.order < self._entries[0].order:
            return Outcome.LATE
        bisect.insort(self._entries, entry, key=lambda e: e.order)
        self._keys.add(entry.key)
        if len(self._entries) > self.capacity:
            evicted = self._entries.pop(0)
            self._keys.discard(evicted.key)
        return Outcome.NEW

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    @property
    def first_start_us(self) -> int:
        """The oldest window's start; raises IndexError when empty."""
        return self._entries[0].start_us

    @property
    def last_start_us(self) -> int:
        """The newest window's start; raises IndexError when empty."""
        return self._entries[-1].start_us

    def values(self, statistics: Sequence[str]) -> dict[str, NDArray[np.float64]]:
        """Each statistic's values over the horizon (those windows carry)."""
        return {
            name: np.fromiter((e.statistics[name] for e in self._entries), np.float64)
            for name in statistics
            if name in STATISTICS
        }


class Horizons:
    """Every feature's horizon, all of one capacity."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._horizons: dict[str, Horizon] = {}

    def add(self, window: FeatureWindow, position: Position) -> dict[str, Outcome]:
        """The window in each of its features' horizons; what it was to each."""
        entry = entry_of(window, position)
        outcomes = {}
        for feature in window_fields(window):
            horizon = self._horizons.get(feature)
            if horizon is None:
                horizon = self._horizons[feature] = Horizon(self.capacity)
            outcomes[feature] = horizon.add(entry)
        return outcomes

    def get(self, feature: str) -> Horizon | None:
        return self._horizons.get(feature)

    def features(self) -> list[str]:
        return sorted(self._horizons)
