"""The k-fold comparison's statistics, checked against scipy's own tests."""

from __future__ import annotations

import pytest
from scipy import stats

from compose import kfold

DEFAULT = [0.022, 0.017, 0.011, 0.028, 0.017, 0.022, 0.011, 0.017, 0.028, 0.006]
TUNED = [0.011, 0.006, 0.011, 0.017, 0.006, 0.011, 0.000, 0.011, 0.017, 0.006]


def test_the_interval_is_students_t_over_the_folds() -> None:
    estimate = kfold.estimate(DEFAULT)
    low, high = stats.t.interval(
        0.95, len(DEFAULT) - 1, loc=estimate.mean, scale=stats.sem(DEFAULT)
    )
    assert estimate.mean == pytest.approx(sum(DEFAULT) / 10)
    assert estimate.half_width == pytest.approx((high - low) / 2)
    assert estimate.folds == 10


def test_the_paired_test_is_scipys_and_says_which_is_better() -> None:
    comparison = kfold.paired(TUNED, DEFAULT)
    assert comparison.p_value == pytest.approx(stats.ttest_rel(TUNED, DEFAULT).pvalue)
    assert comparison.difference == pytest.approx((sum(TUNED) - sum(DEFAULT)) / 10)
    assert comparison.less_error == pytest.approx(1 - sum(TUNED) / sum(DEFAULT))
    assert comparison.better and not comparison.worse
    assert "beats" in kfold.verdict("tuned", "default", comparison)
    reverse = kfold.paired(DEFAULT, TUNED)
    assert reverse.worse and "worse" in kfold.verdict("default", "tuned", reverse)


def test_noise_is_not_called_a_difference() -> None:
    noisy = [e + (0.006 if i % 2 else -0.006) for i, e in enumerate(DEFAULT)]
    comparison = kfold.paired(noisy, DEFAULT)
    assert not comparison.better and not comparison.worse
    assert "not distinguishable" in kfold.verdict("a", "b", comparison)
    assert kfold.paired(DEFAULT, DEFAULT).p_value == 1.0


def test_fold_errors_come_from_a_cross_validation_trials_metrics() -> None:
    metrics = {f"fold_{i}_error": e for i, e in enumerate(DEFAULT)} | {"test_error": 0.0}
    assert kfold.fold_errors(metrics, 10) == DEFAULT
    with pytest.raises(KeyError):
        kfold.fold_errors(metrics, 11)
    with pytest.raises(ValueError, match="equal runs"):
        kfold.paired(DEFAULT, TUNED[:5])
