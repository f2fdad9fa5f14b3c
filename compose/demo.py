"""``aistack demo`` (``make demo``): the whole stack, end to end, in one command.

Starts the local stack (Kafka, Redis, every service as its own process),
then shows each stage at work: raw events in (some malformed, some repeated),
cleaned, dead-lettered, aggregated into windows; a digits study fanned out
over the trainers (PyTorch and TensorFlow trials, TPE with ASHA pruning), the
default configuration and a scikit-learn SVC on the same split; a forecasting
study on the windows Spark wrote; the best model served and called over gRPC
on held-out digits and on an entity's latest features. Ends with one summary
table and stops the stack unless ``--keep``.

A service that dies during the demo is shown with its last log lines, and
the demo exits non-zero. This process talks to the services only as a client
would: Kafka, the tuner's gRPC API, the Open Inference Protocol and Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar, cast

from compose.settings import StackSettings
from compose.stack import ServiceStack, ServiceStatus
from shared.errors import AistackError
from shared.settings import KafkaSettings, load_settings

T = TypeVar("T")

PROJECT_ROOT = Path(__file__).resolve().parents[1]
STUDIES = PROJECT_ROOT / "examples" / "studies"
STEPS = 7
#: How the demo's raw events look: share of malformed and of repeated records.
BAD_FRACTION = 0.04
DUPLICATE_FRACTION = 0.04
FORECAST_FEATURE = "temperature@tumbling-60s"


class ServiceDied(AistackError):
    reason = "service_died"


def add_parser(commands: Any) -> None:
    demo = commands.add_parser(
        "demo", help="run the whole stack end to end (events → features → tuning → serving)"
    )
    demo.add_argument("--keep", action="store_true", help="leave the stack running at the end")
    demo.add_argument("--sensor-events", type=int, default=16_000, help="sensor readings to send")
    demo.add_argument("--weblog-events", type=int, default=4_000, help="web log lines to send")
    demo.add_argument("--trials", type=int, default=16, help="trials of the digits study")
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    stack = ServiceStack(load_settings(StackSettings))
    console = Console(sys.stdout)
    demo = Demo(stack, console, args)
    failed = True
    try:
        summary = demo.run()
        failed = False
    except ServiceDied as exc:
        console.line(f"\ndemo failed: {exc}")
        return 1
    finally:
        if not args.keep or failed:
            console.line("stopping the stack (aistack down)…")
            stack.down()
        else:
            console.line("the stack keeps running: `aistack status`, `aistack down` to stop it")
    console.line(summary.table())
    return 0


class Console:
    """Step headers and progress lines, redrawn in place on a terminal."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._live = out.isatty()
        self._started = time.monotonic()
        self._open = False
        self._last = ""

    def step(self, number: int, text: str) -> None:
        self._close()
        elapsed = time.monotonic() - self._started
        self._out.write(f"\n[{number}/{STEPS}] {text}   (t+{elapsed:.0f}s)\n")
        self._out.flush()

    def line(self, text: str) -> None:
        self._close()
        self._out.write(text + "\n")
        self._out.flush()

    def progress(self, text: str) -> None:
        if text == self._last:
            return  # a log file gets each state once, a terminal is redrawn
        self._last = text
        if self._live:
            self._out.write("\r\033[K  " + text)
            self._open = True
        else:
            self._out.write("  " + text + "\n")
        self._out.flush()

    def _close(self) -> None:
        if self._open:
            self._out.write("\n")
            self._open = False

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started


@dataclass
class Summary:
    rows: list[tuple[str, str]] = field(default_factory=list)

    def add(self, name: str, value: object) -> None:
        self.rows.append((name, str(value)))

    def table(self) -> str:
        width = max((len(n) for n, _ in self.rows), default=10)
        rule = "-" * (width + 50)
        lines = ["", "aistack demo: summary", rule]
        lines += [f"{name:<{width}}  {value}" for name, value in self.rows]
        lines.append(rule)
        return "\n".join(lines)


@dataclass(frozen=True)
class StudyOutcome:
    study_id: str
    counts: dict[str, int]
    best: Any  # api.Trial or None


class Demo:
    def __init__(self, stack: ServiceStack, console: Console, args: argparse.Namespace) -> None:
        self.stack = stack
        self.console = console
        self.args = args
        self.summary = Summary()
        self.run_id = time.strftime("%m%d-%H%M%S")

    def run(self) -> Summary:
        self._stack_up()
        self._events()
        digits, default = self._digits_studies()
        self._baselines(digits, default)
        forecast = self._forecast_study()
        self._serve(digits, forecast)
        self.console.step(7, f"done in {self.console.elapsed:.0f} s")
        self.summary.add("demo wall time", f"{self.console.elapsed:.0f} s")
        return self.summary

    # ---- 1: the stack ----

    def _stack_up(self) -> None:
        self.console.step(1, "starting the stack: Kafka, Redis and every service")

        def ready(status: ServiceStatus) -> None:
            self.console.line(f"  ready: {status.name:<14} {' '.join(status.addresses)}")

        statuses = self.stack.up(progress=ready)
        for status in statuses:
            pid = status.pid if status.pid is not None else "-"
            self.console.line(f"  {status.name:<14} {status.state:<8} pid {pid}")

    def check_services(self) -> None:
        """Raise ServiceDied with its last log lines if a service is not running."""
        for status in self.stack.status():
            if status.state != "running":
                raise ServiceDied(
                    f"{status.name} is {status.state}; its last log lines "
                    f"({status.log_file}):\n{status.last_lines}"
                )

    def _wait(
        self, what: str, probe: Callable[[], T | None], timeout: float, show: Callable[[], str]
    ) -> T:
        deadline = time.monotonic() + timeout
        while True:
            self.check_services()
            result = probe()
            self.console.progress(show())
            if result is not None:
                self.console.line("")
                return result
            if time.monotonic() > deadline:
                raise ServiceDied(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(1.0)

    # ---- 2: events ----

    def _events(self) -> None:
        from loadgen.plan import generate
        from loadgen.publish import send
        from shared.bus.producer import BusProducer
        from shared.bus.topics import EVENTS_CLEAN, EVENTS_DLQ, EVENTS_RAW, FEATURES_WINDOWS

        args = self.args
        self.console.step(
            2,
            f"publishing {args.sensor_events} sensor readings and {args.weblog_events} web log "
            f"lines ({BAD_FRACTION:.0%} malformed, {DUPLICATE_FRACTION:.0%} repeated)",
        )
        kafka = self._kafka()
        started = time.time()
        topics = (EVENTS_RAW, EVENTS_CLEAN, EVENTS_DLQ, FEATURES_WINDOWS)
        # A stack that ran before keeps its topics: count what this run adds.
        before = {t: topic_size(kafka, t) for t in topics}
        producer = BusProducer(
            kafka, source="aistack-demo", config={"message.max.bytes": 8 * 1024 * 1024}
        )
        sent = Counter[str]()
        # Fresh events each run: svc_ingest's dedup table remembers earlier
        # runs' event ids (and drops them, as it should).
        run_seed = int(time.time())
        for kind, count, seed in (
            ("sensors", args.sensor_events, run_seed),
            ("weblogs", args.weblog_events, run_seed + 1),
        ):
            records = generate(
                kind,  # type: ignore[arg-type]
                count,
                bad_fraction=BAD_FRACTION,
                duplicate_fraction=DUPLICATE_FRACTION,
                seed=seed,
            )
            outcome = send(records, producer, EVENTS_RAW, rate=0)
            sent.update(good=outcome.good, bad=outcome.bad, duplicate=outcome.duplicate)
        producer.close()
        self.console.line(
            f"  sent {sum(sent.values())} records: {sent['good']} good, {sent['bad']} "
            f"malformed, {sent['duplicate']} repeated"
        )
        counts: dict[str, int] = {}
        last: list[tuple[int, ...]] = []

        def flowing() -> bool | None:
            for topic in topics:
                counts[topic] = topic_size(kafka, topic) - before[topic]
            last.append(tuple(counts.values()))
            settled = len(last) >= 6 and len(set(last[-6:])) == 1
            expected_clean = sent["good"] * 0.95
            return (
                True
                if settled and counts[FEATURES_WINDOWS] and (counts[EVENTS_CLEAN] >= expected_clean)
                else None
            )

        def show() -> str:
            return (
                f"raw {counts.get(EVENTS_RAW, 0):>6}   clean {counts.get(EVENTS_CLEAN, 0):>6}   "
                f"dead letters {counts.get(EVENTS_DLQ, 0):>5}   "
                f"feature windows {counts.get(FEATURES_WINDOWS, 0):>5}"
            )

        self._wait("events to be cleaned and aggregated", flowing, 240, show)
        reasons = dead_letter_reasons(kafka, EVENTS_DLQ, since=started)
        self.summary.add("events published", f"{sum(sent.values())} ({sent['good']} good)")
        self.summary.add("clean events", counts[EVENTS_CLEAN])
        top = ", ".join(f"{r} {n}" for r, n in reasons.most_common(6))
        self.summary.add("dead letters", f"{sum(reasons.values())}: {top}")
        # Repeated records are dropped by svc_ingest's dedup table, not dead-lettered.
        dropped = sent["good"] + sent["duplicate"] - counts[EVENTS_CLEAN]
        self.summary.add("repeated records not passed on", f"{dropped} of {sent['duplicate']} sent")
        self.summary.add("feature windows", counts[FEATURES_WINDOWS])

    # ---- 3: studies ----

    def _digits_studies(self) -> tuple[StudyOutcome, StudyOutcome]:
        self.console.step(
            3,
            f"tuning the digits CNN: {self.args.trials} trials, 4 in flight over the trainers, "
            "TPE with ASHA pruning, PyTorch and TensorFlow trials; and the default configuration",
        )
        default_spec = self._spec("digits-default.yaml")
        digits_spec = self._spec("digits-demo.yaml")
        digits_spec.budget.max_trials = self.args.trials
        default = self._study(default_spec, watch=False)
        digits = self._study(digits_spec, watch=True)
        default = self._finish(default.study_id)
        self._study_summary("digits study", digits)
        return digits, default

    def _forecast_study(self) -> StudyOutcome:
        self.console.step(
            5, "forecasting the next window's mean temperature from the windows Spark wrote"
        )
        outcome = self._study(self._spec("forecast.yaml"), watch=True)
        self._study_summary("forecast study", outcome)
        return outcome

    def _spec(self, file: str) -> Any:
        from compose.study import load_spec

        spec = load_spec((STUDIES / file).read_text())
        spec.name = f"{spec.name}-{self.run_id}"
        spec.task.model_name = f"{spec.task.model_name}-{self.run_id}"
        return spec

    def _study(self, spec: Any, *, watch: bool) -> StudyOutcome:
        from compose.study import watch as watch_study
        from shared.contracts.aistack.v1 import tuner_service_pb2 as api
        from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub
        from shared.rpc.client import open_channel

        async def create_and_watch() -> str:
            async with open_channel(self.stack.tuner_target) as channel:
                stub = TunerServiceStub(channel)  # type: ignore[no-untyped-call]
                created = await stub.CreateStudy(api.CreateStudyRequest(spec=spec))
                study_id: str = created.study.study_id
                self.console.line(f"  study {study_id} created")
                if watch:
                    watching = asyncio.ensure_future(
                        watch_study(stub, study_id, cast(TextIO, _ProgressOut(self.console)))
                    )
                    while not watching.done():
                        await asyncio.to_thread(self.check_services)
                        await asyncio.wait({watching}, timeout=2.0)
                    watching.result()
                return study_id

        study_id = asyncio.run(create_and_watch())
        return self._finish(study_id) if watch else StudyOutcome(study_id, {}, None)

    def _finish(self, study_id: str) -> StudyOutcome:
        """Wait for the study to end; its trial counts and best trial."""
        from shared.contracts.aistack.v1 import tuner_service_pb2 as api

        def ended() -> Any:
            study = self._tuner(lambda stub: stub.GetStudy(api.GetStudyRequest(study_id=study_id)))
            return None if study.study.state == api.STUDY_STATE_RUNNING else study.study

        study = self._wait(f"study {study_id}", ended, 900, lambda: f"study {study_id} running")
        best = study.best_trial if study.HasField("best_trial") else None
        return StudyOutcome(study_id, dict(study.trial_counts), best)

    def _tuner(self, call: Callable[[Any], T]) -> T:
        import grpc

        from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub

        with grpc.insecure_channel(self.stack.tuner_target) as channel:
            return call(TunerServiceStub(channel))  # type: ignore[no-untyped-call]

    def _study_summary(self, label: str, outcome: StudyOutcome) -> None:
        counts = ", ".join(f"{state} {n}" for state, n in sorted(outcome.counts.items()))
        self.summary.add(f"{label} trials", counts or "none")
        if outcome.best is not None:
            from compose.study import describe_trial

            self.summary.add(f"{label} best", describe_trial(outcome.best))

    # ---- 4: tuned against default against SVC ----

    def _baselines(self, digits: StudyOutcome, default: StudyOutcome) -> None:
        self.console.step(4, "tuned against default against a scikit-learn SVC, same split")
        from sklearn.svm import SVC

        from svc_trainer.data import load

        data = load("digits", {}, seed=0)  # the split every trial trains on
        svc = SVC().fit(data.x_train.reshape(len(data.x_train), -1), data.y_train)
        predicted = svc.predict(data.x_test.reshape(len(data.x_test), -1))
        svc_error = float((predicted != data.y_test).mean())
        tuned = _metric(digits.best, "test_error")
        base = _metric(default.best, "test_error")
        rows = [("default CNN", base), ("tuned CNN", tuned), ("SVC (scikit-learn)", svc_error)]
        for name, error in rows:
            shown = "-" if error is None else f"{error:.2%}"
            self.console.line(f"  test error  {name:<20} {shown}  ({len(data.y_test)} digits)")
        if tuned is not None and base is not None:
            less = (base - tuned) / base if base else 0.0
            self.summary.add(
                "test error: default → tuned",
                f"{base:.2%} → {tuned:.2%} ({less:.0%} less error)",
            )
        self.summary.add("test error: SVC baseline", f"{svc_error:.2%}")
        if tuned is not None:
            verdict = "beats" if tuned < svc_error else "does not beat"
            self.summary.add("tuned CNN vs SVC", f"the tuned CNN {verdict} the SVC")

    # ---- 6: serving ----

    def _serve(self, digits: StudyOutcome, forecast: StudyOutcome) -> None:
        self.console.step(6, "the best model, served: predictions over gRPC")
        if digits.best is None:
            raise ServiceDied("the digits study completed no trial: nothing to serve")
        import grpc

        from shared.contracts.inference import grpc_predict_v2_pb2_grpc as pb_grpc

        with grpc.insecure_channel(self.stack.model_target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            self._predict_digits(stub, digits)
            if forecast.best is not None:
                self._predict_entity(stub, forecast)

    def _predict_digits(self, stub: Any, digits: StudyOutcome) -> None:
        import numpy as np

        from shared.contracts.aistack.v1 import tuner_service_pb2 as api
        from svc_trainer.data import load

        name, best_value = digits.best.model_name, digits.best.value
        trials = self._tuner(
            lambda tuner: tuner.ListTrials(api.ListTrialsRequest(study_id=digits.study_id))
        ).trials
        value_of = {t.model_version: t.value for t in trials if t.HasField("value")}
        probe_x = np.zeros((1, 8, 8), dtype=np.float32)
        served: dict[str, str] = {}

        def champion() -> str | None:
            try:
                version = stub.ModelInfer(_request(name, probe_x), timeout=10).model_version
            except Exception as exc:  # not loaded yet: NOT_FOUND, or the server starting
                served["state"] = getattr(exc, "code", lambda: "waiting")()
                return None
            served["state"] = f"serving version {version}"
            # The champion: a version as good as the study's best (ties serve the first).
            return version if value_of.get(version) == best_value else None

        version = self._wait(
            f"{name} to be served", champion, 300, lambda: f"{name}: {served.get('state', '…')}"
        )
        data = load("digits", {}, seed=0)
        latencies, correct = [], 0
        for x, y in zip(data.x_test, data.y_test, strict=True):
            started = time.perf_counter()
            response = stub.ModelInfer(_request(name, x[np.newaxis]), timeout=10)
            latencies.append(time.perf_counter() - started)
            out = np.frombuffer(response.raw_output_contents[0], dtype="<f4")
            correct += int(out.argmax() == y)
        accuracy = correct / len(data.y_test)
        p50, p99 = _percentile(latencies, 50), _percentile(latencies, 99)
        self.console.line(
            f"  {name} version {version}: {accuracy:.2%} of {len(data.y_test)} held-out digits "
            f"right; latency p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms (one digit per call)"
        )
        self.summary.add("served model", f"{name} version {version} (val_error {best_value:.4f})")
        self.summary.add("held-out accuracy over gRPC", f"{accuracy:.2%} of {len(data.y_test)}")
        self.summary.add("gRPC latency p50 / p99", f"{p50 * 1000:.2f} ms / {p99 * 1000:.2f} ms")

    def _predict_entity(self, stub: Any, forecast: StudyOutcome) -> None:
        import json

        import numpy as np

        from shared.contracts.inference import grpc_predict_v2_pb2 as pb
        from shared.redis_client import make_redis
        from shared.settings import RedisSettings

        name = forecast.best.model_name
        redis = make_redis(RedisSettings(url=self.stack.redis_url))
        try:
            entity, window = _an_entity(redis, FORECAST_FEATURE)
        finally:
            redis.close()
        if entity is None:
            self.summary.add("prediction by entity", f"no entity has {FORECAST_FEATURE} online")
            return
        request = pb.ModelInferRequest(model_name=name)
        request.parameters["entity_id"].string_param = entity
        request.parameters["feature"].string_param = FORECAST_FEATURE

        def answer() -> Any:
            try:
                return stub.ModelInfer(request, timeout=10)
            except Exception:
                return None  # the forecaster is still loading

        response = self._wait(f"{name} to answer", answer, 120, lambda: f"{name}: loading")
        out = response.outputs[0]
        if response.raw_output_contents:
            value = float(np.frombuffer(response.raw_output_contents[0], dtype="<f4")[0])
        else:
            value = float(out.contents.fp32_contents[0])
        last = json.loads(window)["mean"]
        self.console.line(
            f"  {name} version {response.model_version}, entity {entity}: next mean "
            f"{value:.2f} (last window's mean {last:.2f}), from its latest window in Redis"
        )
        self.summary.add(
            "prediction by entity", f"{entity}: next mean {value:.2f} (last {last:.2f})"
        )

    def _kafka(self) -> KafkaSettings:
        return load_settings(KafkaSettings).model_copy(
            update={"bootstrap": self.stack.kafka_bootstrap}
        )


class _ProgressOut:
    """A text stream for compose.study.watch that draws through the console."""

    def __init__(self, console: Console) -> None:
        self._console = console

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                self._console.progress(line.strip())
        return len(text)

    def flush(self) -> None:
        return None


def _request(name: str, x: Any) -> Any:
    from shared.contracts.inference import grpc_predict_v2_pb2 as pb

    request = pb.ModelInferRequest(model_name=name)
    request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.astype("<f4").tobytes())
    return request


def _metric(trial: Any, name: str) -> float | None:
    if trial is None or name not in trial.metrics:
        return None
    return float(trial.metrics[name])


def _percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def _an_entity(redis: Any, feature: str) -> tuple[str | None, str]:
    prefix = "aistack:features:"
    for key in redis.scan_iter(match=f"{prefix}*", count=500):
        window = redis.hget(key, feature)
        if window is not None:
            return key.decode().removeprefix(prefix), window.decode()
    return None, ""


def topic_size(kafka: KafkaSettings, topic: str) -> int:
    """Records in ``topic`` (end offsets summed over its partitions)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**kafka.client_config(), "group.id": "aistack-demo-sizes"})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return 0
        total = 0
        for partition in metadata.partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            total += high
        return total
    finally:
        consumer.close()


def dead_letter_reasons(kafka: KafkaSettings, topic: str, *, since: float) -> Counter[str]:
    """How many dead letters ``topic`` holds, rejected at or after ``since``
    (epoch seconds), by reason."""
    from shared.bus.consumer import BusTail
    from shared.contracts.aistack.v1 import events_pb2

    tail = BusTail(kafka, topics=[topic], message_cls=events_pb2.DeadLetter, from_beginning=True)
    reasons: Counter[str] = Counter()
    try:
        while not tail.caught_up():
            for record in tail.poll_batch(1000, timeout=0.5):
                with contextlib.suppress(AistackError):
                    letter = record.decode()
                    if letter.rejected_time.ToSeconds() >= int(since):
                        reasons[letter.reason] += 1
    finally:
        tail.close()
    return reasons


__all__ = ["Demo", "add_parser", "run"]
