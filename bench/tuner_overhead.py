"""svc_tuner's overhead per trial, and how the wall time scales with consumers.

A 200-trial TPE study on an analytic objective (a quadratic in x and y),
through the tuner as deployed (``python -m svc_tuner``, gRPC, Kafka, Optuna's
journal in Redis), with trainers replaced by consumers whose trials sleep a
fixed time (0.5 s). Up to 8 trials are in flight: Kafka hands a consumer
partitions, not records, so a trial lands on a random consumer, and a small
backlog per consumer keeps both busy.

1. With 1 consumer, then 2 (one consumer group): the wall time of the study.
2. The tuner's overhead per trial: the time its engine thread spent (ask,
   publish, tell, storage; its own counter) over the trials run.
3. Peer: the same sampler and seed in plain in-process Optuna, for the best
   value the search reaches without the bus.

Prints, higher always better:

    two_vs_one_consumer: ratio R (goal 1.8)
    trial_vs_overhead: ratio R (goal 20)

Needs a broker and Redis: ``aistack infra up``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import optuna

from bench.harness import print_ratio
from bench.services import TunerUnderTest, run_study
from shared.bus.consumer import BusConsumer
from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import tuning_pb2
from shared.errors import Unavailable
from shared.settings import KafkaSettings
from svc_tuner.spec import python_value

GOAL_SCALING = 1.8
GOAL_OVERHEAD = 20

SPEC = """
name: bench-{suffix}
objective: {{metric: loss, direction: DIRECTION_MINIMIZE}}
params:
  - {{name: x, float_range: {{low: -4.0, high: 4.0}}}}
  - {{name: y, float_range: {{low: -3.0, high: 3.0}}}}
sampler: {{kind: SAMPLER_KIND_TPE, startup_trials: 10}}
pruner: {{kind: PRUNER_KIND_NONE}}
budget: {{max_trials: {trials}, max_parallel: 8, trial_timeout: 60s}}
task: {{dataset: analytic, framework: FRAMEWORK_TORCH, epochs: 1}}
seed: {seed}
"""


def quadratic(x: float, y: float) -> float:
    return (x - 1.0) ** 2 + (y + 2.0) ** 2


class SleepyConsumer(threading.Thread):
    """A trainer stand-in: one trial at a time, each a fixed sleep, then the objective."""

    def __init__(self, kafka: KafkaSettings, topics: dict[str, str], group: str, sleep: float):
        super().__init__(daemon=True)
        self._kafka, self._topics, self._group, self._sleep = kafka, topics, group, sleep
        self.stopping = threading.Event()
        self.trial_seconds: list[float] = []

    def run(self) -> None:
        consumer: BusConsumer[tuning_pb2.TrialRequested] = BusConsumer(
            self._kafka,
            group_id=self._group,
            topics=[self._topics["trials"]],
            message_cls=tuning_pb2.TrialRequested,
        )
        producer = BusProducer(self._kafka, source="bench-trainer")
        pending: list[tuning_pb2.TrialRequested] = []
        seen: set[tuple[str, int]] = set()
        try:
            while not self.stopping.is_set():
                records = consumer.poll_batch(50, timeout=0.01)
                for record in records:
                    request = record.decode()
                    # A rebalance hands records over again: one run per attempt.
                    if (request.trial_id, request.attempt) not in seen:
                        seen.add((request.trial_id, request.attempt))
                        pending.append(request)
                if records:
                    try:
                        consumer.commit(records)
                    except Unavailable:
                        pass  # the group rebalanced: the new owner reads them again
                if not pending:
                    continue
                request = pending.pop(0)
                started = time.perf_counter()
                time.sleep(self._sleep)
                x, y = (python_value(request.params[n]) for n in ("x", "y"))
                assert isinstance(x, float) and isinstance(y, float)
                report = tuning_pb2.TrialReport(
                    trial_id=request.trial_id,
                    study_id=request.study_id,
                    attempt=request.attempt,
                    completed=tuning_pb2.TrialCompleted(value=quadratic(x, y)),
                )
                producer.publish(self._topics["reports"], report, key=request.study_id)
                producer.flush()
                self.trial_seconds.append(time.perf_counter() - started)
        finally:
            consumer.close()


def measure(consumers: int, trials: int, sleep: float, seed: int, state: Path) -> dict[str, float]:
    tuner = TunerUnderTest(state)
    group = f"bench-trainers-{uuid.uuid4().hex[:8]}"
    workers = [SleepyConsumer(tuner.kafka, tuner.topics, group, sleep) for _ in range(consumers)]
    for worker in workers:
        worker.start()
    try:
        time.sleep(3)  # the consumer group settles before the first trial
        before = tuner.engine_seconds()
        spec = SPEC.format(suffix=uuid.uuid4().hex[:8], trials=trials, seed=seed)
        wall, best = asyncio.run(run_study(tuner, spec))
        engine = tuner.engine_seconds() - before
    finally:
        for worker in workers:
            worker.stopping.set()
        for worker in workers:
            worker.join(timeout=30)
        tuner.stop()
    seconds = [s for w in workers for s in w.trial_seconds]
    return {
        "wall": wall,
        "best": best,
        "overhead": engine / trials,
        "trial": statistics.median(seconds),
    }


def in_process_best(trials: int, seed: int) -> float:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=10, constant_liar=True, multivariate=True
    )
    study = optuna.create_study(sampler=sampler)
    study.optimize(
        lambda t: quadratic(t.suggest_float("x", -4.0, 4.0), t.suggest_float("y", -3.0, 3.0)),
        n_trials=trials,
    )
    return float(study.best_value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--sleep", type=float, default=0.5, help="seconds per trial")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aistack-bench-") as tmp:
        one = measure(1, args.trials, args.sleep, args.seed, Path(tmp))
        two = measure(2, args.trials, args.sleep, args.seed, Path(tmp))
    peer = in_process_best(args.trials, args.seed)
    for name, run in (("1 consumer", one), ("2 consumers", two)):
        print(
            f"{name}: {args.trials} trials in {run['wall']:.1f} s; median trial "
            f"{run['trial'] * 1000:.0f} ms; tuner overhead {run['overhead'] * 1000:.1f} ms/trial; "
            f"best {run['best']:.5f}"
        )
    print(f"in-process Optuna, same sampler and seed: best {peer:.5f}")
    overhead = max(one["overhead"], two["overhead"])
    trial = statistics.median([one["trial"], two["trial"]])
    print_ratio("two_vs_one_consumer", one["wall"] / two["wall"], GOAL_SCALING, itself=True)
    print_ratio("trial_vs_overhead", trial / overhead, GOAL_OVERHEAD, digits=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
