"""What `aistack score --publish` makes of an output row: one BatchPrediction,
keyed by entity."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from shared.feature_store import FEATURE_STATS
from svc_score.plan import plan
from svc_score.publish import Layout, messages
from tests.unit.test_score_plan import ready

TYPES = {
    **{stat: "double" for stat in FEATURE_STATS},
    "entity_id": "string",
    "window_start": "timestamp",
    "window_end": "bigint",  # not a timestamp: left out of the record
    "sources": "array<struct<topic:string,partition:int,min_offset:bigint,count:bigint>>",
}
SPAN = {"topic": "clean", "partition": 1, "min_offset": 5, "max_offset": 9, "count": 2}


def test_each_row_becomes_one_record_keyed_by_its_entity() -> None:
    event = ready("m", "3", outputs=(("prediction", (-1, 1)), ("probs", (-1, 2))))
    layout = Layout.of(plan(event, TYPES, row_sources=True), TYPES)
    start = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    batch = pa.RecordBatch.from_pydict(
        {
            "entity_id": ["a", None],
            "window_start": pa.array([start, None], pa.timestamp("us", tz="UTC")),
            "window_end": [60_000, 120_000],
            "sources": [[SPAN], []],
            "prediction": pa.array([0.5, 1.5], pa.float32()),
            "probs": [[0.25, 0.75], [1.0, 0.0]],
            "model_name": ["m", "m"],
            "model_version": ["3", "3"],
        }
    )
    (key_a, first), (key_b, second) = messages(batch, layout, "run-1")
    assert key_a == "a" and first.entity_id == "a"
    assert first.run_id == "run-1" and (first.model_name, first.model_version) == ("m", "3")
    assert first.window_start.ToDatetime(tzinfo=UTC) == start
    assert not first.HasField("window_end")
    (span,) = first.window_sources
    assert (span.topic, span.partition, span.min_offset, span.max_offset, span.count) == (
        "clean",
        1,
        5,
        9,
        2,
    )
    assert list(second.window_sources) == []
    assert [(o.name, list(o.values)) for o in first.outputs] == [
        ("prediction", [0.5]),
        ("probs", [0.25, 0.75]),
    ]
    # No entity: keyed by the model, and nothing made up for the missing keys.
    assert key_b == "m" and second.entity_id == ""
    assert not second.HasField("window_start")
    assert [list(o.values) for o in second.outputs] == [[1.5], [1.0, 0.0]]


def test_a_layout_holds_plain_values_only() -> None:
    event = ready("m", "1")
    layout = Layout.of(plan(event, TYPES, row_sources=True), TYPES)
    assert layout.keys == ("entity_id", "window_start", "window_end", "sources")
    assert layout.outputs == ("prediction",)
    assert layout.timestamp_keys == frozenset({"window_start"})
