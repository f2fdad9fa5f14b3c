"""The whole flow on the real stack, in secure mode (``aistack up --secure``:
every service its own Kafka principal and Redis user under ACLs, TLS
everywhere, the gRPC servers with a token) with every file on the object
store (``--object-store``: the offline store, svc_transform's checkpoints,
the trainers' artifacts, checkpoints and TensorBoard runs on its bucket): a
raw event from a plain Kafka client to the clean topic, the windows, the
offline and online stores; a small study through the trainers; its best
model served; a prediction over gRPC; a prediction by entity traced back to
the raw offset under it; and the offline store scored in batch, from the
bucket to the bucket."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
import numpy as np
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from aistack.studies import load_spec
from compose.object_store import BUCKET
from compose.stack import ServiceStack
from shared import model_registry
from shared.bus.consumer import BusTail
from shared.bus.topics import EVENTS_CLEAN, EVENTS_RAW, FEATURES_WINDOWS, MODELS_READY
from shared.contracts.aistack.v1 import events_pb2, features_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub
from shared.contracts.inference import grpc_predict_v2_pb2 as pb
from shared.contracts.inference import grpc_predict_v2_pb2_grpc as pb_grpc
from shared.errors import NotFound
from shared.feature_store import ONLINE_KEY_PREFIX, decode_window, online_key
from shared.object_store import filesystem
from shared.redis_client import make_redis
from shared.rpc.client import open_sync_channel
from shared.settings import KafkaSettings
from svc_trainer.data.datasets import load
from svc_transform.job import SINGLE_QUERY_CHECKPOINT
from tests.integration.test_stack import settings_on_free_ports

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

T = TypeVar("T")

FEATURE = "temperature@tumbling-60s"
STUDY = """
name: e2e-digits-{run}
objective: {{metric: val_error, direction: DIRECTION_MINIMIZE}}
params:
  - name: learning_rate
    categorical: {{choices: [{{float_value: 0.003}}, {{float_value: 0.01}}]}}
sampler: {{kind: SAMPLER_KIND_GRID}}
pruner: {{kind: PRUNER_KIND_NONE}}
budget: {{max_trials: 2, max_parallel: 2, time_limit: 600s, trial_timeout: 300s}}
task:
  dataset: digits
  model_family: cnn
  framework: FRAMEWORK_TORCH
  strategy: single
  epochs: 4
  model_name: e2e-digits-{run}
seed: 3
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    settings = settings_on_free_ports(tmp_path_factory.mktemp("e2e-state"))
    secure = settings.infra.model_copy(update={"secure": True, "object_store": True})
    running = ServiceStack(settings.model_copy(update={"infra": secure}))
    try:
        running.up()
        yield running
    finally:
        running.down()


def eventually(what: str, probe: Callable[[], T | None], timeout: float, stack: ServiceStack) -> T:
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None:
            return result
        dead = [s for s in stack.status() if s.state != "running"]
        assert not dead, f"{dead[0].name} died:\n{dead[0].last_lines}"
        assert time.monotonic() < deadline, f"timed out after {timeout} s: {what}"
        time.sleep(1.0)


def offline_rows(stack: ServiceStack, entity: str, columns: list[str] | None = None) -> Any:
    """The entity's rows in the stack's offline store (on its bucket: a
    pyarrow Table), or None while the store has no files yet."""
    import pyarrow.dataset as ds

    from shared.offline_store import OfflineStoreError, open_store

    try:
        store = open_store(stack.offline_store(), stack.object_store_settings())
    except OfflineStoreError:
        return None
    if "entity_id" not in store.schema.names:
        return None  # the directory is there, its first files are not yet
    return store.to_table(filter=ds.field("entity_id") == entity, columns=columns)


def find(kafka: KafkaSettings, topic: str, cls: Any, match: Callable[[Any], bool]) -> Any:
    """The first record of ``topic`` whose message matches, read from the start."""
    tail = BusTail(kafka, topics=[topic], message_cls=cls, from_beginning=True)
    try:
        while not tail.caught_up():
            for record in tail.poll_batch(500, timeout=0.5):
                message = record.decode()
                if match(message):
                    return message
    finally:
        tail.close()
    return None


FORECAST = """
name: e2e-forecast-{run}
objective: {{metric: val_mae, direction: DIRECTION_MINIMIZE}}
params:
  - name: units
    categorical: {{choices: [{{int_value: 16}}]}}
sampler: {{kind: SAMPLER_KIND_GRID}}
pruner: {{kind: PRUNER_KIND_NONE}}
budget: {{max_trials: 1, max_parallel: 1, time_limit: 600s, trial_timeout: 300s}}
task:
  dataset: features
  model_family: mlp
  framework: FRAMEWORK_TORCH
  strategy: single
  epochs: 3
  model_name: e2e-forecast-{run}
  options: {{metric: temperature, window: tumbling-60s, lags: "1"}}
seed: 3
"""
MINUTES = 15


def test_a_prediction_by_entity_is_traced_to_the_raw_offset_under_it(
    stack: ServiceStack,
) -> None:
    """One raw reading with a known offset becomes a window; a model trained
    on the offline store that holds it serves a prediction by entity from
    that window; ``aistack lineage`` names the reading's offset."""
    from aistack.lineage import trace
    from aistack.settings import LineageSettings

    kafka = stack.client_kafka()
    run = uuid.uuid4().hex[:6]
    entities = [f"lineage-{run}-{i}" for i in range(2)]
    traced = entities[0]
    # All before the next test's reading (5 minutes before its start): this
    # test runs first, and its watermark must not make that reading late.
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=MINUTES + 9)
    producer = Producer(kafka.client_config())
    positions: dict[str, tuple[int, int]] = {}

    def delivered(error: Any, record: Any) -> None:
        assert error is None, error
        positions[record.key().decode()] = (record.partition(), record.offset())

    # A reading a minute per entity; the traced one's last reading is the
    # one whose offset the lineage must name: its window is the entity's
    # latest, the one a prediction by entity is fed.
    for minute in range(MINUTES):
        for i, entity in enumerate(entities):
            reading = {
                "event_id": str(uuid.uuid4()),
                "device_id": entity,
                "timestamp": (start + timedelta(minutes=minute, seconds=20)).isoformat(),
                "metrics": {"temperature": {"value": 18.0 + i + (minute % 5), "unit": "C"}},
            }
            producer.produce(EVENTS_RAW, json.dumps(reading).encode(), key=entity.encode())
    last_reading = {
        "event_id": str(uuid.uuid4()),
        "device_id": traced,
        "timestamp": (start + timedelta(minutes=MINUTES, seconds=20)).isoformat(),
        "metrics": {"temperature": {"value": 21.0, "unit": "C"}},
    }
    producer.produce(
        EVENTS_RAW, json.dumps(last_reading).encode(), key=traced.encode(), on_delivery=delivered
    )
    # Another device's reading two minutes on: the watermark passes every
    # window above.
    later_device = f"lineage-{run}-later"
    later = {**last_reading, "event_id": str(uuid.uuid4()), "device_id": later_device}
    later["timestamp"] = (start + timedelta(minutes=MINUTES + 2)).isoformat()
    producer.produce(EVENTS_RAW, json.dumps(later).encode(), key=later_device.encode())
    assert producer.flush(30) == 0
    partition, offset = positions[traced]

    last_start = start + timedelta(minutes=MINUTES)
    window = eventually(
        "the traced reading's window",
        lambda: find(
            kafka,
            FEATURES_WINDOWS,
            features_pb2.FeatureWindow,
            lambda w: w.entity_id == traced
            and w.metric == "temperature"
            and w.window_start.ToDatetime(tzinfo=UTC) == last_start
            and w.window_size.seconds == 60,
        ),
        180,
        stack,
    )
    assert window.count == 1 and list(window.sources), window

    def stored() -> int | None:
        # The offline store is written beside Kafka, not before it: the study
        # must find the traced window there.
        rows = offline_rows(stack, traced, ["window_start"])
        if rows is None:
            return None
        starts = {value.replace(tzinfo=UTC) for value in rows.column(0).to_pylist()}
        return len(starts) if last_start in starts else None

    assert eventually("the traced window in the offline store", stored, 120, stack) >= MINUTES

    spec = load_spec(FORECAST.format(run=run))
    with stack.tuner().open_sync() as channel:
        tuner = TunerServiceStub(channel)  # type: ignore[no-untyped-call]
        study_id = tuner.CreateStudy(api.CreateStudyRequest(spec=spec)).study.study_id

        def finished() -> api.Study | None:
            study = tuner.GetStudy(api.GetStudyRequest(study_id=study_id)).study
            return None if study.state == api.STUDY_STATE_RUNNING else study

        study = eventually("the forecast study", finished, 600, stack)
    assert study.state == api.STUDY_STATE_COMPLETED, study
    best = study.best_trial

    with stack.model().open_sync() as channel:
        model = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]

        refusals: list[str] = []

        def predicted() -> pb.ModelInferResponse | None:
            request = pb.ModelInferRequest(model_name=best.model_name)
            request.parameters["entity_id"].string_param = traced
            try:
                response: pb.ModelInferResponse = model.ModelInfer(request, timeout=30)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
                refusals.append(exc.details() or "")
                return None
            return response

        try:
            response = eventually("a prediction by entity", predicted, 180, stack)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the server said: {refusals[-1:]}") from exc
    request_id = response.parameters["request_id"].string_param
    assert request_id and response.id == request_id

    settings = LineageSettings(kafka=kafka, object_store=stack.object_store_settings())

    def traced_tree() -> dict[str, Any] | None:
        try:
            return trace(settings, request_id).to_json()
        except NotFound:
            return None  # the log is sent in the background

    tree = eventually("the prediction on the log", traced_tree, 30, stack)
    (window_node,) = [node for node in tree["from"] if node["title"].startswith("feature window")]
    assert window_node["entity_id"] == traced and window_node["window_key"] == window.window_key
    raw = [
        entry
        for node in _nodes(window_node)
        for entry in node.get("raw", [])
        if entry["topic"] == EVENTS_RAW and entry["partition"] == partition
    ]
    assert raw and offset in raw[0]["offsets"], json.dumps(tree, indent=1)[:4000]

    # The model's artifact is on the bucket, and so is the store it learnt
    # from: `aistack score` reads the one and the other and writes its
    # predictions there too.
    registry = model_registry.read(kafka, MODELS_READY, 60)
    ready = registry.version(best.model_name, best.model_version, "champion")
    assert ready.artifact_uri.startswith(f"s3://{BUCKET}/artifacts/"), ready.artifact_uri
    assert stack.offline_store().startswith(f"s3://{BUCKET}/")
    output = f"s3://{BUCKET}/scores/{run}"
    command = [sys.executable, "-m", "aistack.cli", "score", best.model_name]
    command += ["--input", stack.offline_store(), "--output", output]
    env = {**os.environ, **stack.client_env(), "AISTACK_SPARK_MASTER": "local[2]"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    fs, scores = filesystem(output, stack.object_store_settings())
    lineage = json.loads(fs.cat_file(f"{scores}/_lineage.json"))
    assert lineage["version"] == best.model_version and lineage["rows"] >= MINUTES, lineage
    assert [p for p in fs.ls(scores, detail=False) if p.endswith(".parquet")]


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("from", []):
        yield from _nodes(child)


def test_a_raw_event_becomes_features_and_a_study_becomes_a_served_model(
    stack: ServiceStack, tmp_path: Path
) -> None:
    kafka = stack.client_kafka()
    entity = f"e2e-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)

    # Nothing answers in the clear.
    with pytest.raises(KafkaException):
        AdminClient({"bootstrap.servers": stack.kafka_bootstrap}).list_topics(timeout=3)
    with pytest.raises(grpc.RpcError) as untokened:
        with open_sync_channel(stack.tuner_target, tls_ca_file=stack.tuner().tls_ca_file) as bare:
            TunerServiceStub(bare).GetStudy(api.GetStudyRequest(study_id="none"), timeout=10)  # type: ignore[no-untyped-call]
    assert untokened.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # A device that knows nothing of aistack: JSON, by a plain Kafka client.
    producer = Producer(kafka.client_config())
    reading: dict[str, Any] = {
        "event_id": str(uuid.uuid4()),
        "device_id": entity,
        "timestamp": (now - timedelta(minutes=5)).isoformat(),
        "metrics": {"temperature": {"value": 21.5, "unit": "C"}},
        "attributes": {"site": "e2e"},
    }
    producer.produce(EVENTS_RAW, json.dumps(reading).encode(), key=entity.encode())
    # A later reading of another device moves the watermark past the first's window.
    later: dict[str, Any] = {
        **reading,
        "event_id": str(uuid.uuid4()),
        "device_id": f"{entity}-later",
    }
    later["timestamp"] = now.isoformat()
    producer.produce(EVENTS_RAW, json.dumps(later).encode(), key=later["device_id"].encode())
    assert producer.flush(30) == 0

    clean = eventually(
        "the clean event",
        lambda: find(kafka, EVENTS_CLEAN, events_pb2.CleanEvent, lambda e: e.entity_id == entity),
        120,
        stack,
    )
    assert clean.event_id == reading["event_id"]
    window = eventually(
        "the feature window",
        lambda: find(
            kafka,
            FEATURES_WINDOWS,
            features_pb2.FeatureWindow,
            lambda w: w.entity_id == entity and w.metric == "temperature",
        ),
        180,
        stack,
    )
    assert window.count == 1 and window.mean == pytest.approx(21.5)

    redis = make_redis(stack.client_redis())
    try:
        online = eventually(
            "the online store",
            lambda: cast(bytes | None, redis.hget(online_key(ONLINE_KEY_PREFIX, entity), FEATURE)),
            60,
            stack,
        )
    finally:
        redis.close()
    assert decode_window(online).mean == pytest.approx(21.5)

    def entity_rows() -> int | None:
        table = offline_rows(stack, entity)
        return None if table is None else table.num_rows or None

    assert eventually("the offline store", entity_rows, 60, stack) >= 1

    # A small study through the trainers; its best model, served.
    spec = load_spec(STUDY.format(run=uuid.uuid4().hex[:6]))
    with stack.tuner().open_sync() as channel:
        tuner = TunerServiceStub(channel)  # type: ignore[no-untyped-call]
        study_id = tuner.CreateStudy(api.CreateStudyRequest(spec=spec)).study.study_id

        def finished() -> api.Study | None:
            study = tuner.GetStudy(api.GetStudyRequest(study_id=study_id)).study
            return None if study.state == api.STUDY_STATE_RUNNING else study

        study = eventually("the study", finished, 600, stack)
    assert study.state == api.STUDY_STATE_COMPLETED
    assert dict(study.trial_counts) == {"completed": 2}
    best = study.best_trial
    data = load("digits", {}, seed=0)
    with stack.model().open_sync() as channel:
        model = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]

        def predict(x: np.ndarray) -> pb.ModelInferResponse:
            request = pb.ModelInferRequest(model_name=best.model_name)
            tensor = request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
            tensor.contents.fp32_contents.extend(x.ravel().tolist())
            response: pb.ModelInferResponse = model.ModelInfer(request, timeout=30)
            return response

        def served() -> pb.ModelInferResponse | None:
            try:
                response = predict(data.x_train[:1])
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
                return None
            return response if response.model_version == best.model_version else None

        eventually("the best model served", served, 120, stack)
        # A digit the model has seen, then held-out ones.
        known = predict(data.x_train[:1])
        assert np.argmax(known.outputs[0].contents.fp32_contents) == data.y_train[0]
        response = predict(data.x_test[:60])
        probabilities = np.asarray(response.outputs[0].contents.fp32_contents).reshape(60, 10)
        accuracy = float((probabilities.argmax(axis=1) == data.y_test[:60]).mean())
    assert accuracy >= 0.85


def test_the_demos_events_flow_twice_on_one_state(stack: ServiceStack) -> None:
    """Each run of the demo sends readings of the past hour; the run before
    left svc_transform's watermark past them, so the second begins a fresh
    event-time epoch and gets as many windows as the first, rather than
    seeing its readings dropped as late (all but the last minute's). Runs
    last: it moves the offline store aside."""
    import io

    from demo.console import Console
    from demo.run import Demo, DemoOptions

    args = DemoOptions(sensor_events=1_200, weblog_events=200)
    fs, epochs = filesystem(f"s3://{BUCKET}/transform/epochs", stack.object_store_settings())
    windows, said = [], []
    for _ in range(2):
        out = io.StringIO()
        demo = Demo(stack, Console(out), args)
        demo.events()  # raises ServiceDied, saying why, when no window comes
        windows.append(int(dict(demo.summary.rows)["feature windows"]))
        said.append(out.getvalue())
    assert "starts a fresh event-time epoch" in said[1], said[1]
    assert windows[1] >= 0.8 * windows[0] > 0, (windows, said)
    # Moved aside on the bucket, where the stack keeps them.
    archived = sorted(fs.ls(epochs, detail=False, refresh=True))[-1]
    assert fs.find(f"{archived}/checkpoint/{SINGLE_QUERY_CHECKPOINT}/offsets")
    assert fs.find(f"{archived}/offline")
    assert f"s3://{archived}" in said[1]


def test_the_whole_stack_under_chaos_loses_nothing_and_doubles_nothing(
    stack: ServiceStack,
) -> None:
    """``bench.chaos`` with a short load: under a steady load of readings
    and a study, svc_tuner, a trainer, svc_ingest, svc_transform, svc_model
    and svc_monitor are killed with SIGKILL one after another and restarted,
    then the broker and Redis; every reading, window, trial and prediction
    is accounted for. Runs last: it kills everything. Its readings are
    stamped six minutes back, later than any the tests before it sent (the
    demo's end twenty minutes back), so none is late."""
    from bench.chaos import run_chaos

    result = run_chaos(stack, rate=100, epochs=4, trials=2, settle=1.0, say=print)
    tally = result.tally
    assert tally.lost_or_doubled == 0, tally.problems
    assert result.sent > 0 and tally.windows > 0 and result.traffic.answered > 0
    assert [b.service for b in result.back] == [
        "svc_tuner",
        "svc_trainer-1",
        "svc_ingest",
        "svc_transform",
        "svc_model",
        "svc_monitor",
        "kafka",
        "redis",
    ]
    down = [(s.name, s.state, s.last_lines) for s in stack.status() if s.state != "running"]
    assert not down, down
