"""Each model version's live error, from its settled predictions. Pure: no bus.

A version's figures cover its latest ``horizon`` joined predictions (in the
order they were settled) and count every settlement it was given; the
caller gives each settlement once (``svc_monitor.join.Joiner`` settles each
prediction once, and ``remember`` says which of its own earlier ones are new).
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from shared.contracts.aistack.v1.monitoring_pb2 import LivePerformance
from shared.contracts.aistack.v1.predictions_pb2 import (
    JOIN_OUTCOME_JOINED,
    PredictionJoined,
    PredictionRole,
)
from svc_monitor.join import timestamp

#: The levels of the signed error's quantiles each summary carries.
LEVELS = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)

Version = tuple[str, str]


@dataclass
class _Version:
    metric: str = ""
    joined: int = 0
    expired: int = 0
    roles: set[PredictionRole] = field(default_factory=set)
    # (served µs, truth µs, signed error), the latest ``horizon``.
    pairs: deque[tuple[int, int, float]] = field(default_factory=deque)


class Performance:
    def __init__(self, horizon: int) -> None:
        if horizon < 1:
            raise ValueError(f"a horizon holds at least one prediction, not {horizon}")
        self._horizon = horizon
        self._versions: dict[Version, _Version] = {}

    def add(self, joined: PredictionJoined) -> Version:
        """Count one settlement; returns its (model, version)."""
        version = (joined.model_name, joined.model_version)
        state = self._versions.get(version)
        if state is None:
            state = self._versions[version] = _Version(pairs=deque(maxlen=self._horizon))
        state.roles.add(joined.role)
        if joined.outcome != JOIN_OUTCOME_JOINED:
            state.expired += 1
            return version
        state.joined += 1
        state.metric = joined.metric
        state.pairs.append(
            (
                joined.served_time.ToMicroseconds(),
                joined.truth_time.ToMicroseconds(),
                joined.error,
            )
        )
        return version

    def versions(self) -> list[Version]:
        return sorted(self._versions)

    def summary(self, version: Version, now_us: int) -> LivePerformance:
        """The version's LivePerformance; KeyError for a version never added."""
        state = self._versions[version]
        model, number = version
        event = LivePerformance(
            performance_id=hashlib.sha256(
                f"{model}\0{number}\0{state.joined}\0{state.expired}".encode()
            ).hexdigest()[:32],
            model_name=model,
            model_version=number,
            roles=sorted(state.roles),
            metric=state.metric,
            joined=state.joined,
            expired=state.expired,
            pairs=len(state.pairs),
            published_time=timestamp(now_us),
        )
        if state.pairs:
            served, truth, errors = (
                np.asarray(column) for column in zip(*state.pairs, strict=True)
            )
            event.mae = float(np.abs(errors).mean())
            event.mean_error = float(errors.mean())
            event.levels.extend(LEVELS)
            event.quantiles.extend(float(q) for q in np.quantile(errors, LEVELS))
            event.first_served_time.CopyFrom(timestamp(int(served.min())))
            event.last_served_time.CopyFrom(timestamp(int(served.max())))
            event.first_truth_time.CopyFrom(timestamp(int(truth.min())))
            event.last_truth_time.CopyFrom(timestamp(int(truth.max())))
        return event
