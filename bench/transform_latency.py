"""svc_transform's latency and peak rate, against svc_ingest's peak output, same run.

1. Peer: svc_ingest's peak output rate, as ``bench.ingest_throughput``
   measures it (one worker as deployed, 200-byte JSON sensor events).
2. Peak rate: the clean topic is pre-filled with CleanEvents (two metrics
   each, 500 devices) whose event times advance at the ingest peak; the job
   (as deployed: tumbling 60 s and sliding 5 min windows, dead-letter query
   beside) reads ``--peak-warm-up`` rows of it (its JVM compiles the
   queries' code meanwhile), then ``--count`` more in six micro-batches; its
   rate is those rows over the time the window query spent in their
   micro-batches (the job's own counters, from Spark's progress reports).
   Reading a backlog is the highest rate it can keep up with. ``--rounds``
   rounds (default 3), each ingest's peak then the transform's at it; the
   median round's ratio counts.
3. Latency: events at a steady rate (1000/s from 20 devices) with event
   time = now, 1 s tumbling windows, no watermark delay; after a minute of
   them (``--warm-up``: the JVM's compiler busy on the queries' code), for
   each window, the time from the moment it could be closed (the first
   event at or past its end was produced) to its FeatureWindow's arrival on
   the features topic.
4. Online freshness: the same steady rate and warm-up, the job as deployed
   (60 s tumbling and 5 min sliding windows, 30 s watermark, the open-window
   query beside the closed-window one); for each reading, from its event time (=
   when it was produced) to the moment Redis holds a window that counts it
   (the open tumbling window's running aggregate, polled every 10 ms).

Prints p50/p99 and, higher always better:

    transform_vs_ingest_peak: ratio R (goal 1.0)
    transform_p50_vs_2s: ratio R (goal 1.0)
    online_freshness_p50_vs_1s: ratio R (goal 1.0)

Needs a broker and Redis: ``aistack infra up``.
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer

from bench import profiling
from bench.harness import (
    child_env,
    kafka_settings,
    print_ratio,
    python_module,
    read_metric,
    redis_settings,
    spawn,
)
from bench.services import fill, run_worker
from shared.bus.producer import BusProducer
from shared.bus.topics import TopicSpec, ensure_topics
from shared.contracts.aistack.v1 import events_pb2, features_pb2
from shared.feature_store import decode_window, online_field, online_key, open_field, window_kind
from shared.ports import free_port
from shared.redis_client import make_redis
from shared.settings import KafkaSettings

GOAL_RATIO = 1.0
GOAL_P50_SECONDS = 1.0  # an open window in Redis
GOAL_CLOSED_P50_SECONDS = 2.0  # a closed window on the features topic


def clean_event(i: int, at: float, entities: int = 200) -> events_pb2.CleanEvent:
    entity = f"thermo-{i % entities:04d}"
    event = events_pb2.CleanEvent(event_id=uuid.UUID(int=i + (1 << 64)).hex, entity_id=entity)
    event.event_time.FromNanoseconds(int(at * 1e9))
    event.sensor_reading.device_id = entity
    event.sensor_reading.measurements.add(metric="temperature", value=15 + i % 20, unit="degC")
    event.sensor_reading.measurements.add(metric="humidity", value=30 + i % 50, unit="%")
    return event


def steady_readings(
    producer: BusProducer, topic: str, rate: int, seconds: int, entities: int
) -> Iterator[tuple[int, float]]:
    """Publish ``clean_event(i, now)`` at ``rate`` a second for ``seconds``,
    event time = when it is produced; yields each one's ``i`` and event time."""
    begin = time.time()
    i = 0
    while time.time() - begin < seconds:
        now = time.time()
        producer.publish(topic, clean_event(i, now, entities), key=None)
        yield i, now
        i += 1
        time.sleep(max(0.0, begin + i / rate - time.time()))
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush()


class Job:
    def __init__(self, kafka: KafkaSettings, suffix: str, state: Path, **env: str) -> None:
        self.port = free_port()
        self.prefix = f"bench:{suffix}:"
        self.clean = f"bench.clean.{suffix}"
        self.features = f"bench.features.{suffix}"
        ensure_topics(
            kafka,
            [
                TopicSpec(self.clean, events_pb2.CleanEvent),
                TopicSpec(self.features, features_pb2.FeatureWindow),
                TopicSpec(f"bench.dlq.{suffix}", events_pb2.DeadLetter),
            ],
        )
        self._env = child_env(
            {
                "AISTACK_STATE_DIR": str(state / suffix),
                "AISTACK_TRANSFORM_SOURCE_TOPIC": self.clean,
                "AISTACK_TRANSFORM_FEATURES_TOPIC": self.features,
                "AISTACK_TRANSFORM_DLQ_TOPIC": f"bench.dlq.{suffix}",
                "AISTACK_TRANSFORM_ONLINE_KEY_PREFIX": self.prefix,
                "AISTACK_TRANSFORM_METRICS_PORT": str(self.port),
                **env,
            },
            kafka=kafka,
            redis=redis_settings(),
            # Spark's log is long: quiet unless the caller asks for more.
            defaults={"AISTACK_LOG_LEVEL": "WARNING"},
        )
        self._log = (state / f"transform-{suffix}.log").open("wb")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = spawn(python_module("svc_transform"), self._env, self._log, new_session=True)

    def counter(self, name: str, query: str) -> float:
        series = f'aistack_transform_{name}_total{{query="{query}"}}'
        return read_metric(self.port, series)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()
        self._log.close()


@dataclass(frozen=True)
class PeakRates:
    """The window query's rows per second over its micro-batches' time: ``warm``
    once the job has read its warm-up rows (what counts), ``cold`` over the
    warm-up's own batches after the first (for comparison: a job in its first
    minute)."""

    warm: float
    cold: float


def peak_rate(
    kafka: KafkaSettings, state: Path, count: int, input_rate: float, warm_up_rows: int
) -> PeakRates:
    """Rows per second the window query processes from a backlog, warm, as deployed.

    The backlog's event times advance at ``input_rate`` (the ingest stage's
    peak output): the stream Spark gets while ingest runs flat out, so windows
    close as often as they would then. The job first reads ``warm_up_rows``
    of it, left out, then ``count`` rows are timed: in a job's first minute
    its JVM compiles the queries' code (the compiler's threads took 30 s of
    the JVM's 75 s of CPU in a cold read of 600,000 rows, the tasks 22-26 s),
    which a job that runs for hours pays once; the latency runs below warm up
    for the same reason.
    """
    batch = count // 6
    total = warm_up_rows + count
    job = Job(
        kafka,
        uuid.uuid4().hex[:8],
        state,
        AISTACK_TRANSFORM_MAX_OFFSETS_PER_TRIGGER=str(batch),
    )
    producer = BusProducer(kafka, source="bench")
    start_at = time.time() - total / input_rate
    for i in range(total):
        producer.publish(job.clean, clean_event(i, start_at + i / input_rate, 500), key=None)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush()
    query = "windows"

    def counters() -> tuple[float, float]:
        time.sleep(0.2)  # the listener updates rows, then busy time
        return job.counter("rows_in", query), job.counter("busy_seconds", query)

    def rate(since: tuple[float, float], until: tuple[float, float]) -> float:
        # Rows over the time the query spent in micro-batches: what the
        # trigger interval leaves idle is capacity, not work.
        return (until[0] - since[0]) / (until[1] - since[1])

    try:
        job.start()
        deadline = time.monotonic() + 900
        first: tuple[float, float] | None = None
        warm: tuple[float, float] | None = None
        while time.monotonic() < deadline:
            rows = job.counter("rows_in", query)
            if first is None and rows:
                first = counters()
            if warm is None and rows >= max(warm_up_rows, 1):
                warm = counters()
            if first is not None and warm is not None and rows >= total:
                end = counters()
                cold = rate(first, warm) if warm[0] > first[0] else rate(first, end)
                return PeakRates(warm=rate(warm, end), cold=cold)
            time.sleep(0.1)
        raise RuntimeError("the job did not read its backlog in time")
    finally:
        job.stop()


def latencies(
    kafka: KafkaSettings, state: Path, rate: int, seconds: int, entities: int, warm_up: int = 0
) -> list[float]:
    """Per window: arrival on the features topic minus when it could first
    close; the readings flow ``warm_up`` seconds first, whose windows are
    not counted (a job's first minute is its JVM compiling the queries' code,
    which a job that runs for hours pays once)."""
    job = Job(
        kafka,
        uuid.uuid4().hex[:8],
        state,
        AISTACK_TRANSFORM_TUMBLING_WINDOW_SECONDS="1",
        AISTACK_TRANSFORM_SLIDING_WINDOW_SECONDS="0",
        AISTACK_TRANSFORM_WATERMARK_SECONDS="0",
        AISTACK_TRANSFORM_TRIGGER_SECONDS="0.2",
        AISTACK_TRANSFORM_STARTING_OFFSETS="latest",
    )
    arrivals: dict[int, float] = {}  # window end (s) → first arrival
    done = threading.Event()

    def listen() -> None:
        consumer = Consumer(
            {
                **kafka.client_config(),
                "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 10,
            }
        )
        consumer.subscribe([job.features])
        while not done.is_set():
            for record in consumer.consume(500, timeout=0.05):
                if record.error():
                    continue
                now = time.time()
                value = record.value()
                assert value is not None  # error records are skipped above
                window = features_pb2.FeatureWindow.FromString(value)
                arrivals.setdefault(window.window_end.seconds, now)
        consumer.close()

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    producer = BusProducer(kafka, source="bench")
    closers: dict[int, float] = {}  # window end (s) → produce time of its first closer
    try:
        job.start()
        time.sleep(25)  # Spark's start-up and the first (empty) batches
        measured_from = time.time() + warm_up
        for _, now in steady_readings(producer, job.clean, rate, warm_up + seconds, entities):
            if now >= measured_from:
                closers.setdefault(int(now), now)
        time.sleep(10)
    finally:
        done.set()
        listener.join(timeout=10)
        job.stop()
    # Window [t-1, t) could close once an event at or after t was produced.
    measured = [arrivals[end] - closers[end] for end in sorted(arrivals) if end in closers]
    return measured[2:]  # the first windows straddle the start


def freshness(
    kafka: KafkaSettings, state: Path, rate: int, seconds: int, entities: int, warm_up: int = 0
) -> list[float]:
    """Per reading: the moment the online store holds a window that counts it,
    minus its event time (= when it was produced), with the job as deployed
    (60 s tumbling and 5 min sliding windows, 30 s watermark).

    A poller reads every entity's open tumbling window from Redis every 10 ms;
    a reading is counted once the window that holds it counts as many of the
    entity's readings as had been produced into it up to that one. The
    readings of the first ``warm_up`` seconds are not counted (as
    ``latencies``')."""
    job = Job(kafka, uuid.uuid4().hex[:8], state, AISTACK_TRANSFORM_STARTING_OFFSETS="latest")
    field = open_field(online_field("temperature", window_kind(60, 60)))
    names = [clean_event(e, 0, entities).entity_id for e in range(entities)]
    keys = [online_key(job.prefix, name) for name in names]
    # entity → window start (s) → (poll times, counts), counts never falling.
    seen: dict[str, dict[int, tuple[list[float], list[int]]]] = {n: {} for n in names}
    done = threading.Event()

    def poll() -> None:
        client = make_redis(redis_settings())
        pipe = client.pipeline(transaction=False)
        while not done.is_set():
            for key in keys:
                pipe.hget(key, field)
            values = pipe.execute()
            now = time.time()
            for name, value in zip(names, values, strict=True):
                if value is None:
                    continue
                window = decode_window(value)
                times, counts = seen[name].setdefault(window.window_start.seconds, ([], []))
                if not counts or window.count > counts[-1]:
                    times.append(now)
                    counts.append(window.count)
            time.sleep(0.01)
        client.close()

    poller = threading.Thread(target=poll, daemon=True)
    producer = BusProducer(kafka, source="bench")
    # (entity, window start, its k-th reading in that window, event time)
    readings: list[tuple[str, int, int, float]] = []
    produced: dict[tuple[str, int], int] = {}
    try:
        job.start()
        time.sleep(25)  # Spark's start-up and the first (empty) batches
        poller.start()
        measured_from = time.time() + warm_up
        for i, now in steady_readings(producer, job.clean, rate, warm_up + seconds, entities):
            slot = (names[i % entities], int(now) // 60 * 60)
            produced[slot] = produced.get(slot, 0) + 1
            if now >= measured_from:
                readings.append((*slot, produced[slot], now))
        time.sleep(5)
    finally:
        done.set()
        if poller.is_alive():
            poller.join(timeout=10)
        job.stop()
    waits = []
    for name, start, k, at in readings:
        times, counts = seen[name].get(start, ([], []))
        first = bisect.bisect_left(counts, k)
        if first < len(counts):
            waits.append(times[first] - at)
    if warm_up:
        return waits
    warm = int(len(readings) * 0.2)  # the first readings meet a cold query
    return waits[warm:] if len(waits) > warm else waits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=600_000)
    # Backlog rows the peak's job reads before its timed ``--count``: about a
    # minute of its reading, as the latency runs' ``--warm-up``.
    parser.add_argument("--peak-warm-up", type=int, default=900_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=40)
    # Readings before the closed windows' latency is measured: the job's JVM
    # compiles the queries' code in its first minute, as a job does once.
    parser.add_argument("--warm-up", type=int, default=60)
    # Devices in the latency run: each closes two 1 s windows a second.
    parser.add_argument("--entities", type=int, default=20)
    parser.add_argument(
        "--rounds", type=int, default=3, help="peak rounds; the median ratio counts"
    )
    parser.add_argument(
        "--only-freshness", action="store_true", help="measure the online freshness alone"
    )
    profiling.add_flag(parser, "transform_latency")
    args = parser.parse_args()
    kafka = kafka_settings()
    if args.only_freshness:
        with tempfile.TemporaryDirectory(prefix="aistack-bench-") as tmp:
            fresh = freshness(
                kafka, Path(tmp), args.rate, args.seconds, args.entities, warm_up=args.warm_up
            )
        report_freshness(fresh, args.rate, args.entities)
        return 0
    with tempfile.TemporaryDirectory(prefix="aistack-bench-") as tmp:
        state = Path(tmp)
        source = f"bench.raw.{uuid.uuid4().hex[:8]}"
        fill(kafka, source, 200_000)
        peaks: list[float] = []
        for round_ in range(args.rounds):
            # The transform's backlog advances at the ingest peak just measured.
            ingest = run_worker(kafka, source, 200_000, state)
            transform = peak_rate(kafka, state, args.count, ingest, args.peak_warm_up)
            peaks.append(transform.warm / ingest)
            print(
                f"round {round_ + 1}: ingest peak output {ingest:,.0f} events/s, transform "
                f"peak {transform.warm:,.0f} events/s read and windowed ({peaks[-1]:.2f}; "
                f"{transform.cold:,.0f} in the job's warm-up, {transform.cold / ingest:.2f})",
                flush=True,
            )
        waits = latencies(
            kafka, state, args.rate, args.seconds, args.entities, warm_up=args.warm_up
        )
        fresh = freshness(
            kafka, state, args.rate, args.seconds, args.entities, warm_up=args.warm_up
        )
    p50, p99 = percentiles(waits)
    print(
        f"closed windows at {args.rate} events/s from {args.entities} devices, {len(waits)} "
        f"windows: p50 {p50:.3f} s, p99 {p99:.3f} s from closable to the features topic"
    )

    # ingest is aistack's own stage: transform must keep up with it.
    print_ratio("transform_vs_ingest_peak", statistics.median(peaks), GOAL_RATIO, itself=True)
    print_ratio("transform_p50_vs_2s", GOAL_CLOSED_P50_SECONDS / p50, 1.0)
    report_freshness(fresh, args.rate, args.entities)
    return 0


def report_freshness(fresh: list[float], rate: int, entities: int) -> None:
    p50, p99 = percentiles(fresh)
    print(
        f"online freshness at {rate} events/s from {entities} devices, {len(fresh)} readings: "
        f"p50 {p50:.3f} s, p99 {p99:.3f} s from event time to Redis holding a window "
        "that counts it"
    )
    print_ratio("online_freshness_p50_vs_1s", GOAL_P50_SECONDS / p50, 1.0)


def percentiles(values: list[float]) -> tuple[float, float]:
    """p50 and p99."""
    p99 = statistics.quantiles(values, n=100)[98] if len(values) >= 2 else values[0]
    return statistics.median(values), p99


if __name__ == "__main__":
    raise SystemExit(main())
