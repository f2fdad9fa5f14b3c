"""Which open window of a micro-batch's updates the online store serves."""

from __future__ import annotations

from svc_transform.sinks import OpenWindow, freshest_open_windows

S = 1_000  # milliseconds
US = 1_000_000


def sliding(end_s: int, last_s: int, n: int, entity: str = "t-1") -> OpenWindow:
    return OpenWindow(
        entity, "temperature", "", "sliding-20s-every-10s", end_s * S, last_s * US, n, b""
    )


def test_the_fullest_window_holding_the_latest_reading_is_served() -> None:
    # A reading at 11 s is in [0, 20) and [10, 30): [0, 20) has counted more.
    rows = [sliding(20, 11, 4), sliding(30, 11, 1)]
    assert freshest_open_windows(rows) == [rows[0]]


def test_a_late_readings_window_gives_way_to_the_one_holding_the_latest() -> None:
    # A late reading at 8 s updates [-10, 10) and [0, 20) in the same batch as
    # one at 11 s: [-10, 10) no longer holds the latest reading.
    rows = [sliding(10, 8, 3), sliding(20, 11, 5), sliding(30, 11, 1)]
    assert freshest_open_windows(rows) == [rows[1]]


def test_a_batch_of_only_a_late_reading_offers_its_window() -> None:
    # The store refuses it when it holds a later window (compared by end).
    rows = [OpenWindow("t-1", "temperature", "", "tumbling-10s", 10 * S, 8 * US, 4, b"")]
    assert freshest_open_windows(rows) == rows


def test_each_entity_metric_path_and_kind_gets_its_own_window() -> None:
    rows = [
        sliding(20, 11, 4),
        sliding(20, 12, 2, entity="t-2"),
        OpenWindow("t-1", "humidity", "", "sliding-20s-every-10s", 20 * S, 11 * US, 4, b""),
        OpenWindow("t-1", "temperature", "", "tumbling-10s", 20 * S, 11 * US, 1, b""),
        OpenWindow("h", "http.latency_ms", "/a", "tumbling-10s", 20 * S, 11 * US, 1, b""),
        OpenWindow("h", "http.latency_ms", "/b", "tumbling-10s", 20 * S, 11 * US, 1, b""),
    ]
    assert sorted(freshest_open_windows(rows)) == sorted(rows)


def test_an_empty_batch_serves_nothing() -> None:
    assert freshest_open_windows([]) == []
