"""A feature's training distribution as ``aistack.v1.TrainingDistribution``:
how svc_trainer summarises the windows a model trained on, and what the drift
monitor (svc_monitor) reads back.

Per window statistic (``shared.feature_store.FEATURE_STATS``), quantiles at
``LEVELS``: equal-mass bins for the population stability index, and enough
points to read a CDF for the Kolmogorov-Smirnov statistic within one bin's
mass. The message names its levels, so a reader never assumes these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from shared.contracts.aistack.v1 import models_pb2

#: Quantile levels a reference keeps: 0, 0.05, …, 1.
LEVELS = tuple(i / 20 for i in range(21))


def statistic_reference(
    statistic: str, values: Sequence[float] | NDArray[np.float64]
) -> models_pb2.StatisticReference | None:
    """The quantiles of ``values`` (one statistic over the training windows);
    None when no value is finite."""
    array = np.asarray(values, dtype=np.float64).ravel()
    finite = array[np.isfinite(array)]
    if finite.size == 0:
        return None
    return models_pb2.StatisticReference(
        statistic=statistic,
        levels=LEVELS,
        quantiles=[float(q) for q in np.quantile(finite, LEVELS)],
        windows=int(finite.size),
    )


def training_distribution(
    *,
    feature: str,
    metric: str,
    window: str,
    statistics: Mapping[str, Sequence[float] | NDArray[np.float64]],
    first_window_start_us: int,
    last_window_start_us: int,
) -> models_pb2.TrainingDistribution:
    """The message for one feature: a reference per statistic with a finite value."""
    message = models_pb2.TrainingDistribution(feature=feature, metric=metric, window=window)
    for name, values in statistics.items():
        reference = statistic_reference(name, values)
        if reference is not None:
            message.statistics.append(reference)
    message.first_window_start.FromMicroseconds(first_window_start_us)
    message.last_window_start.FromMicroseconds(last_window_start_us)
    return message
