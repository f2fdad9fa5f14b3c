"""Configurations compared by k-fold cross-validation, honestly: each fold's
error in; the mean with a 95% interval, and a paired test on the same folds,
out (scipy for the t distribution). And the baseline a practitioner tries
first, scikit-learn's SVC, on the same folds."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shared.contracts.aistack.v1 import common_pb2, tuning_pb2
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api

#: Below this p-value a paired difference is called a difference.
ALPHA = 0.05


@dataclass(frozen=True)
class Estimate:
    """The mean error over the folds and the half width of its 95% interval
    (Student's t over the folds)."""

    mean: float
    half_width: float
    folds: int

    def __str__(self) -> str:
        return f"{self.mean:.2%} ± {self.half_width:.2%}"


@dataclass(frozen=True)
class Paired:
    """``a`` against ``b`` on the same folds: the mean of the per-fold
    differences (a - b), its 95% half width, the two-sided paired t-test's
    p-value, and how much less error ``a`` has (1 - mean a / mean b)."""

    difference: float
    half_width: float
    p_value: float
    less_error: float

    @property
    def better(self) -> bool:
        return self.difference < 0 and self.p_value < ALPHA

    @property
    def worse(self) -> bool:
        return self.difference > 0 and self.p_value < ALPHA


def fold_errors(metrics: Mapping[str, float], folds: int) -> list[float]:
    """The per-fold errors of a cross-validation trial's metrics
    (``fold_<i>_error``, as svc_trainer reports them); KeyError when one is
    missing."""
    return [float(metrics[f"fold_{i}_error"]) for i in range(folds)]


def estimate(errors: Sequence[float]) -> Estimate:
    n = len(errors)
    mean = math.fsum(errors) / n
    return Estimate(mean, _t975(n - 1) * _standard_error(errors, mean), n)


def paired(a: Sequence[float], b: Sequence[float]) -> Paired:
    """``a`` against ``b``, fold by fold (the same folds, in order)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(
            f"a paired comparison needs two equal runs of folds, got {len(a)}, {len(b)}"
        )
    differences = [x - y for x, y in zip(a, b, strict=True)]
    n = len(differences)
    mean = math.fsum(differences) / n
    error = _standard_error(differences, mean)
    if error == 0:
        p_value = 1.0 if mean == 0 else 0.0
    else:
        from scipy import stats

        p_value = float(2 * stats.t.sf(abs(mean / error), n - 1))
    base = math.fsum(b) / n
    return Paired(
        mean, _t975(n - 1) * error, p_value, 1 - (math.fsum(a) / n) / base if base else 0.0
    )


def verdict(name_a: str, name_b: str, comparison: Paired) -> str:
    """One plain sentence on ``a`` against ``b``."""
    change = (
        f"{comparison.less_error:.0%} less error"
        if comparison.less_error >= 0
        else f"{-comparison.less_error:.0%} more error"
    )
    test = f"paired t-test over the folds p={comparison.p_value:.3f}"
    if comparison.better:
        return f"{name_a} beats {name_b}: {change} ({test})"
    if comparison.worse:
        return f"{name_a} is worse than {name_b}: {change} ({test})"
    return f"{name_a} and {name_b} are not distinguishable: {change}, but {test} >= {ALPHA}"


def cross_validation_spec(
    base: tuning_pb2.StudySpec, name: str, params: Mapping[str, common_pb2.ParamValue], folds: int
) -> tuning_pb2.StudySpec:
    """A study that cross-validates one configuration of ``base``'s model:
    ``params`` (the trainer's defaults for the rest), ``base``'s task and
    epochs; a grid over the folds (``cv_fold``), one trial each, so the
    trainers share it; every trainer splits the data into the same
    stratified folds (``task.options.cv_folds``) for any configuration."""
    from shared.contracts.aistack.v1 import tuning_pb2

    spec = tuning_pb2.StudySpec()
    spec.CopyFrom(base)
    spec.name = name
    del spec.params[:]
    for param, value in sorted(params.items()):
        spec.params.add(name=param).categorical.choices.add().CopyFrom(value)
    choices = spec.params.add(name="cv_fold").categorical.choices
    for fold in range(folds):
        choices.add().int_value = fold
    spec.sampler.Clear()
    spec.sampler.kind = tuning_pb2.SAMPLER_KIND_GRID
    spec.pruner.Clear()
    spec.pruner.kind = tuning_pb2.PRUNER_KIND_NONE
    spec.budget.max_trials = folds
    spec.budget.time_limit.FromSeconds(1800)
    spec.refit = False
    spec.task.options["cv_folds"] = str(folds)
    return spec


def study_fold_errors(trials: Iterable[api.Trial], folds: int) -> list[float]:
    """Each fold's error, from a cross-validation study's completed trials
    (``fold_<i>_error``); KeyError for a fold none of them reports."""
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api

    metrics = {
        name: value
        for trial in trials
        if trial.state == api.TRIAL_STATE_COMPLETED
        for name, value in trial.metrics.items()
    }
    return fold_errors(metrics, folds)


def _standard_error(values: Sequence[float], mean: float) -> float:
    n = len(values)
    if n < 2:
        return math.nan
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return math.sqrt(variance / n)


def _t975(degrees: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, degrees))


def svc_fold_errors(folds: int) -> list[float]:
    """scikit-learn's SVC (its defaults) on the same folds as the trainers'
    cross-validation trials: the digits in split order, folded by the shared
    rule (``shared.digits``, ``shared.splits``; seed 0)."""
    import numpy as np
    from sklearn.svm import SVC

    from shared import digits
    from shared.splits import stratified_folds

    x, y = digits.load(seed=0).in_split_order()
    flat = x.reshape(len(x), -1)
    errors = []
    for test in stratified_folds(y, folds, seed=0):
        train = np.setdiff1d(np.arange(len(y)), test)
        predicted = SVC().fit(flat[train], y[train]).predict(flat[test])
        errors.append(float((predicted != y[test]).mean()))
    return errors
