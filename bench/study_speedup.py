"""One digits study four ways in one run: is tuning over the bus as fast as
the tools a user has today?

The same study each way: N trials (16) of the digits CNN, the tuner's own
seeded sampler for the spec (TPE: constant liar, multivariate), three parameters
(learning rate, dropout, units), 8 epochs, no pruning, the project's own
PyTorch runner (train, then ``torch.export`` the model, as every aistack
trial does), one intra-op thread per trial, digits' fixed split, each
trial's seed the study seed + its number. Timed from the study's start to
its end:

1. plain in-process Optuna: ``study.optimize`` calling the runner; the
   process is warm (torch imported, ``torch.export`` warmed up), and the
   first trial loads the data;
2. Ray Tune with ``reuse_actors`` and Optuna's TPE (``OptunaSearch``), one
   trial at a time; Ray is started before the clock, its trial actor is
   started by the study (as with every ``Tuner.fit``) and keeps the data
   it loaded for the trials after the first;
3. aistack with 1 trainer: ``python -m svc_tuner`` and ``python -m
   svc_trainer`` as deployed, on Kafka and Redis, one trial at a time; the
   trainer is running and its warm executor ready before the study, and
   the first trial loads the data;
4. aistack with 2 trainers: the same with 2 trials in flight, one per
   trainer (the tuner places each where a trainer is free, by the trainers'
   group's assignment; more in flight would queue trials on trainers and
   give TPE more trials to lie about).

After each aistack way, the CPU seconds each part used over the study: the
trials' executors, the trainer services, the tuner, and the broker and
Redis where ``aistack infra up`` runs them, beside what the cores could
give in that time (what none of them used, the cores stood idle).

Every way runs ``--rounds`` times (3), in an order reversed every other
round (``bench.harness.round_order``), so that the machine's drift over the
minutes of a run favours none of them. Prints each way's line per round
and then, higher always better, the median over rounds of each round's
ratio:

    bus_vs_ray_tune: ratio R (goal 1.0)            Ray Tune's wall time / aistack's, 1 at a time
    bus_vs_inprocess: ratio R (goal 0.95)          in-process wall time / aistack's, 1 at a time
    two_trainers_vs_inprocess: ratio R (goal 1.8)  in-process wall time / aistack's with 2 trainers

Needs a broker and Redis (``aistack infra up``) and Ray Tune (the ``bench``
group). With one trial at a time, the three sequential ways train the same
configurations with the same seeds; their best values are printed side by
side as a check.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Triton (torch.export's compiler) before anything that may load TensorFlow.
with contextlib.suppress(ImportError):
    import triton  # noqa: F401

import optuna

from bench import profiling
from bench.harness import (
    cpu_seconds,
    infra_pids,
    print_ratio,
    ray_tune_one_at_a_time,
    round_order,
    tree_cpu_seconds,
)
from bench.services import Trainers, TunerUnderTest, run_study

ONE = "aistack, 1 trainer"
TWO = "aistack, 2 trainers"
RAY = "Ray Tune (reuse_actors)"
IN_PROCESS = "in-process Optuna"
WAYS = [ONE, TWO, RAY, IN_PROCESS]
GOAL_RAY = 1.0
GOAL_INPROCESS = 0.95
GOAL_TWO = 1.8
SEED = 7
STARTUP_TRIALS = 5
EPOCHS = 8

SPEC = """
name: speedup-{suffix}
objective: {{metric: val_error, direction: DIRECTION_MINIMIZE}}
params:
  - {{name: learning_rate, float_range: {{low: 1.0e-3, high: 2.0e-2, log: true}}}}
  - {{name: dropout, float_range: {{low: 0.0, high: 0.6, step: 0.05}}}}
  - {{name: units, int_range: {{low: 64, high: 512, log: true}}}}
sampler: {{kind: SAMPLER_KIND_TPE, startup_trials: {startup}}}
pruner: {{kind: PRUNER_KIND_NONE}}
budget: {{max_trials: {trials}, max_parallel: {parallel}, trial_timeout: 300s}}
task: {{dataset: digits, model_family: cnn, framework: FRAMEWORK_TORCH, strategy: single,
        epochs: {epochs}, model_name: speedup-{suffix}}}
seed: {seed}
"""


def suggest(trial: optuna.Trial) -> dict[str, Any]:
    """The space of SPEC, define-by-run (in-process Optuna and Ray Tune)."""
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-3, 2e-2, log=True),
        "dropout": trial.suggest_float("dropout", 0.0, 0.6, step=0.05),
        "units": trial.suggest_int("units", 64, 512, log=True),
    }


def sampler() -> optuna.samplers.BaseSampler:
    """The sampler svc_tuner asks with for the spec above (each trial sampled
    by a TPE seeded for it alone): one trial at a time, every way trains the
    same configurations (a TPESampler seeded once proposed others, of other
    sizes and costs)."""
    from aistack.studies import load_spec
    from svc_tuner.spec import seeded_sampler

    spec = SPEC.format(
        suffix="inprocess", startup=STARTUP_TRIALS, trials=1, parallel=1, epochs=EPOCHS, seed=SEED
    )
    return seeded_sampler(load_spec(spec))


@dataclass(frozen=True)
class Outcome:
    wall: float
    best: float
    trials: int
    note: str = ""
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds by part, over the study


# ---- one trial, the same function for the in-process and Ray ways -----------------------


_DATA: Any = None


class _Quiet:
    def started(self, resumed_from_step: int, note: str = "") -> None:
        pass

    def epoch(self, step: int, metrics: Any) -> None:
        pass

    def stop_requested(self) -> Any:
        from svc_trainer.plan import StopReason

        return StopReason.NONE


def train_one(params: dict[str, Any], number: int) -> float:
    """The trial aistack's trainer runs for this request, in this process:
    the digits data (loaded once per process), the runner, the export."""
    global _DATA
    import torch

    from svc_trainer.backends.torch import runner as torch_runner
    from svc_trainer.data.datasets import load
    from svc_trainer.plan import Hyperparams, RunSpec

    torch.set_num_threads(1)
    if _DATA is None:
        _DATA = load("digits", {}, seed=0)
    with tempfile.TemporaryDirectory(prefix="speedup-") as scratch:
        spec = RunSpec(
            trial_id=f"speedup/{number}",
            study_id="speedup",
            trial_number=number,
            attempt=1,
            dataset="digits",
            model_family="cnn",
            framework="torch",
            strategy="single",
            world_size=1,
            epochs=EPOCHS,
            hparams=Hyperparams.from_params(params),
            seed=SEED + number,
            objective_metric="val_error",
            checkpoint_dir=f"{scratch}/checkpoints",
            export_dir=f"{scratch}/export",
            tensorboard_dir=f"{scratch}/tensorboard",
            device="cpu",
            threads=1,
        )
        result = torch_runner.RUNNER.run(spec, _DATA, _Quiet())
    return float(result.val_metrics["val_error"])


# ---- 1: in-process Optuna ---------------------------------------------------------------


def in_process(trials: int) -> Outcome:
    from svc_trainer.backends.torch import runner as torch_runner

    global _DATA
    torch_runner.RUNNER.warm_up(1)
    _DATA = None  # every way loads the data in its first trial, in every round
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=sampler())
    started = time.perf_counter()
    study.optimize(lambda t: train_one(suggest(t), t.number), n_trials=trials)
    return Outcome(time.perf_counter() - started, float(study.best_value), trials)


# ---- 2: Ray Tune ------------------------------------------------------------------------


def ray_trainable(config: dict[str, Any]) -> None:
    from ray import tune

    params = {k: v for k, v in config.items() if k != "trial_number"}
    tune.report({"val_error": train_one(params, int(config["trial_number"]))})


def define_space(trial: optuna.Trial) -> dict[str, int]:
    suggest(trial)
    # A constant for the trainable: the Optuna trial's number (its seed).
    return {"trial_number": trial.number}


def ray_tune(trials: int) -> Outcome:
    wall, best, count = ray_tune_one_at_a_time(
        ray_trainable, define_space, sampler(), metric="val_error", trials=trials
    )
    return Outcome(wall, best, count)


# ---- 3 and 4: aistack -------------------------------------------------------------------


def on_the_bus(trainers: int, trials: int, state: Path) -> Outcome:
    """A tuner and ``trainers`` trainers on topics of their own."""
    tuner = TunerUnderTest(state)
    replicas = Trainers(tuner, trainers, state)
    try:
        replicas.wait_warm()
        parallel = trainers
        spec = SPEC.format(
            suffix=uuid.uuid4().hex[:8],
            startup=STARTUP_TRIALS,
            trials=trials,
            parallel=parallel,
            epochs=EPOCHS,
            seed=SEED,
        )
        before = cpu_by_part(tuner, replicas)
        wall, best = asyncio.run(run_study(tuner, spec))
        after = cpu_by_part(tuner, replicas)
        used = {part: after[part] - before[part] for part in after}
        return Outcome(wall, best, trials, f"{parallel} in flight", used)
    finally:
        replicas.stop()
        tuner.stop()


def cpu_by_part(tuner: TunerUnderTest, replicas: Trainers) -> dict[str, float]:
    """CPU seconds used so far by the trials' executors (the processes below
    the trainers) and by the platform's own processes: where two trainers'
    cores go besides training."""
    services = sum(cpu_seconds(p.pid) for p in replicas.processes)
    trees = sum(tree_cpu_seconds(p.pid) for p in replicas.processes)
    parts = {
        "trial executors": trees - services,
        "trainer services": services,
        "tuner": tree_cpu_seconds(tuner.process.pid),
    }
    parts.update({name: cpu_seconds(pid) for name, pid in infra_pids().items()})
    return parts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    profiling.add_flag(parser, "study_speedup")
    args = parser.parse_args()

    def show(name: str, outcome: Outcome) -> Outcome:
        note = f" ({outcome.note})" if outcome.note else ""
        print(
            f"{name}: {outcome.trials} trials in {outcome.wall:.1f} s, "
            f"{outcome.wall / outcome.trials:.2f} s/trial; best val_error {outcome.best:.4f}{note}",
            flush=True,
        )
        if outcome.cpu:
            cores = os.cpu_count() or 1
            parts = ", ".join(f"{part} {seconds:.1f} s" for part, seconds in outcome.cpu.items())
            print(
                f"  CPU over the study: {parts}; {cores} cores give "
                f"{cores * outcome.wall:.1f} s in {outcome.wall:.1f} s",
                flush=True,
            )
        return outcome

    walls: dict[str, list[float]] = {name: [] for name in WAYS}
    with tempfile.TemporaryDirectory(prefix="aistack-bench-") as tmp:
        ways: dict[str, Callable[[], Outcome]] = {
            ONE: lambda: on_the_bus(1, args.trials, Path(tmp)),
            TWO: lambda: on_the_bus(2, args.trials, Path(tmp)),
            RAY: lambda: ray_tune(args.trials),
            IN_PROCESS: lambda: in_process(args.trials),
        }
        for number in range(args.rounds):
            for name in round_order(WAYS, number):
                outcome = show(f"round {number + 1}, {name}", ways[name]())
                walls[name].append(outcome.wall)
    print_ratio("bus_vs_ray_tune", median_ratio(walls[RAY], walls[ONE]), GOAL_RAY)
    print_ratio("bus_vs_inprocess", median_ratio(walls[IN_PROCESS], walls[ONE]), GOAL_INPROCESS)
    print_ratio("two_trainers_vs_inprocess", median_ratio(walls[IN_PROCESS], walls[TWO]), GOAL_TWO)
    return 0


def median_ratio(peer: list[float], ours: list[float]) -> float:
    """The median over rounds of the peer's wall time over ours, each round's
    two taken minutes apart at most."""
    return statistics.median(p / o for p, o in zip(peer, ours, strict=True))


if __name__ == "__main__":
    raise SystemExit(main())
