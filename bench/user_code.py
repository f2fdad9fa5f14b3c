"""A user's own training function tuned three ways in one run: what does
bringing your code to aistack cost against the tools a user has today?

The function is the example project's loop
(``examples/user_project/mymodels/train_loop.py``: a PyTorch MLP of its
own, its own loop, a checkpoint and a report each epoch, the model exported
at the end) on a table the benchmark writes as Parquet (scikit-learn's
``make_classification``: 20,000 rows, 30 features, two classes; about two
seconds of training a trial in one thread), the same table and split for
all (the ``table`` dataset, seed 0), 12 trials of TPE with the tuner's own
sampler (``svc_tuner.spec.seeded_sampler``: seeded per trial, constant liar,
multivariate, 4 start-up trials) over the learning rate, the width and the
batch size, one trial at a time, one intra-op thread, each trial's seed the
study's + its number:

1. **aistack**: ``python -m svc_tuner`` and one ``python -m svc_trainer`` as
   deployed, on Kafka and Redis; the code shipped with the study
   (``--code``: packed, stored, fetched and verified by the trainer, run in
   an executor of its own that the study's first trial starts, as Ray's
   actor is started by its study); each trial's model exported and
   published.
2. **Ray Tune**: the same function as a function trainable
   (``tune.report`` for each report, through ``aistack.local.run``),
   ``OptunaSearch`` with the same sampler, ``reuse_actors``; Ray started
   before the clock.
3. **in-process Optuna**: ``study.optimize`` calling the same function
   through ``aistack.local.run``, warm (torch imported).

The exports and checkpoints happen all three ways. Timed from the study's
start to its end. Prints the three best values side by side, then, higher
always better (wall-time ratios):

    user_code_vs_ray_tune: ratio R (goal 1.0)   Ray Tune's wall time / aistack's
    user_code_vs_inprocess: ratio R (goal 0.9)  in-process Optuna's / aistack's

Needs a broker and Redis (``aistack infra up``) and Ray Tune (the ``bench``
group).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from bench import profiling
from bench.harness import ROOT, print_ratio, ray_tune_one_at_a_time
from bench.services import Trainers, TunerUnderTest, run_study
from shared.object_store import settings_env
from shared.settings import ObjectStoreSettings

GOAL_RAY = 1.0
GOAL_INPROCESS = 0.9
SEED = 7
STARTUP_TRIALS = 4
EPOCHS = 12
EXAMPLE = ROOT / "examples" / "user_project"
ENTRYPOINT = "mymodels.train_loop:train"
LABEL = "label"
ROWS = 20_000

SPEC = """
name: user-code-{suffix}
objective: {{metric: val_loss, direction: DIRECTION_MINIMIZE}}
params:
  - {{name: lr, float_range: {{low: 1.0e-3, high: 5.0e-2, log: true}}}}
  - {{name: width, int_range: {{low: 8, high: 64, log: true}}}}
  - name: batch_size
    categorical: {{choices: [{{int_value: 16}}, {{int_value: 32}}, {{int_value: 64}}]}}
sampler: {{kind: SAMPLER_KIND_TPE, startup_trials: {startup}}}
pruner: {{kind: PRUNER_KIND_NONE}}
budget: {{max_trials: {trials}, max_parallel: 1, trial_timeout: 300s}}
task:
  dataset: table
  options: {{path: "{table}", label: {label}}}
  entrypoint: {entrypoint}
  framework: FRAMEWORK_TORCH
  strategy: single
  epochs: {epochs}
  model_name: user-code-{suffix}
seed: {seed}
"""


def suggest(trial: optuna.Trial) -> dict[str, Any]:
    """SPEC's space, define-by-run (in-process Optuna and Ray Tune)."""
    return {
        "lr": trial.suggest_float("lr", 1e-3, 5e-2, log=True),
        "width": trial.suggest_int("width", 8, 64, log=True),
        "batch_size": trial.suggest_categorical("batch_size", [16, 32, 64]),
    }


def sampler() -> optuna.samplers.BaseSampler:
    """The tuner's own sampler for SPEC: the same proposals every way."""
    from aistack.studies import load_spec
    from svc_tuner.spec import seeded_sampler

    text = SPEC.format(
        suffix="x", startup=STARTUP_TRIALS, trials=12, table="t", label=LABEL,
        entrypoint=ENTRYPOINT, epochs=EPOCHS, seed=SEED,
    )  # fmt: skip
    return seeded_sampler(load_spec(text))


@dataclass(frozen=True)
class Outcome:
    wall: float
    best: float
    trials: int


# ---- the user's function, run locally (Ray Tune and in-process Optuna) ----------------


_DATA: Any = None


def train_locally(params: dict[str, Any], number: int, table: str, report: Any) -> float:
    """The user's loop in this process through ``aistack.local.run``, on
    the data the trainer loads for the same task."""
    global _DATA
    import torch

    from aistack import local
    from svc_trainer.data.datasets import load
    from svc_trainer.user_code.imports import resolve
    from svc_trainer.user_code.loop import dataset_view

    torch.set_num_threads(1)
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    if _DATA is None:
        _DATA = dataset_view(load("table", {"path": table, "label": LABEL}, seed=0))
    with tempfile.TemporaryDirectory(prefix="user-code-") as scratch:
        result = local.run(
            resolve(ENTRYPOINT, "task.entrypoint"),
            params=params,
            data=_DATA,
            objective="val_loss",
            epochs=EPOCHS,
            seed=SEED + number,
            report=report,
            checkpoint_dir=Path(scratch) / "checkpoints",
            export_dir=Path(scratch) / "export",
        )
    return float(result.metrics["val_loss"])


def in_process(trials: int, table: str) -> Outcome:
    import torch

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    global _DATA
    # Warm (torch imported, torch.export traced once); the first trial loads
    # the data, as aistack's and Ray's first trials do.
    train_locally({"lr": 0.01, "width": 8, "batch_size": 64}, 0, table, None)
    _DATA = None
    study = optuna.create_study(sampler=sampler())
    started = time.perf_counter()
    study.optimize(lambda t: train_locally(suggest(t), t.number, table, None), n_trials=trials)
    return Outcome(time.perf_counter() - started, float(study.best_value), trials)


def ray_trainable(config: dict[str, Any]) -> None:
    from ray import tune

    params = {k: v for k, v in config.items() if k not in ("trial_number", "table")}

    def report(step: int, metrics: Any) -> None:
        tune.report(dict(metrics))

    train_locally(params, int(config["trial_number"]), str(config["table"]), report)


_TABLE = ""


def define_space(trial: optuna.Trial) -> dict[str, Any]:
    """SPEC's space for OptunaSearch (which pickles it: a module's function),
    and the constants the trainable needs: the trial's number (its seed) and
    the table."""
    suggest(trial)
    return {"trial_number": trial.number, "table": _TABLE}


def ray_tune(trials: int, table: str) -> Outcome:
    global _TABLE
    _TABLE = table
    wall, best, count = ray_tune_one_at_a_time(
        ray_trainable,
        define_space,
        sampler(),
        metric="val_loss",
        trials=trials,
        pythonpath=(ROOT, EXAMPLE),
    )
    return Outcome(wall, best, count)


# ---- aistack ----------------------------------------------------------------------------


def on_the_bus(
    trials: int,
    table: str,
    state: Path,
    *,
    artifacts: str = "",
    object_store: ObjectStoreSettings | None = None,
) -> Outcome:
    """The study through svc_tuner and one svc_trainer; ``artifacts``: the
    trainer's artifact store (default: a directory of ``state``), on the
    object store ``object_store`` describes when it is a URL."""
    from aistack.studies import ship_code

    artifacts = artifacts or str(state / "artifacts")
    env = {"AISTACK_TRAINER_ARTIFACT_ROOT": artifacts}
    if object_store is not None:
        env |= settings_env(object_store)
    tuner = TunerUnderTest(state)
    trainer = Trainers(tuner, 1, state, extra=env)
    try:
        trainer.wait_warm(executors=2)  # the torch executor and the spare a package takes
        spec = SPEC.format(
            suffix=uuid.uuid4().hex[:8],
            startup=STARTUP_TRIALS,
            trials=trials,
            table=table,
            label=LABEL,
            entrypoint=ENTRYPOINT,
            epochs=EPOCHS,
            seed=SEED,
        )
        package = ship_code(EXAMPLE, artifacts, object_store)
        wall, best = asyncio.run(run_study(tuner, spec, code=package))
        return Outcome(wall, best, trials)
    finally:
        trainer.stop()
        tuner.stop()


def write_table(path: Path) -> str:
    """The benchmark's table: ROWS rows of scikit-learn's make_classification."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=ROWS, n_features=30, n_informative=12, random_state=0)
    columns: dict[str, Any] = {f"f{i}": x[:, i] for i in range(x.shape[1])}
    columns[LABEL] = y
    pq.write_table(pa.table(columns), path)
    return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=12)
    profiling.add_flag(parser, "user_code")
    args = parser.parse_args()
    sys.path.insert(0, str(EXAMPLE))

    def show(name: str, outcome: Outcome) -> Outcome:
        print(
            f"{name}: {outcome.trials} trials in {outcome.wall:.1f} s, "
            f"{outcome.wall / outcome.trials:.2f} s/trial; best val_loss {outcome.best:.4f}",
            flush=True,
        )
        return outcome

    with tempfile.TemporaryDirectory(prefix="aistack-bench-") as tmp:
        table = write_table(Path(tmp) / "table.parquet")
        bus = show("aistack (--code)", on_the_bus(args.trials, table, Path(tmp)))
        ray_way = show("Ray Tune (function trainable)", ray_tune(args.trials, table))
        local = show("in-process Optuna", in_process(args.trials, table))
    print(
        f"best val_loss side by side: aistack {bus.best:.4f}, Ray Tune {ray_way.best:.4f}, "
        f"in-process {local.best:.4f}"
    )
    print_ratio("user_code_vs_ray_tune", ray_way.wall / bus.wall, GOAL_RAY)
    print_ratio("user_code_vs_inprocess", local.wall / bus.wall, GOAL_INPROCESS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
