"""The whole stack under chaos, counted exactly.

``python -m bench.chaos [--rate 500] [--secure] [--brokers 1]`` starts a stack
of its own (``aistack up``, on free ports, in a throw-away state directory),
keeps a steady load of raw sensor readings flowing (one in fifty malformed),
runs a study, serves its best model under prediction traffic, and meanwhile
kills with SIGKILL, one after another, svc_tuner and a trainer (while the
study's first trials run), svc_ingest, svc_transform, svc_model and
svc_monitor (each restarted at once, as a supervisor would), then a Kafka
broker and Redis (restarted as ``aistack infra up`` does). Then it counts,
from what the stack holds:

* every good reading on the clean topic exactly once, every malformed one on
  the dead-letter topic exactly once;
* per window of the readings, one record on the features topic and one row
  in the offline store, each counting exactly the clean events it covers;
* the study completed with every trial accounted for;
* every prediction request answered, or refused with a retryable status, and
  every answer the one its model version gives for that input.

It prints the time each service took to be back and
``chaos_lost_or_doubled: N (goal 0)``. ``tests/e2e/test_whole_stack.py``
runs the same chaos with a short load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench import profiling
from bench.recovery import (
    Back,
    _first_clean_after,
    _until,
    ingest,
    model,
    monitor,
    trainer,
    transform,
    tuner,
)
from compose.local import Broker
from compose.processes import port_open
from compose.settings import StackSettings
from compose.stack import ServiceStack
from shared.bus.topics import EVENTS_CLEAN, EVENTS_DLQ, EVENTS_RAW, FEATURES_WINDOWS
from shared.feature_store import window_kind

#: Readings are stamped this long before they are sent: a reading sent at the
#: end, stamped now, moves svc_transform's watermark past every window of
#: the load (the widest, 300 s, included) without being too far ahead of
#: the clock for svc_ingest.
EVENT_TIME_LAG_SECONDS = 6 * 60
#: One reading in this many is malformed (for the dead-letter topic).
MALFORMED_EVERY = 50
#: gRPC statuses a caller retries: the server is restarting or busy.
RETRYABLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED"})

STUDY = """
name: chaos-{run}
objective: {{metric: val_error, direction: DIRECTION_MINIMIZE}}
params:
  - name: learning_rate
    categorical: {{choices: [{{float_value: 0.003}}, {{float_value: 0.01}}, {{float_value: 0.02}}]}}
sampler: {{kind: SAMPLER_KIND_GRID}}
pruner: {{kind: PRUNER_KIND_NONE}}
budget: {{max_trials: {trials}, max_parallel: 2, time_limit: 900s, trial_timeout: 600s}}
task:
  dataset: digits
  model_family: cnn
  framework: FRAMEWORK_TORCH
  strategy: single
  epochs: {epochs}
  model_name: chaos-{run}
seed: 5
"""


# ---- the load: readings whose delivery is acknowledged, and what became of them ----


class CountedLoad:
    """Raw readings of ``devices`` devices at ``rate`` a second until stopped;
    it keeps every reading the broker acknowledged (good ones by event id
    with their event time, malformed ones by their marker)."""

    def __init__(self, stack: ServiceStack, run: str, rate: int, devices: int = 40) -> None:
        from confluent_kafka import Producer

        self.prefix = f"chaos-{run}-"
        self._producer = Producer(
            {**stack.client_kafka().client_config(), "enable.idempotence": True, "linger.ms": 20}
        )
        self._rate = rate
        self._devices = devices
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-load")
        self._lock = threading.Lock()
        #: event id -> (entity, event time in µs), as acknowledged.
        self.good: dict[str, tuple[str, int]] = {}
        #: The markers of acknowledged malformed readings.
        self.malformed: set[str] = set()
        self.failed: list[str] = []
        self.sent = 0

    def __enter__(self) -> CountedLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(timeout=30)
            # Readings buffered while a broker restarted are delivered now.
            left = self._producer.flush(120)
            if left:
                self.failed.append(f"{left} readings never delivered")

    def entities(self) -> list[str]:
        return [f"{self.prefix}{i:03d}" for i in range(self._devices)]

    def close_windows(self) -> None:
        """A reading of another device stamped now: svc_transform's watermark
        passes every window the load's readings fall in."""
        device = f"{self.prefix}closer"
        reading = {
            "event_id": uuid.uuid4().hex,
            "device_id": device,
            "timestamp": round(time.time(), 3),
            "metrics": {"temperature": {"value": 20.0, "unit": "C"}},
        }
        self._producer.produce(EVENTS_RAW, json.dumps(reading).encode(), key=device.encode())
        self._producer.flush(30)

    def _acked(self, marker: str, entity: str, event_us: int) -> Callable[[Any, Any], None]:
        def delivered(error: Any, _record: Any) -> None:
            with self._lock:
                if error is not None:
                    self.failed.append(f"{marker}: {error}")
                elif entity:
                    self.good[marker] = (entity, event_us)
                else:
                    self.malformed.add(marker)

        return delivered

    def _run(self) -> None:
        tick = 0.1
        per_tick = max(1, int(self._rate * tick))
        while not self._stop.is_set():
            started = time.monotonic()
            stamp = time.time() - EVENT_TIME_LAG_SECONDS
            for _ in range(per_tick):
                n = self.sent
                self.sent += 1
                device = f"{self.prefix}{n % self._devices:03d}"
                event_id = uuid.uuid4().hex
                if n % MALFORMED_EVERY == MALFORMED_EVERY - 1:
                    value = f'{{"event_id": "{event_id}", "device_id": "{device}", '.encode()
                    on_delivery = self._acked(event_id, "", 0)
                else:
                    event_ms = round(stamp * 1000)
                    reading = {
                        "event_id": event_id,
                        "device_id": device,
                        "timestamp": event_ms / 1000,
                        "metrics": {"temperature": {"value": 15 + n % 13, "unit": "C"}},
                    }
                    value = json.dumps(reading).encode()
                    on_delivery = self._acked(event_id, device, event_ms * 1000)
                self._produce(value, device, on_delivery)
            self._producer.poll(0)
            self._stop.wait(max(0.0, tick - (time.monotonic() - started)))

    def _produce(self, value: bytes, device: str, on_delivery: Callable[[Any, Any], None]) -> None:
        while True:
            try:
                self._producer.produce(
                    EVENTS_RAW, value, key=device.encode(), on_delivery=on_delivery
                )
                return
            except BufferError:  # the queue is full while a broker is away
                self._producer.poll(0.1)


# ---- prediction traffic ----


def infer_request(model_name: str, x: np.ndarray) -> Any:
    """An Open Inference Protocol request of ``x`` as the model's one FP32 input."""
    from shared.contracts.inference import grpc_predict_v2_pb2 as pb

    request = pb.ModelInferRequest(model_name=model_name)
    tensor = request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    return request


class PredictionTraffic:
    """Requests to ``model_name`` a few times a second until stopped; every
    answer is checked against the first one its model version gave."""

    def __init__(self, stack: ServiceStack, model_name: str, x: np.ndarray) -> None:
        self._stack = stack
        self._model = model_name
        self._x = x
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-predict")
        self.answered = 0
        self.refused: Counter[str] = Counter()
        self.wrong: list[str] = []
        self._reference: dict[str, np.ndarray] = {}

    def __enter__(self) -> PredictionTraffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        import grpc

        from shared.contracts.inference import grpc_predict_v2_pb2_grpc as pb_grpc

        request = infer_request(self._model, self._x)
        with self._stack.model().open_sync() as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            while not self._stop.wait(0.2):
                try:
                    response = stub.ModelInfer(request, timeout=5)
                except grpc.RpcError as exc:
                    self.refused[exc.code().name] += 1
                    if exc.code().name not in RETRYABLE:
                        self.wrong.append(f"refused with {exc.code().name}: {exc.details()}")
                    continue
                self.answered += 1
                self._check(response.model_version, response.outputs[0].contents.fp32_contents)

    def _check(self, version: str, outputs: Iterable[float]) -> None:
        answer = np.asarray(list(outputs), dtype=np.float32)
        reference = self._reference.setdefault(version, answer)
        if not version or answer.shape != reference.shape or not np.allclose(answer, reference):
            self.wrong.append(f"version {version!r} answered differently")


# ---- the study ----


def start_study(stack: ServiceStack, run: str, epochs: int, trials: int) -> str:
    from aistack.studies import load_spec
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api
    from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub

    spec = load_spec(STUDY.format(run=run, epochs=epochs, trials=trials))
    with stack.tuner().open_sync() as channel:
        stub = TunerServiceStub(channel)  # type: ignore[no-untyped-call]
        return str(stub.CreateStudy(api.CreateStudyRequest(spec=spec)).study.study_id)


def finished_study(stack: ServiceStack, study_id: str, timeout: float) -> Any:
    """The study once it is no longer running (retrying while svc_tuner is away)."""
    import grpc

    from shared.contracts.aistack.v1 import tuner_service_pb2 as api
    from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with stack.tuner().open_sync() as channel:
                stub = TunerServiceStub(channel)  # type: ignore[no-untyped-call]
                study = stub.GetStudy(api.GetStudyRequest(study_id=study_id), timeout=5).study
        except grpc.RpcError:
            study = None
        if study is not None and study.state != api.STUDY_STATE_RUNNING:
            return study
        time.sleep(1)
    raise TimeoutError(f"the study {study_id} did not finish within {timeout:.0f} s")


def served(stack: ServiceStack, model_name: str, version: str, x: np.ndarray) -> Callable[[], bool]:
    import grpc

    from shared.contracts.inference import grpc_predict_v2_pb2_grpc as pb_grpc

    request = infer_request(model_name, x)

    def probe() -> bool:
        try:
            with stack.model().open_sync() as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
                return bool(stub.ModelInfer(request, timeout=10).model_version == version)
        except grpc.RpcError:
            return False

    return probe


# ---- the infrastructure's restarts ----


def _kill_server(stack: ServiceStack, name: str) -> None:
    (status,) = [s for s in stack.infra.status() if s.name == name]
    assert status.pid is not None, f"{name} is not running"
    os.killpg(status.pid, signal.SIGKILL)
    # Dead before its sockets are closed: the restart must find its ports
    # free, a broker's controller port as well as the one clients use (an
    # exiting process closes them one after the other).
    server = stack.infra.server(name)
    ports = [server.port, *([server.controller_port] if isinstance(server, Broker) else [])]
    host = stack.settings.infra.host
    while any(port_open(host, port) for port in ports) or any(
        s.name == name and s.running for s in stack.infra.status()
    ):
        time.sleep(0.05)


def broker(stack: ServiceStack) -> Back:
    """Kill -9 the last broker and start it again: back when clean events
    flow again through it."""
    name = stack.infra.brokers[-1].name
    _kill_server(stack, name)
    since = time.monotonic()
    stack.infra.up()
    answering = time.monotonic() - since
    arrived = _first_clean_after(stack)
    seconds = _until("a clean event", arrived, since)
    return Back(name, seconds, f"answering in {answering:.1f} s, then clean events flow again")


def redis(stack: ServiceStack) -> Back:
    """Kill -9 Redis and start it again (its append-only file holds the studies)."""
    name = stack.infra.redis.name
    _kill_server(stack, name)
    since = time.monotonic()
    stack.infra.up()
    return Back(name, time.monotonic() - since, "answers")


# ---- the count ----


@dataclass
class Tally:
    """What the chaos lost or doubled, by where; ``problems`` says which."""

    clean_lost: int = 0
    clean_doubled: int = 0
    dead_letters_lost: int = 0
    dead_letters_doubled: int = 0
    windows_lost: int = 0
    windows_doubled: int = 0
    windows_miscounted: int = 0
    offline_lost: int = 0
    offline_doubled: int = 0
    offline_miscounted: int = 0
    trials_unaccounted: int = 0
    predictions_wrong: int = 0
    undelivered: int = 0
    problems: list[str] = field(default_factory=list)
    windows: int = 0

    @property
    def lost_or_doubled(self) -> int:
        return sum(value for value in vars(self).values() if isinstance(value, int)) - self.windows

    def note(self, what: str, examples: Iterable[object]) -> None:
        shown = list(examples)[:3]
        if shown:
            self.problems.append(f"{what}: {shown}")


def expected_windows(
    clean: dict[str, tuple[str, int]], kinds: Iterable[tuple[int, int]]
) -> Counter[tuple[str, str, int]]:
    """(entity, window kind, start in µs) -> clean events it covers, for every
    window of every kind that the events fall in (by the windows' definition,
    not by svc_transform's code)."""
    counts: Counter[tuple[str, str, int]] = Counter()
    for entity, event_us in clean.values():
        for size, slide in kinds:
            slide_us, size_us = slide * 1_000_000, size * 1_000_000
            last = event_us - event_us % slide_us
            start = last
            while start > event_us - size_us:
                counts[(entity, window_kind(size, slide), start)] += 1
                start -= slide_us
    return counts


def count(
    stack: ServiceStack,
    load: CountedLoad,
    kinds: Iterable[tuple[int, int]],
    *,
    timeout: float = 240.0,
) -> Tally:
    """What reached the clean and dead-letter topics, the features topic and
    the offline store for the load's readings, once they have all arrived
    (or ``timeout`` seconds passed)."""
    tally = Tally(undelivered=len(load.failed))
    tally.note("undelivered", load.failed)
    entities = set(load.entities())

    clean = _settled(
        lambda: _clean_events(stack, entities),
        lambda found: len(found[0]) >= len(load.good),
        timeout,
    )
    seen, repeats = clean
    lost = load.good.keys() - seen.keys()
    tally.clean_lost, tally.clean_doubled = len(lost), sum(repeats.values())
    tally.note("clean events lost", lost)
    tally.note("clean events doubled", repeats)

    letters = _settled(
        lambda: _dead_letters(stack, load.prefix, load.malformed),
        lambda found: len(found) >= len(load.malformed),
        60,
    )
    tally.dead_letters_lost = len(load.malformed - letters.keys())
    tally.dead_letters_doubled = sum(n - 1 for n in letters.values() if n > 1)
    tally.note("dead letters lost", load.malformed - letters.keys())

    expected = expected_windows(seen, kinds)
    tally.windows = len(expected)
    on_topic = _settled(
        lambda: _topic_windows(stack, entities),
        lambda found: expected.keys() <= found.keys(),
        timeout,
    )
    tally.windows_lost, tally.windows_doubled, tally.windows_miscounted = _compare(
        tally, "features topic", expected, on_topic
    )
    offline = _settled(
        lambda: _offline_windows(stack, entities),
        lambda found: expected.keys() <= found.keys(),
        120,
    )
    tally.offline_lost, tally.offline_doubled, tally.offline_miscounted = _compare(
        tally, "offline store", expected, offline
    )
    return tally


def _settled(read: Callable[[], Any], complete: Callable[[Any], bool], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = read()
        if complete(found) or time.monotonic() > deadline:
            return found
        time.sleep(2)


def _compare(
    tally: Tally,
    where: str,
    expected: Counter[tuple[str, str, int]],
    found: dict[tuple[str, str, int], list[int]],
) -> tuple[int, int, int]:
    """Windows lost, doubled and miscounted in ``found``; examples noted in ``tally``."""
    lost = expected.keys() - found.keys()
    doubled = {key: counts for key, counts in found.items() if len(counts) > 1}
    miscounted = {
        key: (counts, expected[key])
        for key, counts in found.items()
        if key in expected and any(n != expected[key] for n in counts)
    }
    tally.note(f"windows lost on the {where}", sorted(lost))
    tally.note(f"windows doubled on the {where}", doubled.items())
    tally.note(f"windows miscounted on the {where} (found, expected)", miscounted.items())
    return len(lost), len(doubled), len(miscounted)


def _clean_events(
    stack: ServiceStack, entities: set[str]
) -> tuple[dict[str, tuple[str, int]], Counter[str]]:
    from shared.bus.consumer import read_to_end
    from shared.contracts.aistack.v1 import events_pb2

    seen: dict[str, tuple[str, int]] = {}
    repeats: Counter[str] = Counter()
    for record in read_to_end(stack.client_kafka(), EVENTS_CLEAN, events_pb2.CleanEvent, 120):
        event = record.decode()
        if event.entity_id in entities:
            if event.event_id in seen:
                repeats[event.event_id] += 1
            seen[event.event_id] = (event.entity_id, event.event_time.ToMicroseconds())
    return seen, repeats


def _dead_letters(stack: ServiceStack, prefix: str, markers: set[str]) -> Counter[str]:
    from shared.bus.consumer import read_to_end
    from shared.contracts.aistack.v1 import events_pb2

    found: Counter[str] = Counter()
    for record in read_to_end(stack.client_kafka(), EVENTS_DLQ, events_pb2.DeadLetter, 120):
        original = record.decode().original_value
        if prefix.encode() in original:
            marker = original.split(b'"event_id": "', 1)[-1][:32].decode()
            if marker in markers:
                found[marker] += 1
    return found


def _topic_windows(
    stack: ServiceStack, entities: set[str]
) -> dict[tuple[str, str, int], list[int]]:
    from shared.bus.consumer import read_to_end
    from shared.contracts.aistack.v1 import features_pb2

    found: dict[tuple[str, str, int], list[int]] = {}
    for record in read_to_end(
        stack.client_kafka(), FEATURES_WINDOWS, features_pb2.FeatureWindow, 120
    ):
        w = record.decode()
        if w.entity_id in entities and not w.open:
            kind = window_kind(
                w.window_size.seconds, w.window_slide.seconds or w.window_size.seconds
            )
            key = (w.entity_id, kind, w.window_start.ToMicroseconds())
            found.setdefault(key, []).append(int(w.count))
    return found


def _offline_windows(
    stack: ServiceStack, entities: set[str]
) -> dict[tuple[str, str, int], list[int]]:
    import pyarrow.dataset as ds

    from shared.offline_store import OfflineStoreError, open_store

    try:
        store = open_store(stack.offline_store(), stack.object_store_settings())
    except OfflineStoreError:
        return {}
    if "entity_id" not in store.schema.names:
        return {}
    rows = store.to_table(
        filter=ds.field("entity_id").isin(sorted(entities)),
        columns=["entity_id", "window", "window_start", "count"],
    ).to_pylist()
    found: dict[tuple[str, str, int], list[int]] = {}
    for row in rows:
        start = row["window_start"]
        start_us = int(start.timestamp() * 1_000_000) if start.tzinfo else _utc_us(start)
        found.setdefault((row["entity_id"], row["window"], start_us), []).append(int(row["count"]))
    return found


def _utc_us(naive: Any) -> int:
    from datetime import UTC

    return int(naive.replace(tzinfo=UTC).timestamp() * 1_000_000)


def default_window_kinds() -> list[tuple[int, int]]:
    """(size, slide) of svc_transform's windows as its settings default them."""
    from svc_transform.settings import TransformSettings

    fields = TransformSettings.model_fields
    tumbling = int(fields["tumbling_window_seconds"].default)
    sliding = int(fields["sliding_window_seconds"].default)
    slide = int(fields["sliding_slide_seconds"].default)
    return [(tumbling, tumbling), *([(sliding, slide)] if sliding else [])]


# ---- the run ----


@dataclass
class ChaosResult:
    back: list[Back]
    tally: Tally
    study: Any
    traffic: PredictionTraffic
    sent: int


def run_chaos(
    stack: ServiceStack,
    *,
    rate: int,
    epochs: int = 8,
    trials: int = 3,
    settle: float = 3.0,
    kinds: Iterable[tuple[int, int]] | None = None,
    say: Callable[[str], object] = lambda line: None,
) -> ChaosResult:
    """The chaos on a running ``stack``: see the module's docstring."""
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api
    from svc_trainer.data.datasets import load as load_data

    run = uuid.uuid4().hex[:6]
    kinds = list(kinds or default_window_kinds())
    x = load_data("digits", {}, seed=0).x_test[:8]
    back: list[Back] = []
    began = time.monotonic()
    told = say

    def tell(line: str) -> None:
        told(f"[{time.monotonic() - began:5.0f} s] {line}")

    def hit(victim: Callable[[ServiceStack], Back]) -> None:
        taken = victim(stack)
        back.append(taken)
        tell(f"{taken.service:<14} back in {taken.seconds:5.1f} s ({taken.what})")
        time.sleep(settle)

    with CountedLoad(stack, run, rate) as load:
        time.sleep(settle)
        # The study's victims first, while its first trials run; it goes on
        # behind the stream's.
        study_id = start_study(stack, run, epochs, trials)
        time.sleep(1)
        hit(tuner)
        hit(trainer)
        hit(ingest)
        hit(transform)
        study = finished_study(stack, study_id, 900)
        best = study.best_trial
        tell(f"study {study_id} {api.StudyState.Name(study.state)}: {dict(study.trial_counts)}")
        probe = served(stack, best.model_name, best.model_version, x)
        _until("the best model served", probe, time.monotonic())
        with PredictionTraffic(stack, best.model_name, x) as traffic:
            time.sleep(settle)
            hit(model)
            hit(monitor)
            hit(broker)
            hit(redis)
        load.stop()
        load.close_windows()
        tell(f"load stopped after {load.sent} readings; counting")
        tally = count(stack, load, kinds)
        tell("counted")

    accounted = sum(study.trial_counts.values())
    if study.state != api.STUDY_STATE_COMPLETED or accounted != trials:
        tally.trials_unaccounted = max(1, trials - accounted)
        tally.note("the study", [f"{api.StudyState.Name(study.state)} {dict(study.trial_counts)}"])
    tally.predictions_wrong = len(traffic.wrong)
    tally.note("predictions wrong", traffic.wrong)
    return ChaosResult(back, tally, study, traffic, load.sent)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--rate", type=int, default=500, help="raw readings a second")
    parser.add_argument("--epochs", type=int, default=8, help="epochs of each trial")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between kills")
    parser.add_argument("--brokers", type=int, default=1, help="Kafka brokers")
    parser.add_argument("--secure", action="store_true", help="aistack up --secure")
    profiling.add_flag(parser, "chaos")
    args = parser.parse_args()

    state = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    settings = StackSettings.on_free_ports(state)
    infra = settings.infra.model_copy(update={"secure": args.secure, "brokers": args.brokers})
    stack = ServiceStack(settings.model_copy(update={"infra": infra}))
    print(f"starting a stack in {state} …", flush=True)
    stack.up()
    try:
        result = run_chaos(
            stack,
            rate=args.rate,
            epochs=args.epochs,
            settle=args.settle,
            say=lambda line: print(line, flush=True),
        )
    finally:
        stack.down()
    tally, traffic = result.tally, result.traffic
    print(
        f"{result.sent} readings sent at {args.rate}/s; {tally.windows} windows; "
        f"predictions: {traffic.answered} answered, refused {dict(traffic.refused)}"
    )
    for problem in tally.problems:
        print(f"  {problem}")
    print(f"chaos_lost_or_doubled: {tally.lost_or_doubled} (goal 0)", flush=True)


if __name__ == "__main__":
    main()
