from __future__ import annotations

import pytest

from svc_ingest.rejection import RecordRejected
from svc_ingest.timestamps import parse_time

# 2026-11-21T09:00:00Z
T = 1_795_251_600
US = T * 1_000_000


@pytest.mark.parametrize(
    "given",
    [
        "2026-11-21T10:00:00+01:00",
        "2026-11-21T09:00:00Z",
        "2026-11-21T04:00:00-05:00",
        "2026-11-21T09:00:00",  # no offset: read as UTC
        "2026-11-21 09:00:00+00:00",
        T,
        float(T),
        T * 1000,
        T * 1_000_000,
        T * 1_000_000_000,
        str(T),
        f" {T * 1000} ",
        "21/Nov/2026:10:00:00 +0100",
    ],
)
def test_every_accepted_form_is_the_same_utc_instant(given: object) -> None:
    assert parse_time(given) == US


def test_fractions_are_kept_to_the_microsecond() -> None:
    assert parse_time("2026-11-21T09:00:00.123456Z") == US + 123_456
    assert parse_time(T + 0.5) == US + 500_000
    assert parse_time(T * 1000 + 7) == US + 7000


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("yesterday", "invalid_timestamp"),
        ("2026-13-01T00:00:00Z", "invalid_timestamp"),
        ("32/Nov/2026:10:00:00 +0100", "invalid_timestamp"),
        ("21/Foo/2026:10:00:00 +0100", "invalid_timestamp"),
        (-5, "invalid_timestamp"),
        (10**21, "invalid_timestamp"),
        ("1800-01-01T00:00:00Z", "invalid_timestamp"),
        (True, "invalid_type"),
        (None, "invalid_type"),
        ({"t": 1}, "invalid_type"),
        (float("nan"), "non_finite"),
        (float("inf"), "non_finite"),
    ],
)
def test_bad_timestamps_are_rejected_with_a_reason(given: object, reason: str) -> None:
    with pytest.raises(RecordRejected) as caught:
        parse_time(given)
    assert caught.value.reason == reason
