"""Entity features: a window from the online store as one model input row."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shared.contracts.aistack.v1.features_pb2 import FeatureWindow
from shared.errors import FailedPrecondition, InvalidArgument
from shared.feature_store import FEATURE_STATS, open_field
from svc_model.features import feature_row, window_field


def test_a_window_becomes_a_row_in_feature_order() -> None:
    window = FeatureWindow(
        mean=1, stddev=2, min=3, max=4, count=5, p50=6, p95=7, last=9, error_rate=0.5
    )
    row = feature_row(window, len(FEATURE_STATS), "t@w")
    np.testing.assert_array_equal(row, np.arange(1, 8, dtype=np.float32))


def test_a_model_with_more_lags_than_the_store_holds_is_refused() -> None:
    with pytest.raises(FailedPrecondition, match="one lag"):
        feature_row(FeatureWindow(mean=1.0), 2 * len(FEATURE_STATS), "t@w")


def test_a_window_with_a_statistic_that_is_not_a_number_is_refused() -> None:
    window = FeatureWindow(mean=1.0, stddev=1.0, min=1.0, max=1.0, count=1, p50=1.0, p95=math.nan)
    with pytest.raises(FailedPrecondition, match="p95"):
        feature_row(window, len(FEATURE_STATS), "t@w")


def test_the_window_parameter_picks_the_closed_or_the_open_field() -> None:
    assert window_field("t@tumbling-60s", "closed") == "t@tumbling-60s"
    assert window_field("t@tumbling-60s", "open") == "t@tumbling-60s:open"
    assert window_field("t@tumbling-60s", "open") == open_field("t@tumbling-60s")
    # No field yet: the reader says the feature is needed.
    assert window_field("", "open") == ""
    with pytest.raises(InvalidArgument, match="'window' is 'latest': one of closed, open"):
        window_field("t@tumbling-60s", "latest")
