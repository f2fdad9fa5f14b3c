"""bench.study_speedup's rounds: each ratio is the median of the rounds' own."""

from __future__ import annotations

import pytest

from bench.harness import round_order
from bench.study_speedup import WAYS, median_ratio


def test_a_ratio_is_the_median_of_each_rounds_ratio_not_of_the_medians() -> None:
    peer = [10.0, 30.0, 20.0]
    ours = [5.0, 20.0, 20.0]  # rounds' ratios 2.0, 1.5, 1.0
    assert median_ratio(peer, ours) == 1.5
    # The ratio of the medians would pair round 3's peer with round 2's run.
    assert 20.0 / 20.0 != median_ratio(peer, ours)


def test_rounds_must_pair_up() -> None:
    with pytest.raises(ValueError):
        median_ratio([1.0, 2.0], [1.0])


def test_every_way_runs_first_in_some_round_and_last_in_another() -> None:
    first, second = round_order(WAYS, 0), round_order(WAYS, 1)
    assert sorted(first) == sorted(WAYS) and second == first[::-1]
