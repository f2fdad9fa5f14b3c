"""Drift scores of a statistic's recent windows against its training
reference: none for noise, both for a shift."""

from __future__ import annotations

import numpy as np
import pytest

from shared.contracts.aistack.v1 import models_pb2
from shared.distribution import LEVELS, statistic_reference
from svc_monitor.drift import (
    Reference,
    Thresholds,
    assess,
    ks_critical,
    ks_statistic,
    psi,
    score,
)

RNG = np.random.default_rng(21)
TRAINING = RNG.normal(20.0, 2.0, size=2_000)
REFERENCE = Reference.of(TRAINING)


def test_a_reference_keeps_quantiles_and_size() -> None:
    assert len(REFERENCE.quantiles) == len(LEVELS) and REFERENCE.windows == 2_000
    assert REFERENCE.levels == LEVELS
    assert REFERENCE.quantiles[10] == pytest.approx(np.median(TRAINING))
    assert REFERENCE.cdf(np.asarray([-1e9, REFERENCE.quantiles[10], 1e9])).tolist() == [
        0.0,
        0.5,
        1.0,
    ]
    with pytest.raises(ValueError):
        Reference.of([float("nan")])


def test_stationary_windows_are_never_drift() -> None:
    # Many draws of recent windows from the training distribution: no alarm.
    for trial in range(200):
        recent = np.random.default_rng(trial).normal(20.0, 2.0, size=60)
        judged = score(REFERENCE, recent, Thresholds())
        assert judged is not None and not judged.drifted, (trial, judged)


def test_a_shifted_mean_drifts_on_both_scores() -> None:
    recent = RNG.normal(23.0, 2.0, size=60)
    judged = score(REFERENCE, recent, Thresholds())
    assert judged is not None and judged.drifted
    assert judged.psi > 0.25 and judged.ks > judged.ks_critical > 0.2


def test_few_windows_are_not_judged_and_a_small_shift_is_not_drift() -> None:
    assert score(REFERENCE, RNG.normal(30.0, 2.0, size=5), Thresholds()) is None
    slight = score(REFERENCE, RNG.normal(20.3, 2.0, size=60), Thresholds())
    assert slight is not None and not slight.drifted


def test_the_scores_agree_with_their_definitions() -> None:
    # Identical data: both near zero; disjoint data: KS 1, PSI large.
    assert psi(REFERENCE, TRAINING) < 0.01
    assert ks_statistic(REFERENCE, TRAINING) < 0.03
    assert ks_statistic(REFERENCE, TRAINING + 100.0) == pytest.approx(1.0)
    assert psi(REFERENCE, TRAINING + 100.0) > 5.0
    # The KS critical value shrinks as both samples grow.
    assert ks_critical(2_000, 60, 0.001) > ks_critical(2_000, 600, 0.001)


def test_a_constant_reference_and_non_finite_values() -> None:
    constant = Reference.of([5.0] * 100)
    assert constant.cdf(np.asarray([4.9, 5.0])).tolist() == [0.0, 1.0]
    same = score(constant, [5.0] * 30 + [float("nan")] * 5, Thresholds())
    assert same is not None and same.windows == 30 and not same.drifted


def test_assess_scores_the_statistics_both_sides_have() -> None:
    scores = assess(
        {"mean": REFERENCE, "stddev": Reference.of(RNG.normal(2.0, 0.2, 500))},
        {"mean": RNG.normal(26.0, 2.0, 40), "p95": RNG.normal(0.0, 1.0, 40)},
        Thresholds(),
    )
    assert set(scores) == {"mean"} and scores["mean"].drifted


def test_a_reference_is_read_from_its_message_with_its_own_levels() -> None:
    message = statistic_reference("mean", TRAINING)
    assert message is not None
    assert Reference.of_summary(message) == REFERENCE
    # Quartiles only: the CDF follows the message's levels, not the default ones.
    quartiles = Reference.of(TRAINING, levels=(0.0, 0.25, 0.5, 0.75, 1.0))
    assert quartiles.levels == (0.0, 0.25, 0.5, 0.75, 1.0)
    assert quartiles.cdf(np.asarray([quartiles.quantiles[1]])).tolist() == [0.25]
    coarse = score(quartiles, RNG.normal(20.0, 2.0, size=60), Thresholds())
    shifted = score(quartiles, RNG.normal(26.0, 2.0, size=60), Thresholds())
    assert coarse is not None and not coarse.drifted
    assert shifted is not None and shifted.drifted


@pytest.mark.parametrize(
    ("levels", "quantiles", "windows", "error"),
    [
        ([0.0, 1.0], [1.0], 10, "as many"),
        ([0.0], [1.0], 10, "two or more"),
        ([0.1, 1.0], [1.0, 2.0], 10, "ascend from 0 to 1"),
        ([0.0, 0.5, 0.5, 1.0], [1.0, 2.0, 2.0, 3.0], 10, "ascend from 0 to 1"),
        ([0.0, 0.5, 1.0], [1.0, 0.5, 3.0], 10, "non-decreasing"),
        ([0.0, 0.5, 1.0], [1.0, float("nan"), 3.0], 10, "finite"),
        ([0.0, 1.0], [1.0, 2.0], 0, "at least one window"),
    ],
)
def test_a_message_that_is_no_reference_is_refused(
    levels: list[float], quantiles: list[float], windows: int, error: str
) -> None:
    message = models_pb2.StatisticReference(
        statistic="mean", levels=levels, quantiles=quantiles, windows=windows
    )
    with pytest.raises(ValueError, match=error):
        Reference.of_summary(message)
