"""The plan-per-key-order path for JSON sensor readings: what it accepts is the
general path's event to the byte, and whatever else it leaves to the general
path (it never rejects)."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.services import sensor_event
from svc_ingest import payload
from svc_ingest.cleaner import Cleaner
from svc_ingest.rejection import RecordRejected
from svc_ingest.rules import CleaningRules
from tests.unit.test_ingest_properties import sensor_docs

RULES = CleaningRules(metric_ranges={"temperature": (-90.0, 60.0)})
# Past every time the strategies draw: the time check is the cleaner's own test.
NOW_US = 2_000_000_000 * 10**6


def general(cleaner: Cleaner, doc: dict[str, Any]) -> bytes | RecordRejected:
    try:
        (event,) = cleaner._from_json(doc, b"k")
    except RecordRejected as rejected:
        return rejected
    return event.SerializeToString(deterministic=True)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(doc=sensor_docs)
def test_what_the_fast_path_accepts_is_the_general_paths_event(doc: dict[str, Any]) -> None:
    cleaner = Cleaner(RULES)
    fast = cleaner._shapes.clean(doc, NOW_US)
    expected = general(cleaner, doc)
    if fast is None:
        return
    assert not isinstance(expected, RecordRejected), expected
    # Not deterministic: the map's own order must match too, as the bytes sent.
    assert fast.SerializeToString() == cleaner._from_json(doc, b"k")[0].SerializeToString()


def test_the_benchmarks_readings_take_the_fast_path_and_repeat_their_plan() -> None:
    cleaner = Cleaner(RULES)
    now = time.time()
    for i in range(3):
        doc = payload.decode(sensor_event(i, now), "application/json", RULES)
        assert isinstance(doc, dict)
        fast = cleaner._shapes.clean(doc, NOW_US)
        assert fast is not None
        assert fast.SerializeToString() == general(cleaner, doc)
        assert fast.attributes["site"] == "plant-a"
    assert len(cleaner._shapes._plans) == 1


READING: dict[str, Any] = {
    "event_id": "e-1",
    "device_id": "Thermo-1",
    "timestamp": 1_795_251_600.5,
    "metrics": {
        "temperature": {"value": 71.6, "unit": "F"},
        "humidity": {"value": 40, "unit": "%"},
    },
    "site": "plant-a",
}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"type": "sensor"}, "a declared kind"),
        ({"metrics": [{"name": "humidity", "value": 40}]}, "metrics as an array"),
        ({"metrics": {"humidity": {"value": "40", "unit": "%"}}}, "a number given as text"),
        ({"metrics": {"humidity": {"value": True, "unit": "%"}}}, "a boolean"),
        ({"metrics": {"temperature": 999}}, "out of range"),
        ({"metrics": {}}, "no metrics"),
        ({"timestamp": None}, "no time"),
        ({"device_id": ""}, "an empty device id"),
        ({"attributes": ["x"]}, "attributes not an object"),
        ({"fields": {"x": 1}, "name": "cpu"}, "a Telegraf metric"),
        ({"timestamp": 2_000_000_301}, "too far ahead of the clock"),
    ],
)
def test_what_the_plan_does_not_cover_goes_to_the_general_path(
    change: dict[str, Any], why: str
) -> None:
    cleaner = Cleaner(RULES)
    assert cleaner._shapes.clean(READING, NOW_US) is not None
    assert cleaner._shapes.clean({**READING, **change}, NOW_US) is None, why


def test_a_reading_without_an_id_gets_the_content_hash_through_the_fast_path() -> None:
    cleaner = Cleaner(RULES)
    value = b'{"device_id": "d-1", "ts": 1795251600, "metrics": {"rh": {"value": 40, "unit": "%"}}}'
    (event,) = cleaner.clean_all(value, None, "application/json", 1_795_251_700 * 10**6)
    assert event.event_id.startswith("h-")
    assert event.sensor_reading.measurements[0].value == 40.0


# Integers past 64 bits, which no JSON parser here hands over, the fast path
# leaves to the general one.
numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers(1 - 2**63, 2**63 - 1)
readings = st.fixed_dictionaries(
    {
        "device_id": st.sampled_from(["d-1", "Thermo 7", " ", ""]),
        "timestamp": st.floats(1.6e9, 1.9e9)
        | st.integers(1_600_000_000, 1_900_000_000)
        | st.integers(1_600_000_000_000, 1_900_000_000_000),
        "metrics": st.dictionaries(
            st.sampled_from(["temperature", "humidity", "pressure", "Pressure", "x y"]),
            st.fixed_dictionaries(
                {"value": numbers, "unit": st.sampled_from(["C", "F", "%", "hPa", "kPa", "?"])}
            ),
            min_size=1,
            max_size=3,
        ),
    },
    optional={
        "event_id": st.text(max_size=6),
        "attributes": st.dictionaries(st.text(max_size=4), st.text(max_size=4) | numbers),
        "site": st.text(max_size=4) | numbers | st.lists(st.integers(), max_size=2),
    },
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(doc=readings)
def test_a_reading_of_plain_numbers_is_accepted_by_both_paths_or_by_neither(
    doc: dict[str, Any],
) -> None:
    cleaner = Cleaner(RULES)
    fast = cleaner._shapes.clean(doc, NOW_US)
    expected = general(cleaner, doc)
    if isinstance(expected, RecordRejected):
        assert fast is None
    else:
        assert fast is not None
        assert fast.SerializeToString() == cleaner._from_json(doc, b"k")[0].SerializeToString()


def test_a_reading_ahead_of_the_clock_is_rejected_as_the_general_path_rejects_it() -> None:
    cleaner = Cleaner(RULES)
    value = orjson.dumps({**READING, "timestamp": 2_000_000_301})
    with pytest.raises(RecordRejected) as rejected:
        cleaner.clean_all(value, b"k", "application/json", NOW_US)
    assert rejected.value.reason == "future_timestamp"
