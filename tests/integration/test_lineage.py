"""``aistack lineage`` on the real broker: a logged prediction walked back
through its model, its feature window and the clean events to the raw
records' offsets, with what retention removed shown as gone."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from aistack import cli
from aistack.lineage import trace
from aistack.settings import LineageSettings
from shared.bus.topics import TopicSpec, ensure_topics
from shared.contracts.aistack.v1 import common_pb2, events_pb2, models_pb2, predictions_pb2
from shared.errors import NotFound
from tests.infra import Infra

pytestmark = pytest.mark.integration

WINDOW_START = 1_795_000_000  # seconds: a minute's window


def publish(infra: Infra, topic: str, key: str, value: bytes) -> int:
    """Send one record; its offset."""
    producer = Producer(infra.kafka.client_config())
    offsets: list[int | None] = []
    producer.produce(
        topic, value, key.encode(), on_delivery=lambda _, m: offsets.append(m.offset())
    )
    assert producer.flush(30) == 0
    (offset,) = offsets
    assert offset is not None
    return offset


@pytest.fixture
def logged(infra: Infra, tmp_path: Path) -> tuple[LineageSettings, dict[str, object]]:
    """A raw topic, a clean topic, a model and a prediction by entity, as the
    services would have written them, on topics of this test's own."""
    run = uuid.uuid4().hex[:8]
    names = {kind: f"lineage-{kind}-{run}" for kind in ("raw", "clean", "models", "predictions")}
    ensure_topics(
        infra.kafka,
        [TopicSpec(name, None) for name in names.values()],
        partitions=1,
    )
    entity, other = f"dev-{run}", f"other-{run}"
    raw = [
        publish(infra, names["raw"], entity, json.dumps({"device_id": entity, "n": i}).encode())
        for i in range(3)
    ]
    clean: list[int] = []

    def clean_event(name: str, device: str, metric: str, second: int, raw_at: int) -> bytes:
        event = events_pb2.CleanEvent(
            event_id=f"{run}-{name}",
            entity_id=device,
            source=common_pb2.SourcePosition(topic=names["raw"], partition=0, offset=raw_at),
        )
        event.event_time.FromSeconds(WINDOW_START + second)
        event.sensor_reading.measurements.add(metric=metric, value=20.0, unit="C")
        return event.SerializeToString()

    for i, raw_offset in enumerate(raw):
        value = clean_event(str(i), entity, "temperature", 10 * i, raw_offset)
        clean.append(publish(infra, names["clean"], entity, value))
        # Inside the window's offset range but not under it: another
        # entity's event, the entity's humidity, its next minute's reading.
        for name, device, metric, second in (
            (f"x{i}", other, "temperature", 10 * i),
            (f"h{i}", entity, "humidity", 10 * i),
            (f"n{i}", entity, "temperature", 60 + i),
        ):
            publish(infra, names["clean"], device, clean_event(name, device, metric, second, 999))
    window_range = common_pb2.OffsetRange(
        topic=names["clean"], partition=0, min_offset=clean[0], max_offset=clean[-1], count=3
    )
    store = tmp_path / "store" / "date=2026-11-23" / "metric=temperature" / "part-0.parquet"
    store.parent.mkdir(parents=True)
    sources_type = pa.list_(
        pa.struct(
            [
                ("topic", pa.string()),
                ("partition", pa.int32()),
                ("min_offset", pa.int64()),
                ("max_offset", pa.int64()),
                ("count", pa.int64()),
            ]
        )
    )
    span = {
        "topic": names["clean"],
        "partition": 0,
        "min_offset": clean[0],
        "max_offset": clean[-1],
        "count": 3,
    }
    pq.write_table(
        pa.table(
            {
                "entity_id": [entity],
                "path": [""],
                "window_start": pa.array([WINDOW_START * 1_000_000], pa.timestamp("us")),
                "window_end": pa.array([(WINDOW_START + 60) * 1_000_000], pa.timestamp("us")),
                "sources": pa.array([[span]], sources_type),
            }
        ),
        store,
    )
    model = models_pb2.ModelReady(
        model_name=f"forecast-{run}",
        version="2",
        artifact_uri="file:///models/forecast/2",
        sha256="ab" * 32,
        lineage=models_pb2.ModelLineage(
            study_id=f"study-{run}",
            trial_id=f"study-{run}/1",
            trial_number=1,
            data=models_pb2.DataLineage(dataset="features@v1", files=[str(store)]),
        ),
    )
    model.lineage.params["units"].int_value = 72
    publish(infra, names["models"], model.model_name, model.SerializeToString())
    prediction = predictions_pb2.PredictionLogged(
        request_id=f"req-{run}",
        model_name=model.model_name,
        model_version="2",
        entity_id=entity,
        window_key=f"window-{run}",
        window_sources=[window_range],
        window_metric="temperature",
        latency_us=1234,
    )
    prediction.window_start.FromSeconds(WINDOW_START)
    prediction.window_end.FromSeconds(WINDOW_START + 60)
    publish(infra, names["predictions"], entity, prediction.SerializeToString())
    settings = LineageSettings(
        kafka=infra.kafka,
        predictions_topic=names["predictions"],
        models_topic=names["models"],
    )
    return settings, {"names": names, "raw": raw, "run": run, "model": model, "entity": entity}


def test_a_prediction_is_walked_back_to_its_raw_offsets(
    logged: tuple[LineageSettings, dict[str, object]],
) -> None:
    settings, made = logged
    names, raw, run = made["names"], made["raw"], made["run"]
    assert isinstance(names, dict) and isinstance(raw, list)
    text = "\n".join(trace(settings, f"req-{run}").lines())
    raw_span = f"raw records {names['raw']}[0] offsets {raw[0]}..{raw[-1]} (3)"
    # Twice: under the window the prediction was fed, and under the training data.
    assert text.count(raw_span) == 2, text
    # In the ranges, not under the windows: another entity's, another
    # metric's and another minute's events.
    assert "999" not in text
    assert text.count(": 3 read") == 2, text
    assert f"feature window window-{run} of entity dev-{run}" in text
    assert f"study study-{run}, trial study-{run}/1 (#1): units=72" in text
    assert f"{names['raw']}[0]@{raw[0]}: " + json.dumps({"device_id": f"dev-{run}", "n": 0}) in text
    tree = trace(settings, f"forecast-{run}@2").to_json()
    assert tree["title"].startswith(f"model forecast-{run} version 2: artifact sha256 abab")


def test_what_retention_removed_is_shown_as_gone(
    infra: Infra, logged: tuple[LineageSettings, dict[str, object]]
) -> None:
    settings, made = logged
    names, raw, run = made["names"], made["raw"], made["run"]
    assert isinstance(names, dict) and isinstance(raw, list)
    admin = AdminClient(infra.kafka.client_config())
    deleted = admin.delete_records([TopicPartition(names["raw"], 0, raw[1])])
    for future in deleted.values():
        future.result(timeout=30)
    text = "\n".join(trace(settings, f"req-{run}").lines())
    assert f"{names['raw']}[0]@{raw[0]}: past the topic's retention" in text
    assert f"{names['raw']}[0]@{raw[1]}: " + json.dumps({"device_id": f"dev-{run}", "n": 1}) in text


def test_the_command_says_what_is_missing_in_one_line(
    logged: tuple[LineageSettings, dict[str, object]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, made = logged
    monkeypatch.setenv("AISTACK_KAFKA_BOOTSTRAP", settings.kafka.bootstrap)
    monkeypatch.setenv("AISTACK_LINEAGE_PREDICTIONS_TOPIC", settings.predictions_topic)
    monkeypatch.setenv("AISTACK_LINEAGE_MODELS_TOPIC", settings.models_topic)
    assert cli.main(["lineage", "nothing-such"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"aistack lineage: no prediction 'nothing-such' on {settings.predictions_topic} "
        "(not sampled, past retention, or never made)"
    )
    assert cli.main(["lineage", f"req-{made['run']}", "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["prediction"]["requestId"] == f"req-{made['run']}"
    with pytest.raises(NotFound):
        trace(settings, f"forecast-{made['run']}@9")
