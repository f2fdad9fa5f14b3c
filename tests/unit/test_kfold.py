"""The k-fold comparison's statistics, checked against scipy's own tests."""

from __future__ import annotations

import pytest
from scipy import stats

from demo import kfold

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


def test_the_svc_baseline_predicts_every_digit_once_on_the_trainers_folds() -> None:
    errors = kfold.svc_fold_errors(5)
    assert len(errors) == 5
    assert all(0 <= e < 0.05 for e in errors)  # an SVC on digits: about 1% error


def test_a_cross_validation_study_is_a_valid_grid_over_the_folds() -> None:
    from pathlib import Path

    from aistack.studies import load_spec
    from demo.kfold import cross_validation_spec, study_fold_errors
    from shared.contracts.aistack.v1 import common_pb2, tuning_pb2
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api
    from svc_tuner import spec as specs

    digits = load_spec(Path("examples/studies/digits-demo.yaml").read_text())
    params = {"learning_rate": common_pb2.ParamValue(float_value=0.005)}
    spec = cross_validation_spec(digits, "cv-tuned", params, 10)
    specs.validate(spec)
    assert spec.sampler.kind == tuning_pb2.SAMPLER_KIND_GRID
    assert spec.pruner.kind == tuning_pb2.PRUNER_KIND_NONE
    assert spec.budget.max_trials == 10 and spec.task.options["cv_folds"] == "10"
    assert spec.task.epochs == digits.task.epochs and spec.task.dataset == "digits"
    assert specs._grid(spec) == {"cv_fold": list(range(10)), "learning_rate": [0.005]}

    trials = [
        api.Trial(state=api.TRIAL_STATE_COMPLETED, metrics={f"fold_{i}_error": i / 100})
        for i in range(3)
    ]
    trials.append(api.Trial(state=api.TRIAL_STATE_FAILED, metrics={"fold_3_error": 0.5}))
    assert study_fold_errors(trials, 3) == [0.0, 0.01, 0.02]
    with pytest.raises(KeyError):
        study_fold_errors(trials, 4)  # fold 3 failed: no error for it


def test_the_demo_folds_the_trainers_digits_in_their_order() -> None:
    """The SVC baseline and the trainers' cross-validation see the same rows:
    the demo reads them through ``shared.digits`` and folds them by
    ``shared.splits``, as the trainers do."""
    import numpy as np

    from shared import digits, splits
    from svc_trainer.data.datasets import load
    from svc_trainer.evaluation import all_examples, stratified_folds

    x, y = all_examples(load("digits", {}, seed=0))
    shared_x, shared_y = digits.load(seed=0).in_split_order()
    assert np.array_equal(x, shared_x) and np.array_equal(y, shared_y)
    trainers, demos = stratified_folds(y, 10, seed=0), splits.stratified_folds(shared_y, 10, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(trainers, demos, strict=True))
