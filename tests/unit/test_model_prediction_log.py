"""The prediction log without a broker: records built from served predictions,
sampling, and what is dropped (and counted) instead of waited for."""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Iterator

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from shared.contracts.aistack.v1.common_pb2 import OffsetRange
from shared.contracts.aistack.v1.features_pb2 import FeatureWindow
from shared.contracts.aistack.v1.predictions_pb2 import PredictionLogged
from shared.contracts.inference import grpc_predict_v2_pb2 as pb
from shared.errors import ConfigError
from shared.settings import KafkaSettings, load_settings
from svc_model.metrics import ModelMetrics
from svc_model.prediction_log import (
    CHUNK,
    DELIVERY_FAILED,
    DRAIN_INTERVAL_S,
    QUEUE_FULL,
    SHUTDOWN,
    KafkaSink,
    Prediction,
    PredictionLog,
    Sampler,
    build_record,
    inputs_sha256,
)
from svc_model.settings import ModelSettings
from svc_model.tensors import TensorSig, decode_inputs
from tests.seeding import after_the_same_seed

SIGNATURE = [TensorSig("input", "FP32", (-1, 3)), TensorSig("ids", "INT64", (-1,))]
OUTPUTS = {"scores": np.array([[0.25, 0.75]], dtype=np.float32), "label": np.array([1])}


def request(x: np.ndarray, ids: list[int], *, raw: bool) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="m")
    a = r.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    b = r.inputs.add(name="ids", datatype="INT64", shape=[len(ids)])
    if raw:
        r.raw_input_contents.append(x.astype("<f4").tobytes())
        r.raw_input_contents.append(np.asarray(ids, "<i8").tobytes())
    else:
        a.contents.fp32_contents.extend(x.ravel().tolist())
        b.contents.int64_contents.extend(ids)
    return r


def by_tensors(r: pb.ModelInferRequest, **fields: object) -> Prediction:
    values: dict[str, object] = {
        "request_id": "req-1",
        "model_name": "m",
        "model_version": "3",
        "served_ns": 1_700_000_000_123_456_789,
        "latency_us": 812,
        "outputs": OUTPUTS,
        "output_names": ("scores",),
        "tensors": r.inputs,
        "arrays": decode_inputs(r, SIGNATURE),
    }
    values.update(fields)
    return Prediction(**values)  # type: ignore[arg-type]


def window() -> FeatureWindow:
    w = FeatureWindow(window_key="sensor-7/temp/60s/1700000000", entity_id="sensor-7")
    w.metric = "temperature"
    w.dimensions["site"] = "roof"
    w.window_start.FromSeconds(1_700_000_000)
    w.window_end.FromSeconds(1_700_000_060)
    w.sources.add(topic="aistack.events.clean", partition=2, min_offset=40, max_offset=51, count=9)
    w.sources.add(topic="aistack.events.clean", partition=5, min_offset=7, max_offset=7, count=1)
    return w


def by_entity(entity_id: str = "sensor-7") -> Prediction:
    return Prediction(
        request_id="req-2",
        model_name="forecast",
        model_version="1",
        served_ns=5_000_000_001,
        latency_us=90,
        outputs={"prediction": np.array([[21.5]], dtype=np.float32)},
        output_names=("prediction",),
        entity_id=entity_id,
        window=window(),
    )


X = np.array([[1.0, 2.5, -3.0]], dtype=np.float32)


def test_a_record_by_tensors_names_its_inputs_by_digest_and_carries_its_outputs() -> None:
    record = build_record(by_tensors(request(X, [4, 5], raw=False)))
    assert (record.request_id, record.model_name, record.model_version) == ("req-1", "m", "3")
    assert record.served_time.ToNanoseconds() == 1_700_000_000_123_456_789
    assert record.latency_us == 812
    assert not record.entity_id and not record.window_key and not record.window_sources
    # Only the outputs the response returned, flattened to doubles.
    assert [(o.name, list(o.values)) for o in record.outputs] == [("scores", [0.25, 0.75])]
    # The digest, computed by hand from the documented framing.
    expected = hashlib.sha256()
    for name, datatype, shape, data in (
        ("input", "FP32", [1, 3], X.astype("<f4").tobytes()),
        ("ids", "INT64", [2], np.array([4, 5], "<i8").tobytes()),
    ):
        for text in (name.encode(), datatype.encode()):
            expected.update(struct.pack("<I", len(text)) + text)
        expected.update(struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}q", *shape))
        expected.update(struct.pack("<Q", len(data)) + data)
    assert record.inputs_sha256 == expected.hexdigest()


def test_typed_and_raw_contents_of_the_same_values_digest_the_same() -> None:
    typed = build_record(by_tensors(request(X, [4, 5], raw=False))).inputs_sha256
    raw = build_record(by_tensors(request(X, [4, 5], raw=True))).inputs_sha256
    assert typed == raw
    other_value = build_record(by_tensors(request(X + 1, [4, 5], raw=True))).inputs_sha256
    other_shape = build_record(by_tensors(request(X.reshape(3, 1).T, [4, 5], raw=True)))
    other_ids = build_record(by_tensors(request(X, [5, 4], raw=False))).inputs_sha256
    assert len({typed, other_value, other_ids}) == 3
    assert other_shape.inputs_sha256 == typed  # the same [1, 3] values: the same digest


def test_the_digest_separates_names_from_datatypes() -> None:
    one = inputs_sha256([("ab", "c", [1], b"x")])
    two = inputs_sha256([("a", "bc", [1], b"x")])
    assert one != two


def test_a_record_by_entity_carries_the_window_it_read() -> None:
    record = build_record(by_entity())
    assert record.entity_id == "sensor-7"
    assert record.window_key == "sensor-7/temp/60s/1700000000"
    assert (record.window_metric, dict(record.window_dimensions)) == (
        "temperature",
        {"site": "roof"},
    )
    assert record.window_start.seconds == 1_700_000_000
    assert record.window_end.seconds == 1_700_000_060
    assert list(record.window_sources) == [
        OffsetRange(
            topic="aistack.events.clean", partition=2, min_offset=40, max_offset=51, count=9
        ),
        OffsetRange(topic="aistack.events.clean", partition=5, min_offset=7, max_offset=7, count=1),
    ]
    assert not record.inputs_sha256
    assert [(o.name, list(o.values)) for o in record.outputs] == [("prediction", [21.5])]


def test_bytes_outputs_keep_their_name_and_no_values() -> None:
    words = np.array([b"cat", b"dog"], dtype=object)
    prediction = by_tensors(
        request(X, [1], raw=False), outputs={"words": words}, output_names=("words",)
    )
    [output] = build_record(prediction).outputs
    assert output.name == "words" and not output.values


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64", "uint8", "bool"])
def test_numeric_outputs_are_logged_as_the_doubles_of_their_values(dtype: str) -> None:
    served = np.array([[0.1, 2.5, -3.0], [7.0, 0.0, 1.0]]).astype(dtype)
    prediction = by_tensors(
        request(X, [1], raw=False), outputs={"out": served}, output_names=("out",)
    )
    [output] = build_record(prediction).outputs
    assert list(output.values) == [float(value) for value in served.ravel()]


def test_sampling_follows_each_kind_of_request_its_own_fraction() -> None:
    draws = iter([0.0, 0.5, 0.99, 0.05, 0.1, 0.999999])
    sampler = Sampler(entity_fraction=1.0, tensor_fraction=0.1, draw=lambda: next(draws))
    assert [sampler.wants(True) for _ in range(3)] == [True, True, True]
    assert [sampler.wants(False) for _ in range(3)] == [True, False, False]
    assert Sampler(0.0, 0.0).on is False and Sampler(0.0, 0.5).on is True
    never = Sampler(0.0, 0.0, draw=lambda: 0.0)
    assert not never.wants(True) and not never.wants(False)


class FakeSink:
    def __init__(self, refuse_after: int | None = None, reason: str = QUEUE_FULL) -> None:
        self.sent: list[tuple[str, PredictionLogged]] = []
        self.refuse_after = refuse_after
        self.reason = reason
        self.left = 0
        self.served = 0

    def send(self, key: str, value: bytes) -> str | None:
        if self.refuse_after is not None and len(self.sent) >= self.refuse_after:
            return self.reason
        self.sent.append((key, PredictionLogged.FromString(value)))
        return None

    def serve(self) -> None:
        self.served += 1

    def flush(self, timeout: float) -> int:
        return self.left


class Counted:
    """svc_model's metrics on a registry of their own, read back by name."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = ModelMetrics.create(self.registry)

    def logged(self) -> float:
        return self._sample("aistack_model_predictions_logged_total")

    def dropped(self, reason: str) -> float:
        return self._sample("aistack_model_prediction_log_dropped_total", reason=reason)

    def _sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def counted() -> Counted:
    return Counted()


def make_log(
    sink: FakeSink, counted: Counted, capacity: int = 100, interval: float = DRAIN_INTERVAL_S
) -> PredictionLog:
    metrics = counted.metrics
    return PredictionLog(
        sink,
        Sampler(1.0, 1.0),
        capacity=capacity,
        logged=metrics.predictions_logged,
        dropped=metrics.prediction_log_dropped,
        interval=interval,
    )


def test_records_are_keyed_by_entity_else_by_model(counted: Counted) -> None:
    sink = FakeSink()
    log = make_log(sink, counted)
    log.offer(by_entity("sensor-9"))
    log.offer(by_tensors(request(X, [1], raw=False)))
    assert not sink.sent  # nothing is built on the request path
    assert log.drain() == 2
    assert [(key, r.request_id) for key, r in sink.sent] == [("sensor-9", "req-2"), ("m", "req-1")]
    assert counted.logged() == 2 and sink.served == 1


def test_a_full_queue_drops_and_counts_instead_of_waiting(counted: Counted) -> None:
    sink = FakeSink()
    log = make_log(sink, counted, capacity=3)
    for _ in range(5):
        log.offer(by_entity())
    assert counted.dropped(QUEUE_FULL) == 2
    assert log.drain() == 3
    # The producer's own queue full (or a failed producer): dropped by its reason.
    full = FakeSink(refuse_after=1)
    failing = FakeSink(refuse_after=0, reason=DELIVERY_FAILED)
    for sink_ in (full, failing):
        log = make_log(sink_, counted)
        for _ in range(3):
            log.offer(by_entity())
        log.drain()
    assert counted.dropped(QUEUE_FULL) == 2 + 2
    assert counted.dropped(DELIVERY_FAILED) == 3
    assert counted.logged() == 3 + 1


def test_close_publishes_what_is_queued_and_counts_what_was_not_delivered(
    counted: Counted,
) -> None:
    async def started_then_closed() -> None:
        log.start(asyncio.get_running_loop())
        log.offer(by_entity())
        log.close(timeout=1)

    sink = FakeSink()
    sink.left = 2
    log = make_log(sink, counted)
    asyncio.run(started_then_closed())
    assert len(sink.sent) == 1
    assert counted.dropped(SHUTDOWN) == 2


def test_the_loop_publishes_a_chunk_a_turn_and_other_callbacks_run_between(
    counted: Counted,
) -> None:
    """What queued is published without anyone draining, and a backlog goes
    out a chunk at a time with the loop's other work between the chunks."""
    sink = FakeSink()
    log = make_log(sink, counted, capacity=1_000, interval=0.01)
    sent_at_each_tick: list[int] = []

    async def serve_a_backlog() -> None:
        log.start(asyncio.get_running_loop())
        for _ in range(3 * CHUNK + 1):
            log.offer(by_entity())
        while len(sink.sent) < 3 * CHUNK + 1:
            sent_at_each_tick.append(len(sink.sent))
            await asyncio.sleep(0)
        log.close(timeout=1)

    asyncio.run(asyncio.wait_for(serve_a_backlog(), timeout=10))
    published = sorted(set(sent_at_each_tick) - {0})
    assert published[:3] == [CHUNK, 2 * CHUNK, 3 * CHUNK]
    assert counted.logged() == 3 * CHUNK + 1


def test_an_unbuildable_record_is_dropped_not_raised(counted: Counted) -> None:
    sink = FakeSink()
    log = make_log(sink, counted)
    log.offer(by_tensors(request(X, [1], raw=False), output_names=("missing",)))
    log.offer(by_entity())
    assert log.drain() == 1
    assert counted.dropped("unencodable") == 1


@pytest.fixture
def away_sink() -> Iterator[KafkaSink]:
    # Port 1 on localhost: nothing listens, the producer never connects.
    kafka = KafkaSettings(bootstrap="127.0.0.1:1")
    sink = KafkaSink(kafka, "aistack.predictions", capacity=3, failed=lambda: None)
    yield sink
    sink.flush(0)


def test_the_kafka_sink_drops_instead_of_blocking_when_its_queue_is_full(
    away_sink: KafkaSink,
) -> None:
    results = [away_sink.send("k", b"v") for _ in range(5)]
    assert results == [None, None, None, QUEUE_FULL, QUEUE_FULL]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AISTACK_MODEL_PREDICTION_LOG_ENTITY_FRACTION", "1.5"),
        ("AISTACK_MODEL_PREDICTION_LOG_TENSOR_FRACTION", "-0.1"),
    ],
)
def test_a_fraction_outside_zero_to_one_stops_start_up_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings(ModelSettings)
    assert variable in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1


def test_the_predictions_topic_is_ensured_only_while_the_log_is_on() -> None:
    on = ModelSettings(prediction_log_topic="preds-x")
    off = ModelSettings(prediction_log_entity_fraction=0, prediction_log_tensor_fraction=0)
    assert "preds-x" in [spec.name for spec in on.topic_specs()]
    assert not off.prediction_log_on()
    assert "aistack.predictions" not in [spec.name for spec in off.topic_specs()]


def test_sampling_does_not_follow_a_seed_given_to_the_random_module() -> None:
    def samples() -> list[bool]:
        sampler = Sampler(0.5, 0.5)
        return [sampler.wants(by_entity=True) for _ in range(64)]

    first, second = after_the_same_seed(samples, seed=11)
    assert first != second  # equal by chance once in 2^64
