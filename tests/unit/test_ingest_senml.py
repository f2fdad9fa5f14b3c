"""SenML (RFC 8428) JSON packs: resolution, the entity split, and their clean events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.contracts.aistack.v1 import events_pb2
from svc_ingest import senml
from svc_ingest.cleaner import Cleaner, content_hash
from svc_ingest.rejection import REASONS, RecordRejected
from svc_ingest.rules import CleaningRules

NOW_US = 1_795_251_600 * 1_000_000  # 2026-11-21T09:00:00Z
SENML = "application/senml+json"
T0 = 1_795_251_000  # ten minutes before NOW


def clean(pack: Any, content_type: str = SENML, key: bytes | None = None) -> list[Any]:
    return Cleaner(CleaningRules()).clean_all(json.dumps(pack).encode(), key, content_type, NOW_US)


def reason(pack: Any, content_type: str = SENML, key: bytes | None = None) -> str:
    with pytest.raises(RecordRejected) as caught:
        clean(pack, content_type, key)
    assert caught.value.reason in REASONS and caught.value.message
    return caught.value.reason


def readings(events: list[events_pb2.CleanEvent]) -> list[tuple[str, int, list[Any]]]:
    return [
        (
            e.entity_id,
            e.event_time.ToMicroseconds(),
            [(m.metric, round(m.value, 6), m.unit) for m in e.sensor_reading.measurements],
        )
        for e in events
    ]


def test_the_rfc_multiple_datapoints_example_becomes_one_event_per_time() -> None:
    # RFC 8428 §5.1.3, with times moved next to "now".
    pack = [
        {"bn": "urn:dev:ow:10e2073a01080063:", "bt": T0, "bu": "A", "bver": 5},
        {"n": "voltage", "u": "V", "v": 120.1},
        {"n": "current", "t": -5, "v": 1.2},
        {"n": "current", "t": -4, "v": 1.3},
    ]
    events = clean(pack)
    entity = "urn:dev:ow:10e2073a01080063"
    assert readings(events) == [
        (entity, T0 * 1_000_000, [("voltage", 120.1, "V")]),
        (entity, (T0 - 5) * 1_000_000, [("current", 1.2, "A")]),
        (entity, (T0 - 4) * 1_000_000, [("current", 1.3, "A")]),
    ]
    assert all(e.sensor_reading.device_id == entity for e in events)
    # Deterministic per-reading ids: the record's content hash and the index.
    base = content_hash(json.dumps(pack).encode())
    assert [e.event_id for e in events] == [f"{base}-0", f"{base}-1", f"{base}-2"]
    assert clean(pack) == events  # a retry of the same bytes gets the same ids


def test_records_at_one_time_are_one_reading_with_units_normalised() -> None:
    pack = [
        {
            "bn": "urn:dev:mac:0024befffe804ff1/",
            "bt": T0,
            "n": "temperature",
            "u": "Cel",
            "v": 23.1,
        },
        {"n": "humidity", "u": "%RH", "v": 40},
        {"n": "pressure", "u": "Pa", "v": 101300, "bv": 0},
    ]
    (event,) = clean(pack)
    assert event.entity_id == "urn:dev:mac:0024befffe804ff1"
    assert readings([event])[0][2] == [
        ("temperature", 23.1, "degC"),
        ("humidity", 40.0, "%"),
        ("pressure", 1013.0, "hPa"),
    ]
    assert event.event_id == content_hash(json.dumps(pack).encode())  # one event: no suffix


def test_relative_times_count_from_now_and_base_values_add() -> None:
    pack = [{"bn": "dev-7:", "bv": 20, "bu": "Cel", "n": "temperature", "v": 1.5, "t": -30}]
    (event,) = clean(pack)
    assert event.event_time.ToMicroseconds() == NOW_US - 30_000_000
    assert event.sensor_reading.measurements[0].value == 21.5
    (no_time,) = clean([{"n": "dev-7:temperature", "u": "Cel", "v": 1}])
    assert no_time.event_time.ToMicroseconds() == NOW_US  # t 0 is "roughly now"


def test_booleans_are_zero_or_one_and_text_is_an_attribute() -> None:
    pack = [
        {"bn": "lock-1/", "bt": T0, "n": "open", "vb": True},
        {"n": "closed", "vb": False},
        {"n": "state", "vs": "jammed"},
        {"n": "blob", "vd": "aGk"},
        {"n": "level", "v": 3, "ut": 60},
    ]
    (event,) = clean(pack)
    assert readings([event])[0][2] == [("open", 1.0, ""), ("closed", 0.0, ""), ("level", 3.0, "")]
    assert dict(event.attributes) == {"state": "jammed", "blob": "aGk", "level.ut": "60"}


@pytest.mark.parametrize(
    ("base", "own", "entity", "metric"),
    [
        ("urn:dev:ow:10e2073a01080063:", "temp", "urn:dev:ow:10e2073a01080063", "temp"),
        ("dev-1/", "temp", "dev-1", "temp"),
        ("dev-1", "temp", "dev-1", "temp"),
        ("", "urn:dev:ow:abc:temp", "urn:dev:ow:abc", "temp"),
        ("urn:dev:ow:abc:temp", "", "urn:dev:ow:abc", "temp"),
        ("", "dev-1/room/temp", "dev-1/room", "temp"),
        ("dev-1/", "room/temp", "dev-1", "room.temp"),
        ("", "temp", "", "temp"),
    ],
)
def test_the_name_splits_into_device_and_metric(
    base: str, own: str, entity: str, metric: str
) -> None:
    assert senml.entity_and_metric(base, own) == (entity, metric)


def test_a_name_without_a_device_part_takes_the_record_key() -> None:
    (event,) = clean([{"n": "temperature", "u": "Cel", "v": 20, "t": T0}], key=b"Dev-9")
    assert event.entity_id == "dev-9"
    assert reason([{"n": "temperature", "u": "Cel", "v": 20}]) == "missing_field"


def test_a_json_array_without_content_type_is_sniffed_as_senml() -> None:
    pack = [{"bn": "dev-1:", "n": "temperature", "u": "Cel", "v": 20, "bt": T0}]
    for content_type in ("", "application/json"):
        (event,) = clean(pack, content_type)
        assert event.entity_id == "dev-1"
    # An array that is no pack (its first record names nothing) is still refused.
    assert reason([{"device_id": "a"}], "") == "not_an_object"
    assert reason([1, 2], "application/json") == "not_an_object"


@pytest.mark.parametrize(
    ("pack", "why"),
    [
        ({"bn": "dev:", "n": "t", "v": 1}, "not_an_object"),  # senml+json must be an array
        ([], "missing_field"),
        ([{"bn": "dev:", "n": "t", "v": 1}, 5], "not_an_object"),
        ([{"bn": "dev:", "n": "t"}], "missing_field"),  # no value
        ([{"bn": "dev:", "n": "t", "v": 1, "vs": "x"}], "invalid_field"),  # two values
        ([{"bn": "dev:", "n": "t", "v": "1"}], "invalid_type"),
        ([{"bn": "dev:", "n": "t", "vb": 1}], "invalid_type"),
        ([{"bn": "dev:", "n": "t", "vs": 1}], "invalid_type"),
        ([{"bn": 7, "n": "t", "v": 1}], "invalid_type"),
        ([{"bn": "dev:", "n": "t", "v": 1, "t": "soon"}], "invalid_type"),
        ([{"bn": "dev:", "n": "t", "v": 1, "bt": 1e15}], "invalid_timestamp"),
        ([{"bn": "dev:", "n": "t", "v": 1, "t": 3600}], "future_timestamp"),
        ([{"bn": "dev:", "n": "t", "s": 10}], "invalid_field"),  # sums unsupported
        ([{"bn": "dev:", "n": "t", "v": 1, "ext_": 1}], "invalid_field"),  # must-understand
        ([{"bn": "dev:", "n": "t", "v": 1, "bver": 11}], "invalid_field"),
        ([{"bn": "de v:", "n": "t", "v": 1}], "invalid_field"),  # not a SenML name
        ([{"bn": "dev:", "n": "temperature", "u": "furlongs", "v": 1}], "unknown_unit"),
        ([{"bn": "dev:", "n": "temperature", "u": "Cel", "v": 900}], "out_of_range"),
        ([{"bn": "dev:", "n": "t", "v": 1}, {"n": "t", "v": 2}], "duplicate_key"),
        ([{"bn": "dev:", "n": "state", "vs": "ok"}], "missing_field"),  # no number at all
        ([{"bn": "dev:"}], "missing_field"),  # names no metric
    ],
)
def test_malformed_packs_are_dead_lettered_whole_with_the_record_named(pack: Any, why: str) -> None:
    assert reason(pack) == why


def test_the_message_names_the_record_at_fault() -> None:
    pack = [{"bn": "dev:", "n": "a", "v": 1}, {"n": "b", "v": "x"}]
    with pytest.raises(RecordRejected, match="SenML record 1"):
        clean(pack)


def test_a_pack_over_the_reading_limit_is_refused() -> None:
    cleaner = Cleaner(CleaningRules(max_events=2))
    pack = [{"bn": "dev:", "n": "a", "v": 1, "t": -i} for i in range(3)]
    with pytest.raises(RecordRejected) as caught:
        cleaner.clean_all(json.dumps(pack).encode(), None, SENML, NOW_US)
    assert caught.value.reason == "invalid_field"


def test_clean_refuses_a_record_of_several_readings_rather_than_cut_it() -> None:
    pack = [{"bn": "dev:", "n": "a", "v": 1, "t": -1}, {"n": "a", "v": 2, "t": -2}]
    cleaner = Cleaner(CleaningRules())
    with pytest.raises(RecordRejected) as caught:
        cleaner.clean(json.dumps(pack).encode(), None, SENML, NOW_US)
    assert caught.value.reason == "several_events"
    one = json.dumps(pack[:1]).encode()
    assert cleaner.clean(one, None, SENML, NOW_US) == cleaner.clean_all(one, None, SENML, NOW_US)[0]
