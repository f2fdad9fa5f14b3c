"""svc_model's prediction log on the real broker: what it publishes for a
request by entity and for one with tensors, the request id both ways, and
what happens when its broker is away (requests answer, losses are counted)."""

from __future__ import annotations

import hashlib
import re
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from shared.bus import envelope
from shared.bus.consumer import BusConsumer, Record, read_to_end
from shared.bus.topics import ensure_topics
from shared.contracts.aistack.v1.features_pb2 import FeatureWindow
from shared.contracts.aistack.v1.predictions_pb2 import PredictionLogged
from shared.contracts.inference import grpc_predict_v2_pb2 as pb
from shared.feature_store import FEATURE_STATS, encode_window
from shared.ports import free_port
from shared.settings import KafkaSettings
from svc_model.inference import REQUEST_ID_PARAMETER
from tests.infra import Infra
from tests.integration import model_support as ms
from tests.model_events import decided

pytestmark = pytest.mark.integration

MODEL = "forecast"
FIELD = "temp@tumbling-60s"
WIDTH = len(FEATURE_STATS)
STATS = {
    "mean": 21.5,
    "stddev": 0.5,
    "min": 20.0,
    "max": 23.0,
    "count": 12,
    "p50": 21.4,
    "p95": 22.8,
}


@pytest.fixture(scope="module")
def regressor(tmp_path_factory: pytest.TempPathFactory) -> ms.Artifact:
    return ms.export_regressor(tmp_path_factory.mktemp("log-model") / "regressor", width=WIDTH)


@pytest.fixture
def model_settings(
    infra: Infra, tmp_path: Path, unique: str, regressor: ms.Artifact
) -> ms.ModelSettings:
    settings = ms.settings(
        infra,
        tmp_path,
        unique,
        online_key_prefix=f"features-{unique}:",
        prediction_log_entity_fraction=1.0,
        prediction_log_tensor_fraction=1.0,
    )
    ensure_topics(settings.kafka, settings.topic_specs())
    ms.publish(
        infra,
        settings.models_topic,
        ms.regressor_event(MODEL, 1, regressor, width=WIDTH, feature=FIELD),
    )
    return settings


@pytest.fixture
def server(model_settings: ms.ModelSettings) -> Iterator[ms.ServerThread]:
    running = ms.ServerThread(model_settings)
    yield running
    running.stop()


def with_tensor(x: np.ndarray) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    return request


def by_entity(entity_id: str, request_id: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL, id=request_id)
    request.parameters["entity_id"].string_param = entity_id
    return request


def read_log(infra: Infra, topic: str, count: int, group: str) -> list[Record[PredictionLogged]]:
    consumer = BusConsumer(
        infra.kafka, group_id=group, topics=[topic], message_cls=PredictionLogged
    )
    records: list[Record[PredictionLogged]] = []
    deadline = time.monotonic() + 30
    try:
        while len(records) < count and time.monotonic() < deadline:
            records += consumer.poll_batch(10, timeout=0.5)
    finally:
        consumer.close()
    return records


def test_predictions_by_entity_and_by_tensors_are_logged_with_their_lineage(
    infra: Infra, model_settings: ms.ModelSettings, server: ms.ServerThread, unique: str
) -> None:
    import redis

    window = FeatureWindow(window_key=f"sensor-7/temp/{unique}", entity_id="sensor-7", **STATS)
    window.sources.add(
        topic="aistack.events.clean", partition=3, min_offset=10, max_offset=21, count=12
    )
    client = redis.Redis.from_url(infra.redis.url)
    client.hset(f"{model_settings.online_key_prefix}sensor-7", FIELD, encode_window(window))
    client.close()
    x = np.asarray([[1.0, 0.5, -2.0, 3.0, 4.0, 0.25, 7.0]], dtype=np.float32)
    started = time.time_ns()
    for stub in ms.stub(server.address):
        entity_response = stub.ModelInfer(by_entity("sensor-7", request_id="client-id-1"))
        tensor_response = stub.ModelInfer(with_tensor(x))
    assert entity_response.id == "client-id-1"
    assert entity_response.parameters[REQUEST_ID_PARAMETER].string_param == "client-id-1"
    # No id from the client: the server assigns one and returns it both ways.
    assigned = tensor_response.id
    assert re.fullmatch(r"[0-9a-f]{32}", assigned)
    assert tensor_response.parameters[REQUEST_ID_PARAMETER].string_param == assigned

    records = read_log(infra, model_settings.prediction_log_topic, 2, f"log-{unique}")
    by_id = {r.decode().request_id: r for r in records}
    assert set(by_id) == {"client-id-1", assigned}

    entity_record = by_id["client-id-1"]
    logged = entity_record.decode()
    assert entity_record.key == b"sensor-7"
    assert (logged.model_name, logged.model_version) == (MODEL, "1")
    assert logged.entity_id == "sensor-7" and logged.window_key == window.window_key
    assert list(logged.window_sources) == list(window.sources)
    assert not logged.inputs_sha256
    [output] = logged.outputs
    assert output.name == "prediction"
    assert list(output.values) == pytest.approx(
        list(entity_response.outputs[0].contents.fp32_contents)
    )
    assert logged.served_time.ToNanoseconds() >= started and logged.latency_us > 0
    assert dict(entity_record.headers)[envelope.TYPE] == b"aistack.v1.PredictionLogged"

    tensor_record = by_id[assigned]
    logged = tensor_record.decode()
    assert tensor_record.key == MODEL.encode()
    assert not logged.entity_id and not logged.window_key and not logged.window_sources
    data = x.astype("<f4").tobytes()
    digest = hashlib.sha256(
        struct.pack("<I", 5) + b"input" + struct.pack("<I", 4) + b"FP32"
        + struct.pack("<I", 2) + struct.pack("<2q", 1, WIDTH)
        + struct.pack("<Q", len(data)) + data
    )  # fmt: skip
    assert logged.inputs_sha256 == digest.hexdigest()
    assert list(logged.outputs[0].values) == pytest.approx(
        list(tensor_response.outputs[0].contents.fp32_contents)
    )
    assert server.metric("aistack_model_predictions_logged_total") == 2


def test_with_kafka_away_requests_keep_answering_and_the_losses_are_counted(
    model_settings: ms.ModelSettings,
) -> None:
    capacity, requests = 5, 40
    # The registry is on the real broker; the log's broker is not there.
    away = KafkaSettings(bootstrap=f"127.0.0.1:{free_port()}")
    server = ms.ServerThread(
        model_settings.model_copy(update={"prediction_log_queue": capacity}),
        prediction_log_kafka=away,
    )
    try:
        x = np.zeros((1, WIDTH), dtype=np.float32)
        for stub in ms.stub(server.address):
            for _ in range(requests):
                # A deadline an answer from the model takes a fraction of.
                response = stub.ModelInfer(with_tensor(x), timeout=5)
                assert response.model_version == "1"

        def queue_full() -> float:
            return server.metric("aistack_model_prediction_log_dropped_total", reason="queue_full")

        def accounted() -> bool:
            logged = server.metric("aistack_model_predictions_logged_total")
            return logged + queue_full() == requests

        ms.wait_for(accounted, 10, "every sampled prediction logged or dropped")
        # The producer holds ``capacity`` records it cannot deliver; the rest were dropped.
        assert server.metric("aistack_model_predictions_logged_total") == capacity
        assert queue_full() == requests - capacity
    finally:
        server.stop()
    # Stopping does not wait for a broker that is away; what it held is counted.
    assert (
        server.metric("aistack_model_prediction_log_dropped_total", reason="shutdown") == capacity
    )


def test_the_log_turned_off_logs_nothing_and_still_returns_the_request_id(
    model_settings: ms.ModelSettings,
) -> None:
    off = model_settings.model_copy(
        update={"prediction_log_entity_fraction": 0.0, "prediction_log_tensor_fraction": 0.0}
    )
    server = ms.ServerThread(off)
    try:
        assert server.server.prediction_log is None
        for stub in ms.stub(server.address):
            response = stub.ModelInfer(with_tensor(np.zeros((1, WIDTH), np.float32)))
        assert response.id
        assert response.parameters[REQUEST_ID_PARAMETER].string_param == response.id
        assert server.metric("aistack_model_predictions_logged_total") == 0
    finally:
        server.stop()


def test_a_challenger_runs_in_the_champions_shadow_and_the_caller_never_sees_it(
    infra: Infra, tmp_path: Path, unique: str, regressor: ms.Artifact
) -> None:
    """Every request the champion serves is copied to the challenger (share
    1.0) after the caller has its answer: the caller gets the champion's
    outputs, and the log holds both predictions under one request id."""
    import redis

    from shared.contracts.aistack.v1.predictions_pb2 import (
        PREDICTION_ROLE_CHAMPION,
        PREDICTION_ROLE_NAMED,
        PREDICTION_ROLE_SHADOW,
    )
    from shared.model_registry import CHALLENGER_LABEL

    settings = ms.settings(
        infra,
        tmp_path,
        unique,
        online_key_prefix=f"features-{unique}:",
        prediction_log_entity_fraction=0.0,  # only what the shadows bring
        prediction_log_tensor_fraction=0.0001,
        shadow_fraction=1.0,
    )
    ensure_topics(settings.kafka, settings.topic_specs())
    challenger = ms.regressor_event(MODEL, 2, regressor, width=WIDTH, feature=FIELD)
    challenger.labels[CHALLENGER_LABEL] = "true"
    challenger.metrics["val_error"] = 0.5  # worse on validation: it does not serve
    ms.publish(
        infra,
        settings.models_topic,
        ms.regressor_event(MODEL, 1, regressor, width=WIDTH, feature=FIELD),
        challenger,
    )
    window = FeatureWindow(window_key=f"sensor-9/temp/{unique}", entity_id="sensor-9", **STATS)
    client = redis.Redis.from_url(infra.redis.url)
    client.hset(f"{settings.online_key_prefix}sensor-9", FIELD, encode_window(window))
    client.close()
    server = ms.ServerThread(settings)
    try:
        for stub in ms.stub(server.address):
            served = [stub.ModelInfer(by_entity("sensor-9", f"shadowed-{i}")) for i in range(4)]
            named = pb.ModelInferRequest(model_name=MODEL, model_version="1", id="named-1")
            named.parameters["entity_id"].string_param = "sensor-9"
            direct = stub.ModelInfer(named)
            ms.wait_for(
                lambda: server.metric("aistack_model_shadow_runs_total", model=MODEL, outcome="ok")
                == 4,
                30,
                "the four shadow runs",
            )
            # The monitor's decision on live traffic: the challenger's event
            # again, labelled. The same bytes serve at once, nothing reloads,
            # and the version it displaced runs in its shadow.
            ms.publish(infra, settings.models_topic, decided(challenger, 1, newest=2))
            ms.wait_for(
                lambda stub=stub: stub.ModelInfer(by_entity("sensor-9", "after")).model_version
                == "2",
                30,
                "the decision's version to serve",
            )
            ms.wait_for(
                lambda: server.metric("aistack_model_shadow_runs_total", model=MODEL, outcome="ok")
                > 4,
                30,
                "the displaced champion's shadow runs",
            )
            assert server.metric("aistack_model_loads_total", model=MODEL) == 2
    finally:
        server.stop()
    # What the caller got: the champion's answer, as a request naming it gets it.
    assert {r.model_version for r in served} == {"1"}
    champion_values = list(direct.outputs[0].contents.fp32_contents)
    assert all(list(r.outputs[0].contents.fp32_contents) == champion_values for r in served)

    logged = read_to_end(infra.kafka, settings.prediction_log_topic, PredictionLogged, 30)
    records = [p for p in (r.decode() for r in logged) if p.request_id.startswith("shadowed-")]
    roles = sorted((p.request_id, p.model_version, p.role) for p in records)
    assert roles == sorted(
        [(f"shadowed-{i}", "1", PREDICTION_ROLE_CHAMPION) for i in range(4)]
        + [(f"shadowed-{i}", "2", PREDICTION_ROLE_SHADOW) for i in range(4)]
    )
    shadow = next(p for p in records if p.role == PREDICTION_ROLE_SHADOW)
    assert shadow.entity_id == "sensor-9" and shadow.window_key == window.window_key
    assert shadow.outputs[0].name == "prediction" and len(shadow.outputs[0].values) == 1
    assert PREDICTION_ROLE_NAMED not in {p.role for p in records}  # named: not sampled here
