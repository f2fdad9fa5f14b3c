"""Does tuning pay? The demo's digits study through the bus, then the default
configuration, the tuned one and scikit-learn's SVC compared by k-fold
cross-validation over all 1,797 digits.

1. The study of ``examples/studies/digits-demo.yaml`` (64 trials, TPE, ASHA,
   PyTorch and TensorFlow trials, selected by validation loss on the fixed
   split) through svc_tuner and two svc_trainer replicas as deployed.
2. The default configuration (``Hyperparams``' defaults) and the study's
   best configuration, each cross-validated in 10 stratified folds (one
   trial per fold, over the trainers; the same folds for both), and the SVC
   (scikit-learn's defaults) on the same folds. The tuned configuration was
   chosen on the study's validation split only, never on the folds' scores.

Prints each configuration's mean error with its 95% interval, the paired
t-tests on the folds, and, higher always better:

    tuned_vs_default_error: ratio R (goal 1.52)   default's error / tuned's (34% less error: 1.52)
    tuned_vs_svc_error: ratio R (goal 1.0)        the SVC's error / tuned's

Needs a broker and Redis: ``aistack infra up``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aistack.studies import describe_trial, load_spec
from bench import profiling
from bench.harness import ROOT, print_ratio
from bench.services import Trainers, TunerUnderTest
from demo import kfold
from demo.kfold import cross_validation_spec, study_fold_errors
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub
from shared.rpc.client import open_channel

GOAL_DEFAULT = 1 / (1 - 0.34)
GOAL_SVC = 1.0


async def tune_and_cross_validate(
    tuner: TunerUnderTest, trials: int, folds: int
) -> tuple[list[float], list[float]]:
    """The default's and the tuned configuration's fold errors (the study's
    best and its wall time are printed)."""
    async with open_channel(tuner.grpc) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=60)
        stub = TunerServiceStub(channel)  # type: ignore[no-untyped-call]
        spec = load_spec((ROOT / "examples" / "studies" / "digits-demo.yaml").read_text())
        suffix = uuid.uuid4().hex[:8]
        spec.name = f"gain-{suffix}"
        spec.task.model_name = f"gain-{suffix}"
        spec.budget.max_trials = trials
        started = time.perf_counter()
        await stub.CreateStudy(api.CreateStudyRequest(spec=spec))
        best = await _until_done(stub, spec.name)
        wall = time.perf_counter() - started
        print(f"study: {trials} trials in {wall:.0f} s; best {describe_trial(best)}", flush=True)
        cross = {
            label: cross_validation_spec(spec, f"gain-cv-{label}-{suffix}", params, folds)
            for label, params in (("default", {}), ("tuned", dict(best.params)))
        }
        for cv in cross.values():
            await stub.CreateStudy(api.CreateStudyRequest(spec=cv))
        errors = []
        for cv in cross.values():
            await _until_done(stub, cv.name)
            listed = await stub.ListTrials(api.ListTrialsRequest(study_id=cv.name))
            errors.append(study_fold_errors(listed.trials, folds))
        return errors[0], errors[1]


async def _until_done(stub: Any, study_id: str) -> api.Trial:
    async for update in stub.WatchStudy(api.WatchStudyRequest(study_id=study_id)):
        if update.study_state != api.STUDY_STATE_RUNNING:
            break
    study = await stub.GetStudy(api.GetStudyRequest(study_id=study_id))
    if not study.study.HasField("best_trial"):
        raise RuntimeError(f"study {study_id} completed no trial: {dict(study.study.trial_counts)}")
    best: api.Trial = study.study.best_trial
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--folds", type=int, default=10)
    profiling.add_flag(parser, "tuning_gain")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aistack-bench-") as tmp:
        state = Path(tmp)
        tuner = TunerUnderTest(state)
        trainers = Trainers(tuner, 2, state, warm="torch,tensorflow")
        try:
            trainers.wait_warm()
            default, tuned = asyncio.run(tune_and_cross_validate(tuner, args.trials, args.folds))
        finally:
            trainers.stop()
            tuner.stop()
    svc = kfold.svc_fold_errors(args.folds)
    for name, errors in (("default CNN", default), ("tuned CNN", tuned), ("SVC", svc)):
        print(f"{name}: error {kfold.estimate(errors)} over {args.folds} folds")
    print(kfold.verdict("tuned", "default", kfold.paired(tuned, default)))
    print(kfold.verdict("tuned", "SVC", kfold.paired(tuned, svc)))
    mean_default, mean_tuned = kfold.estimate(default).mean, kfold.estimate(tuned).mean
    mean_svc = kfold.estimate(svc).mean
    # The default configuration is trained by the same trainers: what tuning adds.
    print_ratio("tuned_vs_default_error", mean_default / mean_tuned, GOAL_DEFAULT, itself=True)
    print_ratio("tuned_vs_svc_error", mean_svc / mean_tuned, GOAL_SVC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
