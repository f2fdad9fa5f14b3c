"""The prediction log: each sampled prediction svc_model serves, as a
``PredictionLogged`` on ``aistack.predictions`` (keyed by entity id, else by
model name), for lineage and drift.

The log never blocks or fails a request. The request path only decides
whether to sample and appends the served prediction to a bounded in-memory
queue (no lock, no encoding); the event loop builds the records between
requests, a chunk at a time, serializes them and hands them to a Kafka
producer whose own local queue is bounded too. Not a thread of its own: it
would run Python under the same GIL as the loop, and an unbatched server,
whose loop holds the GIL through every request, paid 0.05-0.2 ms of CPU a
request more for the hand-overs than for the same work done on the loop.
Whatever cannot be kept is dropped and counted by reason
(``aistack_model_prediction_log_dropped_total{reason}``):

- ``queue_full``: either queue is full (Kafka slow or away);
- ``delivery_failed``: the producer gave up on a record (broker away for
  longer than ``DELIVERY_TIMEOUT_MS``, a fatal producer error);
- ``unencodable``: a record could not be built (a bug: logged once);
- ``shutdown``: still undelivered when the server stopped.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import random
import struct
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import Message as KafkaMessage
from numpy.typing import NDArray
from prometheus_client import Counter

from shared.bus import envelope
from shared.bus.codec import type_name
from shared.bus.producer import PRODUCER_DEFAULTS
from shared.contracts.aistack.v1.features_pb2 import FeatureWindow
from shared.contracts.aistack.v1.predictions_pb2 import (
    PREDICTION_ROLE_CHAMPION,
    PredictionLogged,
)
from shared.contracts.inference import grpc_predict_v2_pb2 as pb
from shared.log import get_logger
from shared.settings import KafkaSettings
from svc_model.tensors import raw_bytes

log = get_logger("svc_model")

QUEUE_FULL = "queue_full"
DELIVERY_FAILED = "delivery_failed"
UNENCODABLE = "unencodable"
SHUTDOWN = "shutdown"
DROP_REASONS = (QUEUE_FULL, DELIVERY_FAILED, UNENCODABLE, SHUTDOWN)

#: A record the broker has not taken within this long is dropped
#: (delivery_failed): a prediction log hours late is of little use, and the
#: memory is better spent on the records behind it.
DELIVERY_TIMEOUT_MS = 30_000
#: How long the log's producer gathers records before it sends them. The
#: log's readers (a prediction's lineage, asked for by a person) wait a
#: half second without noticing; the broker's work per produce request is
#: what the log cost when it shared the cores with the server (5 ms,
#: the bus's default: a request per drain and partition, 0.79 of the
#: throughput with the log off in bench.serving; 500 ms: 1.00, the broker's
#: CPU time in the run down from 4.9 s to 3.1 s).
LINGER_MS = 500
#: How often the loop publishes what queued meanwhile: one turn per many
#: records, not one per request.
DRAIN_INTERVAL_S = 0.05
#: Records built in one turn of the event loop (15-40 µs each): a request
#: that arrives meanwhile waits for at most this many, about a millisecond.
CHUNK = 32

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


# Not frozen: a frozen dataclass sets each field through object.__setattr__,
# three times the cost of this one's, on the request path.
@dataclass(slots=True)
class Prediction:
    """What the request path hands to the log: references only, no copies;
    nobody changes one once it is offered.

    ``tensors`` are the request's input tensors (requests with tensors) and
    ``arrays`` their decoded values by name; ``window`` is the feature window
    a request by entity was fed. ``outputs`` holds the served arrays, of which
    ``output_names`` were returned, in response order."""

    request_id: str
    model_name: str
    model_version: str
    served_ns: int
    latency_us: int
    outputs: Mapping[str, NDArray[Any]]
    output_names: tuple[str, ...]
    entity_id: str = ""
    window: FeatureWindow | None = None
    tensors: Sequence[pb.ModelInferRequest.InferInputTensor] = ()
    arrays: Mapping[str, NDArray[Any]] | None = None
    role: int = PREDICTION_ROLE_CHAMPION


def inputs_sha256(tensors: Iterable[tuple[str, str, Sequence[int], bytes]]) -> str:
    """sha256 over (name, datatype, shape, bytes) of each input tensor, in
    request order. The bytes are the tensor's Open Inference Protocol raw
    encoding (little-endian, row-major; BYTES elements each prefixed by a
    4-byte length), so typed and raw contents of the same values digest the
    same. Each string and the bytes are length-prefixed (u32 and u64,
    little-endian) and the shape is its rank (u32) then its dims (i64)."""
    framed: list[bytes] = []
    for name, datatype, shape, data in tensors:
        framed += (_framing(name, datatype, tuple(shape)), _U64.pack(len(data)), data)
    # One call over the joined bytes: a tensor's are a few hundred bytes, and
    # each update is a call of its own.
    return hashlib.sha256(b"".join(framed)).hexdigest()


@functools.lru_cache(maxsize=1024)
def _framing(name: str, datatype: str, shape: tuple[int, ...]) -> bytes:
    # What precedes a tensor's bytes: the same for every request of a model
    # at one batch size, so built once (the log's thread holds the GIL for
    # every step it takes per record).
    parts: list[bytes] = []
    for text in (name.encode(), datatype.encode()):
        parts += (_U32.pack(len(text)), text)
    parts += (_U32.pack(len(shape)), struct.pack(f"<{len(shape)}q", *shape))
    return b"".join(parts)


def build_record(prediction: Prediction) -> PredictionLogged:
    """The ``PredictionLogged`` for one served prediction. Outputs are
    flattened (row-major) to doubles; outputs that are not numbers (BYTES)
    keep their name and no values."""
    record = PredictionLogged(
        request_id=prediction.request_id,
        model_name=prediction.model_name,
        model_version=prediction.model_version,
        entity_id=prediction.entity_id,
        latency_us=prediction.latency_us,
        role=prediction.role,  # type: ignore[arg-type]
    )
    # Set in place: a Timestamp built apart is copied in (the record is built
    # on the event loop, between requests, for every one logged).
    served = record.served_time
    served.seconds, served.nanos = divmod(prediction.served_ns, 1_000_000_000)
    window = prediction.window
    if window is not None:
        record.window_key = window.window_key
        record.window_sources.extend(window.sources)
        record.window_metric = window.metric
        record.window_dimensions.update(window.dimensions)
        record.window_start.CopyFrom(window.window_start)
        record.window_end.CopyFrom(window.window_end)
    if prediction.tensors and prediction.arrays is not None:
        arrays = prediction.arrays
        record.inputs_sha256 = inputs_sha256(
            (t.name, t.datatype, t.shape, raw_bytes(t.name, t.datatype, arrays[t.name]))
            for t in prediction.tensors
        )
    add_output = record.outputs.add
    for name in prediction.output_names:
        array = prediction.outputs[name]
        kind = array.dtype.kind
        if kind == "f":  # a float's Python value is its double, exactly
            add_output(name=name, values=array.ravel().tolist())
        elif kind in "biu":
            add_output(name=name, values=array.astype(np.float64).ravel().tolist())
        else:
            add_output(name=name)
    return record


def record_key(prediction: Prediction) -> str:
    return prediction.entity_id or prediction.model_name


class Sampler:
    """Which served predictions are logged: a fraction of the requests by
    entity, another of those with tensors (0: none, 1: all)."""

    __slots__ = ("_draw", "_entity", "_tensor")

    def __init__(
        self,
        entity_fraction: float,
        tensor_fraction: float,
        draw: Callable[[], float] | None = None,
    ) -> None:
        self._entity = entity_fraction
        self._tensor = tensor_fraction
        # A generator of its own: a caller's random.seed() must not decide.
        self._draw = draw if draw is not None else random.Random().random

    @property
    def on(self) -> bool:
        return self._entity > 0 or self._tensor > 0

    def wants(self, by_entity: bool) -> bool:
        # random() is in [0, 1): a fraction of 1 always samples, 0 never.
        return self._draw() < (self._entity if by_entity else self._tensor)


class Sink(Protocol):
    """Where serialized records go. ``send`` never waits: it returns a drop
    reason when the record cannot be queued, else None."""

    def send(self, key: str, value: bytes) -> str | None: ...

    def serve(self) -> None:
        """Serve delivery reports (failures are counted by the sink)."""

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for queued records; returns those left."""


class KafkaSink:
    """A confluent-kafka producer of its own (the service's producer blocks
    when its queue is full; this one drops), with a bounded local queue."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topic: str,
        *,
        capacity: int,
        failed: Callable[[], None],
        source: str = "svc_model",
    ) -> None:
        def on_delivery(error: KafkaError | None, record: KafkaMessage) -> None:
            if error is not None:
                failed()

        self._producer = Producer(
            {
                **kafka.client_config(),
                **PRODUCER_DEFAULTS,
                "queue.buffering.max.messages": capacity,
                "message.timeout.ms": DELIVERY_TIMEOUT_MS,
                "linger.ms": LINGER_MS,
                "on_delivery": on_delivery,
            }
        )
        self._topic = topic
        self._template = envelope.HeaderTemplate(type_name(PredictionLogged), source)

    def send(self, key: str, value: bytes) -> str | None:
        headers = self._template.fresh()
        try:
            self._producer.produce(self._topic, value, key, headers=headers)  # type: ignore[arg-type]
        except BufferError:
            return QUEUE_FULL
        except KafkaException:  # a fatal producer error: nothing will be delivered
            return DELIVERY_FAILED
        return None

    def serve(self) -> None:
        self._producer.poll(0)

    def flush(self, timeout: float) -> int:
        return int(self._producer.flush(timeout))


class PredictionLog:
    """The request path calls ``sampled`` and, when true, ``offer``; the
    event loop it was started on (``start``) builds and publishes, ``CHUNK``
    records a turn. ``close`` publishes what is queued, waits for delivery up
    to its timeout, and counts the rest as dropped."""

    def __init__(
        self,
        sink: Sink,
        sampler: Sampler,
        *,
        capacity: int,
        logged: Counter,
        dropped: Counter,
        interval: float = DRAIN_INTERVAL_S,
    ) -> None:
        self._sink = sink
        self.sampled = sampler.wants
        self._capacity = capacity
        self._pending: deque[Prediction] = deque()
        self._logged = logged
        self._dropped = dropped
        self._queue_full = dropped.labels(QUEUE_FULL)
        self._interval = interval
        self._next: asyncio.Handle | None = None
        self._reported_unencodable = False

    @classmethod
    def to_kafka(
        cls,
        kafka: KafkaSettings,
        topic: str,
        sampler: Sampler,
        *,
        capacity: int,
        logged: Counter,
        dropped: Counter,
    ) -> PredictionLog:
        failed = dropped.labels(DELIVERY_FAILED).inc
        sink = KafkaSink(kafka, topic, capacity=capacity, failed=failed)
        return cls(sink, sampler, capacity=capacity, logged=logged, dropped=dropped)

    def offer(self, prediction: Prediction) -> None:
        """Queue a served prediction; drops it (counted) when the queue is full."""
        # Only the event loop's thread appends and takes: no lock.
        if len(self._pending) >= self._capacity:
            self._queue_full.inc()
            return
        self._pending.append(prediction)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Publish from ``loop``, the one whose requests ``offer``, from now
        until ``close``."""
        self._next = loop.call_later(self._interval, self._turn, loop)

    def _turn(self, loop: asyncio.AbstractEventLoop) -> None:
        self.drain(limit=CHUNK)
        # What is left waits behind the requests that queued meanwhile.
        if self._pending:
            self._next = loop.call_soon(self._turn, loop)
        else:
            self._next = loop.call_later(self._interval, self._turn, loop)

    def drain(self, limit: int = 0) -> int:
        """Build and send the queued predictions, at most ``limit`` (0: all);
        returns how many the producer took. Called by the loop (and by tests)."""
        pending, sink = self._pending, self._sink
        sent = taken = 0
        while pending and (not limit or taken < limit):
            prediction = pending.popleft()
            taken += 1
            try:
                value = build_record(prediction).SerializeToString()
            except Exception as exc:
                self._unencodable(prediction, exc)
                continue
            reason = sink.send(record_key(prediction), value)
            if reason is None:
                sent += 1
            else:
                self._dropped.labels(reason).inc()
        if sent:
            self._logged.inc(sent)
        sink.serve()
        return sent

    def _unencodable(self, prediction: Prediction, exc: Exception) -> None:
        self._dropped.labels(UNENCODABLE).inc()
        if not self._reported_unencodable:
            self._reported_unencodable = True
            log.error(
                "prediction_log.unencodable",
                model=prediction.model_name,
                request_id=prediction.request_id,
                error=repr(exc),
            )

    def close(self, timeout: float = 5.0) -> None:
        if self._next is not None:
            self._next.cancel()
            self._next = None
        self.drain()
        left = self._sink.flush(timeout)
        if left:
            self._dropped.labels(SHUTDOWN).inc(left)
            log.warning("prediction_log.undelivered", records=left)
