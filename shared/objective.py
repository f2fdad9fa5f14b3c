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

T = TypeVar("T")


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


def champion(events: Iterable[models_pb2.ModelReady]) -> models_pb2.ModelReady | None:
    """The version of one model that beats every other on the rule above
    (None for no events): what the model server serves under its champion
    policy, and what batch scoring scores when no version is named."""
    return top(sorted(events, key=lambda e: version_number(e.version)), model_standing)
