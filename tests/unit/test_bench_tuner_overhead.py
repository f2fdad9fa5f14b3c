"""bench.tuner_overhead's pure parts: the in-process Optuna peer and the
ratio its best value is compared by."""

from __future__ import annotations

import pytest

from bench import tuner_overhead as bench


def test_best_value_ratio_is_higher_when_aistacks_best_is_lower() -> None:
    assert bench.best_value_ratio(aistack_best=0.0, peer_best=0.09, tolerance=0.01) == (
        pytest.approx(10.0)
    )
    assert bench.best_value_ratio(aistack_best=0.09, peer_best=0.0, tolerance=0.01) == (
        pytest.approx(0.1)
    )


def test_best_values_within_the_tolerance_near_the_minimum_count_as_equal() -> None:
    # 0.00054 against 0.00006: a bare ratio would say 0.11.
    ratio = bench.best_value_ratio(aistack_best=0.00054, peer_best=0.00006)
    assert ratio == pytest.approx(0.01006 / 0.01054)
    assert ratio >= bench.GOAL_BEST_VALUE
    assert bench.best_value_ratio(aistack_best=0.05, peer_best=0.0) < bench.GOAL_BEST_VALUE


def test_in_process_peer_is_seeded_by_the_spec() -> None:
    """One thread at a time, the peer's search depends on the seed alone, so
    the sampler it uses is the spec's, seeded."""
    runs = [bench.in_process_study(trials=14, sleep=0.0, seed=7, workers=1) for _ in range(2)]
    assert runs[0]["best"] == runs[1]["best"]
    other = bench.in_process_study(trials=14, sleep=0.0, seed=8, workers=1)
    assert other["best"] != runs[0]["best"]
    assert 0.0 <= runs[0]["best"] <= 50.0


def test_in_process_peer_completes_every_trial_on_its_threads() -> None:
    run = bench.in_process_study(trials=12, sleep=0.0, seed=7, workers=bench.WORKERS)
    assert run["completed"] == 12
    assert 0.0 <= run["best"] <= 50.0
