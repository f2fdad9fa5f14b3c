"""svc_transform's metrics from Spark's progress reports, with no Spark
running: each query's consumer lag, per partition of its Kafka source."""

from __future__ import annotations

import json
import uuid
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryTerminatedEvent,
)

from svc_transform.codegen import BatchSizes
from svc_transform.job import ProgressListener, offsets_behind
from svc_transform.metrics import TransformMetrics

TOPIC = "aistack.events.clean"


def progress(
    query_id: uuid.UUID, name: str, end: dict[str, int], latest: dict[str, int], *, as_json: bool
) -> QueryProgressEvent:
    """A Kafka source's progress as Spark reports it. The classic listener
    hands offsets over as JSON text; Spark Connect's, as a dict's str()."""

    def offsets(by_partition: dict[str, int]) -> Any:
        offsets = {TOPIC: by_partition}
        return json.dumps(offsets) if as_json else offsets

    behind = [latest[p] - end[p] for p in end]
    source = {
        "description": f"KafkaV2[Subscribe[{TOPIC}]]",
        "startOffset": offsets(dict.fromkeys(end, 0)),
        "endOffset": offsets(end),
        "latestOffset": offsets(latest),
        "numInputRows": sum(end.values()),
        "inputRowsPerSecond": 10.0,
        "processedRowsPerSecond": 20.0,
        # What Spark's Kafka source adds: the aggregates of the same numbers.
        "metrics": {
            "minOffsetsBehindLatest": str(min(behind)),
            "maxOffsetsBehindLatest": str(max(behind)),
            "avgOffsetsBehindLatest": str(sum(behind) / len(behind)),
        },
    }
    return QueryProgressEvent.fromJson(
        {
            "progress": {
                "id": str(query_id),
                "runId": str(uuid.uuid4()),
                "name": name,
                "timestamp": "2026-11-22T10:00:00.000Z",
                "batchId": 3,
                "batchDuration": 250,
                "numInputRows": sum(end.values()),
                "durationMs": {"triggerExecution": 250},
                "eventTime": {},
                "stateOperators": [],
                "sources": [source],
                "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
            }
        }
    )


def lag(reader: str, partition: int) -> float | None:
    labels = {"reader": reader, "topic": TOPIC, "partition": str(partition)}
    return REGISTRY.get_sample_value("aistack_consumer_lag", labels)


def test_offsets_behind_latest_per_partition() -> None:
    end = json.dumps({TOPIC: {"0": 40, "1": 7}})
    latest = json.dumps({TOPIC: {"0": 45, "1": 7}})
    assert offsets_behind(end, latest) == {(TOPIC, 0): 5, (TOPIC, 1): 0}
    # No latest offsets reported, or a source that is not Kafka's: nothing.
    assert offsets_behind(end, "None") == {}
    assert offsets_behind(end, "null") == {}
    assert offsets_behind("FileStreamSourceOffset(3)", latest) == {}


def test_each_query_exports_its_lag_and_drops_it_when_it_ends() -> None:
    listener = ProgressListener(TransformMetrics.create(CollectorRegistry()))
    query_id = uuid.uuid4()
    name = f"windows-{query_id.hex[:8]}"
    reader = f"svc_transform.{name}"
    for as_json in (True, False):
        event = progress(query_id, name, {"0": 40, "1": 7}, {"0": 45, "1": 9}, as_json=as_json)
        listener.onQueryProgress(event)
        assert (lag(reader, 0), lag(reader, 1)) == (5, 2)
    listener.onQueryIdle(QueryIdleEvent(query_id, uuid.uuid4(), "2026-11-22T10:00:05.000Z"))
    assert (lag(reader, 0), lag(reader, 1)) == (0, 0)
    listener.onQueryTerminated(QueryTerminatedEvent(query_id, uuid.uuid4(), None, None))
    assert (lag(reader, 0), lag(reader, 1)) == (None, None)


def test_each_querys_next_batch_is_expected_from_its_last_report() -> None:
    sizes = BatchSizes()
    listener = ProgressListener(TransformMetrics.create(CollectorRegistry()), sizes)
    # 47 rows read, 7 behind the source's latest: the next batch holds about 47.
    listener.onQueryProgress(
        progress(uuid.uuid4(), "windows", {"0": 40, "1": 7}, {"0": 45, "1": 9}, as_json=True)
    )
    # 3 rows read, 900 behind: the next reads those 900.
    listener.onQueryProgress(
        progress(uuid.uuid4(), "open-windows", {"0": 3}, {"0": 903}, as_json=True)
    )
    assert sizes.expected_rows("windows") == 47
    assert sizes.expected_rows("open-windows") == 900
    assert sizes.expected_rows("dead-letters") is None
