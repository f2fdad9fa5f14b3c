"""shared.objective: the one rule for the tuner's best trial and the model
server's champion version."""

from __future__ import annotations

import math

import pytest

from shared.contracts.aistack.v1 import common_pb2
from shared.objective import Standing, best, is_refit, top

MIN, MAX = common_pb2.DIRECTION_MINIMIZE, common_pb2.DIRECTION_MAXIMIZE


@pytest.mark.parametrize(
    ("new", "current", "expected"),
    [
        (Standing.of(0.1, MIN, 2), Standing.of(0.2, MIN, 1), True),
        (Standing.of(0.9, MAX, 2), Standing.of(0.8, MAX, 1), True),
        (Standing.of(0.2, MIN, 2), Standing.of(0.2, MIN, 1), False),  # a tie: the earlier
        (Standing.of(0.2, MIN, 1), Standing.of(0.2, MIN, 2), True),
        (Standing.of(None, MIN, 2), Standing.of(0.9, MIN, 1), False),  # no value never wins
        (Standing.of(math.nan, MIN, 2), Standing.of(0.9, MIN, 1), False),
        (Standing.of(0.9, MIN, 1), Standing.of(None, MIN, 2), True),
        (Standing.of(None, MIN, 2), Standing.of(None, MIN, 1), True),  # neither: the later
        (Standing.of(0.01, MIN, 2, refit=True), Standing.of(0.2, MIN, 1), False),
        (Standing.of(0.3, MIN, 2), Standing.of(0.01, MIN, 1, refit=True), True),
    ],
)
def test_which_standing_beats_which(new: Standing, current: Standing, expected: bool) -> None:
    assert new.beats(current) is expected


def test_best_is_order_independent_and_only_judged() -> None:
    values = {0: 0.3, 1: 0.1, 2: 0.1, 3: 0.05}
    refits = {3}

    def standing(number: int) -> Standing:
        return Standing.of(values[number], MIN, number, refit=number in refits)

    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 3, 0, 1]):
        assert best(order, standing) == 1
    assert best([3], standing) is None  # only a refit: no best trial
    assert top([3], standing) == 3  # but something serves
    assert best([], standing) is None


def test_a_refit_is_marked_by_the_option_or_label_true() -> None:
    assert is_refit({"refit": "true"})
    assert not is_refit({"refit": "false"})
    assert not is_refit({})
