"""svc_tuner against Optuna in one process: the same study, how fast and how well.

A 200-trial TPE study on an analytic objective (a quadratic in x and y, 0 at
its minimum, up to 50 on the search space), run two ways in the same run:

* aistack: through the tuner as deployed (``python -m svc_tuner``, gRPC,
  Kafka, Optuna's journal in Redis), with trainers replaced by consumers
  whose trials sleep a fixed time (``--sleep``, 0.5 s) before they compute
  the objective. Up to 8 trials are in flight: Kafka hands a consumer
  partitions, not records, so a trial lands on a random consumer, and a small
  backlog per consumer keeps both busy. Once with 1 consumer, once with 2
  (one consumer group); the wall time runs from CreateStudy to the study's
  end.
* in-process Optuna, what a user would run instead: ``study.optimize`` in one
  process with 2 threads (``n_jobs=2``; the sleep lets go of the GIL), the
  in-memory storage, the same objective with the same sleep, and the same
  sampler built from the same spec (TPE, 10 start-up trials, constant liar,
  multivariate, the same seed) for the same number of trials. Its wall time
  runs from ``create_study`` to the end of ``optimize``.

Both sides run two trials at a time, so the throughput ratio is what the bus
costs a study: the tuner's ask, publish and tell, Kafka both ways, the
journal, and the consumers' unequal share of partitions. Trials in flight
make both searches depend on timing, so their best values differ by chance;
they are compared above a tolerance (0.01, a fiftieth of a percent of the
objective's range) under which two best values count as the same.

Prints a line per run, then, higher always better:

    aistack_vs_inprocess_optuna_trials_per_s: ratio R (goal 0.9)
        trials per second of wall time, aistack with 2 consumers over
        in-process Optuna with 2 threads (the goal of bench.study_speedup's
        bus_vs_inprocess, the same question with real trainers).
    best_value_vs_inprocess_optuna: ratio R (goal 0.9)
        (peer's best + 0.01) over (aistack's best + 0.01), both from the
        runs above; the study minimises, so R >= 1 when aistack's best is
        at least as low.
    two_vs_one_consumer: ratio R (goal 1.8) [aistack against itself]
        wall time with 1 consumer over wall time with 2.
    trial_vs_overhead: ratio R (goal 20) [aistack against itself]
        median trial time over the tuner's engine time per trial (ask,
        publish, tell, storage; its own counter), the larger of the two
        runs'. The trial time is the bench's own ``--sleep``, so this is a
        budget for the tuner, not a comparison with a peer.

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

from aistack.studies import load_spec
from bench import profiling
from bench.harness import print_ratio
from bench.services import TunerUnderTest, run_study
from shared.bus.consumer import BusConsumer
from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import tuning_pb2
from shared.errors import Unavailable
from shared.search_space import python_value
from shared.settings import KafkaSettings
from svc_tuner.spec import sampler

GOAL_VS_INPROCESS = 0.9
GOAL_BEST_VALUE = 0.9
GOAL_SCALING = 1.8
GOAL_OVERHEAD = 20
#: Best values closer than this count as the same (the objective spans 0 to 50).
BEST_VALUE_TOLERANCE = 0.01
#: Consumers in the run compared with the peer, and the peer's threads.
WORKERS = 2

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


def in_process_study(trials: int, sleep: float, seed: int, workers: int) -> dict[str, float]:
    """The peer: the spec's sampler in ``study.optimize`` with ``workers``
    threads, each trial the consumers' sleep and then the objective; its wall
    time, best value and trials completed."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_spec(SPEC.format(suffix="inprocess", trials=trials, seed=seed))
    x_range, y_range = (p.float_range for p in spec.params)

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", x_range.low, x_range.high)
        y = trial.suggest_float("y", y_range.low, y_range.high)
        time.sleep(sleep)
        return quadratic(x, y)

    started = time.perf_counter()
    study = optuna.create_study(sampler=sampler(spec))
    study.optimize(objective, n_trials=trials, n_jobs=workers)
    wall = time.perf_counter() - started
    completed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return {"wall": wall, "best": float(study.best_value), "completed": float(len(completed))}


def best_value_ratio(
    aistack_best: float, peer_best: float, tolerance: float = BEST_VALUE_TOLERANCE
) -> float:
    """The peer's best over aistack's, both minimised and shifted by
    ``tolerance``: >= 1 when aistack's is at least as low, near 1 when both
    are within ``tolerance`` of each other near the minimum, where a bare
    ratio of two tiny values would swing on noise."""
    return (peer_best + tolerance) / (aistack_best + tolerance)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--sleep", type=float, default=0.5, help="seconds per trial")
    parser.add_argument("--seed", type=int, default=42)
    profiling.add_flag(parser, "tuner_overhead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aistack-bench-") as tmp:
        one = measure(1, args.trials, args.sleep, args.seed, Path(tmp))
        two = measure(WORKERS, args.trials, args.sleep, args.seed, Path(tmp))
    peer = in_process_study(args.trials, args.sleep, args.seed, WORKERS)
    for name, run in (("aistack, 1 consumer", one), (f"aistack, {WORKERS} consumers", two)):
        print(
            f"{name}: {args.trials} trials in {run['wall']:.1f} s "
            f"({args.trials / run['wall']:.2f} trials/s); median trial "
            f"{run['trial'] * 1000:.0f} ms; tuner overhead {run['overhead'] * 1000:.1f} ms/trial; "
            f"best {run['best']:.5f}"
        )
    print(
        f"in-process Optuna, {WORKERS} threads, same sampler, seed and sleep: {args.trials} "
        f"trials in {peer['wall']:.1f} s ({peer['completed'] / peer['wall']:.2f} trials/s); "
        f"best {peer['best']:.5f}"
    )
    print_ratio(
        "aistack_vs_inprocess_optuna_trials_per_s",
        (args.trials / two["wall"]) / (peer["completed"] / peer["wall"]),
        GOAL_VS_INPROCESS,
    )
    print_ratio(
        "best_value_vs_inprocess_optuna",
        best_value_ratio(two["best"], peer["best"]),
        GOAL_BEST_VALUE,
    )
    overhead = max(one["overhead"], two["overhead"])
    trial = statistics.median([one["trial"], two["trial"]])
    print_ratio("two_vs_one_consumer", one["wall"] / two["wall"], GOAL_SCALING, itself=True)
    print_ratio("trial_vs_overhead", trial / overhead, GOAL_OVERHEAD, digits=1, itself=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
