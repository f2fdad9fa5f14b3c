"""Whether a feature's recent windows still look like the data a model was
trained on: the statistics (``svc_monitor.watch`` feeds them the horizon of
``aistack.features.windows``).

A model version keeps, per window statistic it reads (mean, stddev, …), a
``Reference``: quantiles of that statistic over its training windows at the
levels it names, and how many windows they summarise (an
``aistack.v1.StatisticReference``, read by ``Reference.of_summary``).
Recent windows are compared with it by two scores per statistic:

- the population stability index over the reference's equal-mass bins
  (PSI: 0.1 is a shift worth a look, 0.25 a large one, by the usual rule);
- the two-sample Kolmogorov-Smirnov statistic D, with the reference's CDF
  read off its quantiles (piecewise linear between them).

A statistic drifts only when both pass their thresholds and D also passes
the KS test's critical value for the two sample sizes at ``alpha``: PSI
alone is biased upwards on small samples, and a fixed D threshold fires on
noise when few windows are compared. Pure: numpy only, no bus.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from shared.distribution import LEVELS

# Added to every bin's share, so an empty bin costs a finite PSI.
_SMOOTHING = 1e-4


class QuantileSummary(Protocol):
    """What a reference is read from: ``aistack.v1.StatisticReference``."""

    @property
    def levels(self) -> Sequence[float]: ...

    @property
    def quantiles(self) -> Sequence[float]: ...

    @property
    def windows(self) -> int: ...


@dataclass(frozen=True)
class Reference:
    """One statistic's training distribution: its ``quantiles`` at ``levels``
    (ascending from 0 to 1, one quantile each, non-decreasing) over
    ``windows`` training windows. Built by ``of`` or ``of_summary``, which
    check that."""

    levels: tuple[float, ...]
    quantiles: tuple[float, ...]
    windows: int

    @classmethod
    def of(
        cls, values: Sequence[float] | NDArray[np.float64], levels: Sequence[float] = LEVELS
    ) -> Reference:
        """The reference of ``values`` (the statistic over the training
        windows) at ``levels``; raises ValueError when no value is finite."""
        finite = _finite(values)
        if finite.size == 0:
            raise ValueError("a reference needs at least one finite value")
        quantiles = np.quantile(finite, np.asarray(levels, dtype=np.float64))
        return cls.of_summary(_Summary(levels, quantiles.tolist(), int(finite.size)))

    @classmethod
    def of_summary(cls, summary: QuantileSummary) -> Reference:
        """The reference a message holds; raises ValueError when it is not one
        (levels not ascending from 0 to 1, a quantile per level that is
        finite and non-decreasing, at least one window)."""
        levels = tuple(float(v) for v in summary.levels)
        quantiles = tuple(float(q) for q in summary.quantiles)
        if len(levels) < 2 or len(levels) != len(quantiles):
            raise ValueError(
                f"{len(levels)} levels and {len(quantiles)} quantiles: "
                "expected as many, two or more"
            )
        if levels[0] != 0.0 or levels[-1] != 1.0 or np.any(np.diff(levels) <= 0):
            raise ValueError("levels must ascend from 0 to 1")
        if not np.all(np.isfinite(quantiles)) or np.any(np.diff(quantiles) < 0):
            raise ValueError("quantiles must be finite and non-decreasing")
        if summary.windows < 1:
            raise ValueError(f"a reference summarises at least one window, not {summary.windows}")
        return cls(levels, quantiles, int(summary.windows))

    def cdf(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """The reference's CDF at ``x``, linear between its quantiles."""
        edges = np.asarray(self.quantiles)
        levels = np.asarray(self.levels)
        # A value repeated at several levels (a constant stretch): the CDF
        # jumps there to the highest of them.
        unique = np.unique(edges)
        at = levels[np.searchsorted(edges, unique, side="right") - 1]
        if unique.size == 1:
            return np.asarray(x >= unique[0], dtype=np.float64)
        below = np.interp(x, unique, at, left=0.0, right=1.0)
        return np.asarray(np.where(x < unique[0], 0.0, below), dtype=np.float64)


@dataclass(frozen=True)
class Thresholds:
    psi: float = 0.25
    ks: float = 0.2
    # Significance of the KS test: D must pass its critical value at this level.
    alpha: float = 0.001
    # Fewer recent windows than this are not judged.
    min_windows: int = 20


@dataclass(frozen=True)
class Score:
    psi: float
    ks: float
    ks_critical: float
    windows: int
    drifted: bool


def psi(reference: Reference, values: Sequence[float] | NDArray[np.float64]) -> float:
    """The population stability index of ``values`` against ``reference``'s
    bins: between its distinct inner quantiles, the outer bins open-ended,
    each expecting the reference's mass in it (equal but where values repeat)."""
    current = _finite(values)
    edges = np.unique(np.asarray(reference.quantiles[1:-1]))
    # Bin k holds edges[k-1] <= x < edges[k].
    counts = np.bincount(np.searchsorted(edges, current, side="right"), minlength=edges.size + 1)
    below_edges = reference.cdf(np.nextafter(edges, -np.inf))
    expected = np.diff(np.concatenate(([0.0], below_edges, [1.0]))) + _SMOOTHING
    actual = counts / max(current.size, 1) + _SMOOTHING
    return float(np.sum((actual - expected) * np.log(actual / expected)))


def ks_statistic(reference: Reference, values: Sequence[float] | NDArray[np.float64]) -> float:
    """sup |F_reference - F_values| over every value and reference quantile,
    at each point and just below it (both CDFs jump at repeated values)."""
    current = np.sort(_finite(values))
    if current.size == 0:
        return 0.0
    points = np.union1d(current, np.asarray(reference.quantiles))
    points = np.concatenate((points, np.nextafter(points, -np.inf)))
    empirical = np.searchsorted(current, points, side="right") / current.size
    return float(np.max(np.abs(empirical - reference.cdf(points))))


def ks_critical(reference_windows: int, windows: int, alpha: float) -> float:
    """The two-sample KS test's critical D at ``alpha`` (asymptotic)."""
    c = math.sqrt(-0.5 * math.log(alpha / 2))
    return c * math.sqrt((reference_windows + windows) / (reference_windows * windows))


def score(
    reference: Reference, values: Sequence[float] | NDArray[np.float64], thresholds: Thresholds
) -> Score | None:
    """Both scores and the verdict for one statistic; None for fewer than
    ``thresholds.min_windows`` finite values."""
    current = _finite(values)
    if current.size < thresholds.min_windows:
        return None
    stability = psi(reference, current)
    distance = ks_statistic(reference, current)
    critical = ks_critical(reference.windows, int(current.size), thresholds.alpha)
    drifted = stability > thresholds.psi and distance > thresholds.ks and distance > critical
    return Score(stability, distance, critical, int(current.size), drifted)


def assess(
    references: Mapping[str, Reference],
    recent: Mapping[str, Sequence[float] | NDArray[np.float64]],
    thresholds: Thresholds,
) -> dict[str, Score]:
    """The scores of every statistic both sides have (and enough recent values)."""
    scores = {}
    for name, reference in references.items():
        if name in recent:
            judged = score(reference, recent[name], thresholds)
            if judged is not None:
                scores[name] = judged
    return scores


@dataclass(frozen=True)
class _Summary:
    levels: Sequence[float]
    quantiles: Sequence[float]
    windows: int


def _finite(values: Sequence[float] | NDArray[np.float64]) -> NDArray[np.float64]:
    array = np.asarray(values, dtype=np.float64).ravel()
    return array[np.isfinite(array)]
