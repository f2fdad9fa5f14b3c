"""shared.objective: the one rule for the tuner's best trial and the model
server's champion version."""

from __future__ import annotations

import math

import pytest

from shared.contracts.aistack.v1 import common_pb2, models_pb2
from shared.objective import (
    BASELINE_VERSION,
    DECISION_SEQUENCE_LABEL,
    Standing,
    baseline_metric,
    baseline_standing,
    beats_baseline,
    best,
    champion,
    is_refit,
    top,
)
from tests.model_events import decided

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


def _version(
    version: int, value: float, *, baseline: tuple[int, float] | None = None
) -> models_pb2.ModelReady:
    event = models_pb2.ModelReady(
        model_name="forecast",
        version=str(version),
        objective=common_pb2.Objective(metric="val_mae", direction=MIN),
        metrics={"val_mae": value},
    )
    if baseline is not None:
        event.labels[BASELINE_VERSION] = str(baseline[0])
        event.metrics[baseline_metric("val_mae")] = baseline[1]
    return event


def test_a_challenger_replaces_the_champion_only_by_beating_it_on_its_own_data() -> None:
    # Version 2 was best on the old data (0.5); on the drifted data it scores 3.0.
    old = [_version(1, 0.9), _version(2, 0.5), _version(3, 0.7)]
    better = _version(4, 1.2, baseline=(2, 3.0))
    worse = _version(4, 3.4, baseline=(2, 3.0))
    tie = _version(4, 3.0, baseline=(2, 3.0))
    assert champion([*old, better]) == better  # 1.2 > 0.5, yet it beats 2 on the new data
    assert champion([*old, worse]) == old[1]
    assert champion([*old, tie]) == old[1]
    # Order of arrival does not matter.
    assert champion([better, *reversed(old)]) == better


def test_a_challengers_siblings_compare_by_value_once_one_took_over() -> None:
    old = [_version(1, 0.5)]
    first = _version(2, 1.2, baseline=(1, 3.0))
    second = _version(3, 1.0, baseline=(1, 3.0))
    third = _version(4, 1.1, baseline=(1, 3.0))
    assert champion([*old, first, second, third]) == second
    assert champion([*old, _version(2, 3.5, baseline=(1, 3.0)), third]) == third


def test_a_decision_on_live_traffic_outranks_the_validation_values_it_knew_of() -> None:
    old = [_version(1, 0.9), _version(2, 0.5)]
    challenger = _version(3, 3.4, baseline=(2, 3.0))  # lost on validation
    assert champion([*old, challenger]) == old[1]
    promoted = decided(challenger, 1, newest=3)
    assert champion([*old, promoted]) == promoted
    # A later decision (a rollback to 2) wins over an earlier one, in any order.
    rolled_back = decided(old[1], 2, newest=3)
    assert champion([promoted, old[0], rolled_back]) == rolled_back
    # A version newer than all the decision knew of is judged against the
    # chosen one by the validation rules: a re-tune that beats it on its own
    # data serves, one that does not does not.
    better = _version(4, 1.0, baseline=(3, 2.0))
    worse = _version(4, 2.5, baseline=(3, 2.0))
    assert champion([*old, promoted, better]) == better
    assert champion([*old, promoted, worse]) == promoted
    # A version the decision knew of (4 < newest 5) cannot take its place.
    knew = decided(challenger, 1, newest=5)
    assert champion([*old, knew, better]) == knew
    # A malformed sequence is no decision.
    malformed = decided(challenger, 1, newest=3)
    malformed.labels[DECISION_SEQUENCE_LABEL] = "first"
    assert champion([*old, malformed]) == old[1]


def test_under_the_live_policy_a_retune_serves_only_by_a_decision_on_live_traffic() -> None:
    old = [_version(1, 0.9), _version(2, 0.5)]
    better = _version(3, 1.2, baseline=(2, 3.0))  # beats 2 on the new data
    assert champion([*old, better]) == better
    assert champion([*old, better], retunes_by_validation=False) == old[1]
    promoted = decided(better, 1, newest=3)
    assert champion([*old, promoted], retunes_by_validation=False) == promoted
    # A version that is not a re-tune still compares by its values.
    plain = _version(4, 0.1)
    assert champion([*old, better, plain], retunes_by_validation=False) == plain
    # A re-tune alone is what there is to serve.
    assert champion([better], retunes_by_validation=False) == better


def test_a_baseline_naming_no_champion_or_lacking_its_value_is_plain_comparison() -> None:
    named_other = _version(3, 0.4, baseline=(1, 3.0))
    assert champion([_version(1, 0.9), _version(2, 0.5), named_other]) == named_other
    no_value = _version(3, 0.6)
    no_value.labels[BASELINE_VERSION] = "2"
    assert baseline_standing(no_value) is None
    assert champion([_version(2, 0.5), no_value]).version == "2"


@pytest.mark.parametrize(
    ("value", "baseline", "direction", "expected"),
    [
        (1.0, 2.0, MIN, True),
        (2.0, 2.0, MIN, False),
        (0.9, 0.8, MAX, True),
        (None, 2.0, MIN, False),
        (math.nan, 2.0, MIN, False),
        (1.0, None, MIN, True),
    ],
)
def test_beats_baseline(
    value: float | None, baseline: float | None, direction: int, expected: bool
) -> None:
    assert beats_baseline(value, baseline, direction) is expected
