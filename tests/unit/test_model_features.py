"""Entity features: a window from the online store as one model input row."""

from __future__ import annotations

import numpy as np
import pytest

from shared.errors import FailedPrecondition
from svc_model.features import FEATURE_STATS, feature_row


def test_the_statistics_are_the_trainers_in_its_order() -> None:
    from svc_trainer.data import FEATURE_STATS as TRAINED

    assert FEATURE_STATS == TRAINED


def test_a_window_becomes_a_row_in_feature_order() -> None:
    window = {"mean": 1, "stddev": 2, "min": 3, "max": 4, "count": 5, "p50": 6, "p95": 7, "x": 9}
    row = feature_row(window, len(FEATURE_STATS), "t@w")
    np.testing.assert_array_equal(row, np.arange(1, 8, dtype=np.float32))


def test_a_model_with_more_lags_than_the_store_holds_is_refused() -> None:
    with pytest.raises(FailedPrecondition, match="one lag"):
        feature_row({s: 1.0 for s in FEATURE_STATS}, 2 * len(FEATURE_STATS), "t@w")


def test_a_window_without_a_statistic_is_refused() -> None:
    window = {s: 1.0 for s in FEATURE_STATS if s != "p95"}
    with pytest.raises(FailedPrecondition, match="p95"):
        feature_row(window, len(FEATURE_STATS), "t@w")
