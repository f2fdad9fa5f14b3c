"""Which result is best on an objective: one rule for the tuner's best trial
of a study and the model server's champion version of a model.

- A result is judged by its value of the objective's metric, oriented by the
  objective's direction; lower oriented values are better.
- A result has no judged value when it reported none (missing or NaN) or when
  it is a refit: a refit trains on the validation data its metrics are
  measured on, so its value is no evidence. A result with a judged value
  beats every result without one; among results without one, the later wins
  (there is nothing else to go by).
- Equal values: the earlier result wins (the lower trial number, which is
  the lower model version), so the outcome does not depend on the order in
  which results arrive, and the champion is the study's best trial's model.
- A version trained against a baseline (a re-tune's trial: the serving
  version measured on the new version's own validation split, labelled
  ``BASELINE_VERSION`` with the metric ``baseline_metric(objective)``) is
  judged against the version it names by those two values, data for data,
  when that version is the champion it would replace: it takes over only if
  it beats it there. Its stale value from older data never decides. Other
  versions compare as above; the champion is found walking versions in
  order, so the outcome still depends only on the set of versions.
- A decision on live traffic (svc_monitor's ``ChampionDecision``, PROMOTE or
  ROLLBACK) labels the version it chose (``DECISION_LABEL``,
  ``DECISION_SEQUENCE_LABEL``, ``DECISION_NEWEST_LABEL``): the version with
  the highest sequence is the champion, and only a version newer than every
  version that decision knew of can take its place, by the rules above.
  Live evidence outranks validation values it has already seen.
- Under the ``live`` serving policy a version trained against a baseline
  never takes over by validation values (``retunes_by_validation``): it runs
  in the champion's shadow until a decision on live traffic promotes it.

The tuner marks a refit in its trial request's ``task.options`` (``REFIT``);
trainers copy that into the model's labels, where the model server and batch
scoring read it (``model_standing``, ``champion``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from shared.contracts.aistack.v1 import common_pb2, models_pb2
from shared.errors import InvalidArgument

#: The task option (trial request) and model label that mark a refit.
REFIT = "refit"
#: The model label naming the version a model was measured against.
BASELINE_VERSION = "baseline_version"
#: The task option offsetting a study's model versions (version = offset +
#: trial number + 1): a re-tune publishes under its model's name after the
#: versions of the studies before it, never over them.
VERSION_OFFSET = "model_version_offset"
#: The labels a decision on live traffic sets on the version it chose: its
#: id, its sequence among the model's decisions (a positive integer) and the
#: highest version it knew of.
DECISION_LABEL = "aistack:decision"
DECISION_SEQUENCE_LABEL = "aistack:decision_sequence"
DECISION_NEWEST_LABEL = "aistack:decision_newest"

T = TypeVar("T")


def baseline_metric(metric: str) -> str:
    """The metric holding the baseline's value of ``metric`` on a trial's
    validation split: ``baseline_val_mae``."""
    return f"baseline_{metric}"


def is_refit(options: Mapping[str, str]) -> bool:
    """Whether trial options or model labels mark a refit."""
    return options.get(REFIT, "").lower() == "true"


@dataclass(frozen=True)
class Standing:
    """How one result stands: ``value`` oriented so that lower is better (None:
    not judged), ``order`` its place in time (trial number or model version)."""

    value: float | None
    order: int

    @classmethod
    def of(
        cls, value: float | None, direction: int, order: int, *, refit: bool = False
    ) -> Standing:
        if value is None or refit or math.isnan(value):
            return cls(None, order)
        return cls(-value if direction == common_pb2.DIRECTION_MAXIMIZE else value, order)

    @property
    def judged(self) -> bool:
        return self.value is not None

    def beats(self, other: Standing) -> bool:
        if self.value is None:
            return other.value is None and self.order > other.order
        if other.value is None:
            return True
        if self.value != other.value:
            return self.value < other.value
        return self.order < other.order


def top(items: Iterable[T], standing: Callable[[T], Standing]) -> T | None:
    """The item that beats every other (None for none); judged or not."""
    best: T | None = None
    for item in items:
        if best is None or standing(item).beats(standing(best)):
            best = item
    return best


def best(items: Iterable[T], standing: Callable[[T], Standing]) -> T | None:
    """The best item with a judged value; None when none has one."""
    winner = top(items, standing)
    return winner if winner is not None and standing(winner).judged else None


def version_number(version: str) -> int:
    """A model version as Triton has them: a decimal integer >= 1.
    Raises InvalidArgument."""
    if not version.isdigit() or int(version) < 1:
        raise InvalidArgument(f"model version must be a positive integer, got {version!r}")
    return int(version)


def model_standing(event: models_pb2.ModelReady) -> Standing:
    """How a model version stands on its own objective (a refit, or a version
    without the metric, is not judged by it)."""
    metric = event.objective.metric
    value = event.metrics[metric] if metric and metric in event.metrics else None
    return Standing.of(
        value,
        event.objective.direction,
        version_number(event.version),
        refit=is_refit(event.labels),
    )


def baseline_standing(event: models_pb2.ModelReady) -> Standing | None:
    """How the version the event was measured against stood on the event's
    own validation data; None when it names no baseline or lacks its value."""
    named = event.labels.get(BASELINE_VERSION, "")
    metric = baseline_metric(event.objective.metric)
    if not named.isdigit() or int(named) < 1 or metric not in event.metrics:
        return None
    return Standing.of(event.metrics[metric], event.objective.direction, int(named))


def beats_baseline(value: float | None, baseline: float | None, direction: int) -> bool:
    """Whether a challenger's ``value`` beats the ``baseline``'s on the same
    data: strictly better (a tie keeps the baseline); a missing value never
    beats, and any value beats a missing baseline."""
    return Standing.of(value, direction, 1).beats(Standing.of(baseline, direction, 0))


def supersedes(event: models_pb2.ModelReady, current: models_pb2.ModelReady) -> bool:
    """Whether ``event`` takes the champion's place from ``current``."""
    baseline = baseline_standing(event)
    if baseline is not None and baseline.order == version_number(current.version):
        return model_standing(event).beats(baseline)
    return model_standing(event).beats(model_standing(current))


def decision_sequence(event: models_pb2.ModelReady) -> int:
    """The sequence of the live decision that chose ``event`` (0: none chose it)."""
    sequence = event.labels.get(DECISION_SEQUENCE_LABEL, "")
    return int(sequence) if sequence.isdigit() else 0


def champion(
    events: Iterable[models_pb2.ModelReady], *, retunes_by_validation: bool = True
) -> models_pb2.ModelReady | None:
    """The champion of one model's versions by the rule above (None for no
    events): what the model server serves under its champion policy, and what
    batch scoring scores when no version is named. Without
    ``retunes_by_validation`` (the ``live`` policy) a version trained against
    a baseline never takes over by its values: only a decision on live
    traffic makes it the champion."""
    ordered = sorted(events, key=lambda e: version_number(e.version))
    decided = max(ordered, key=decision_sequence, default=None)
    current: models_pb2.ModelReady | None = None
    known = 0
    if decided is not None and decision_sequence(decided) > 0:
        current = decided
        newest = decided.labels.get(DECISION_NEWEST_LABEL, "")
        known = max(int(newest) if newest.isdigit() else 0, version_number(decided.version))
    for event in ordered:
        if version_number(event.version) <= known:
            continue
        if current is not None and not retunes_by_validation and BASELINE_VERSION in event.labels:
            continue
        if current is None or supersedes(event, current):
            current = event
    return current
