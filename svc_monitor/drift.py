"""Whether a feature's recent windows still look like the data a model was
trained on (issue 21, first step: the statistics; the service that feeds
them from aistack.features.windows comes next).

A model version keeps, per window statistic it reads (mean, stddev, …), a
``Reference``: quantiles of that statistic over its training windows and
how many windows they summarise. Recent windows are compared with it by
two scores per statistic:

- the population stability index over the reference's equal-mass bins
  (PSI: 0.1 is a shift worth a look, 0.25 a large one, by the usual rule);
- the two-sample Kolmogorov-Smirnov statistic D, with the reference's CDF
  read off its quantiles (piecewise linear between them).

A statistic drifts only when both pass their thresholds and D also passes
the KS test's critical value for the two sample sizes at ``alpha``: PSI
alone is biased upwards on small samples, and a fixed D threshold fires on
noise when few windows are compared. Pure: numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

#: Quantile levels a reference keeps: equal-mass bins for PSI, and enough
#: points for the KS statistic's CDF to be read within a bin's mass.
LEVELS = tuple(i / 20 for i in range(21))
# Added to every bin's share, so an empty bin costs a finite PSI.
_SMOOTHING = 1e-4


@dataclass(frozen=True)
class Reference:
    """One statistic's training distribution: values at ``LEVELS``."""

    quantiles: tuple[float, ...]
    windows: int

    @classmethod
    def of(cls, values: Sequence[float] | NDArray[np.float64]) -> Reference:
        """The reference of ``values`` (the statistic over the training windows)."""
        finite = _finite(values)
        if finite.size == 0:
            raise ValueError("a reference needs at least one finite value")
        return cls(tuple(float(q) for q in np.quantile(finite, LEVELS)), int(finite.size))

    def cdf(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """The reference's CDF at ``x``, linear between its quantiles."""
        edges = np.asarray(self.quantiles)
        levels = np.asarray(LEVELS)
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


def _finite(values: Sequence[float] | NDArray[np.float64]) -> NDArray[np.float64]:
    array = np.asarray(values, dtype=np.float64).ravel()
    return array[np.isfinite(array)]
