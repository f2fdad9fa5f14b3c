"""Re-tuning on drift: the follow-up study a ``DriftDetected`` starts, the
trials it tries first, and what it decides.

A study whose spec says ``retune.on_drift`` gets, when the drift monitor
reports that its model no longer sees the data it was trained on, a
follow-up study: the same spec (space, objective, sampler, pruner, task and
retune policy, so the loop goes on), named ``<root>-retune-<n>``, trained on
the windows newer than the serving version's training data, up to the last
the monitor judged (``task.options`` ``window_from``/``window_to``), and
measured against the serving version there (``task.baseline``). It first
tries the drifted study's best parameter sets (Optuna's ``enqueue_trial``).
When it ends, the champion rule (``shared.objective.beats_baseline``) says
whether its best model replaces the serving one; ``outcome`` says so, and
why. Pure: the engine keeps the records in Optuna's storage.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from shared import objective
from shared.contracts.aistack.v1 import monitoring_pb2, tuning_pb2
from shared.feature_store import WINDOW_FROM, WINDOW_TO
from shared.settings import ServingPolicy
from svc_tuner import spec as specs
from svc_tuner.record import Result, is_refit

#: On a re-tune study: what started it (``Origin``).
ORIGIN_ATTR = "aistack:retune"
#: On a root study: its re-tunes' ids, in order (their count names the next).
RETUNES_ATTR = "aistack:retunes"
#: On a root study: the drift ids already decided, so that a repeat (a
#: redelivery, a restarted tuner) starts nothing.
DRIFTS_ATTR = "aistack:drifts"
#: How many decided drift ids a root keeps: the monitor's ids name the last
#: window judged, so an old one does not come back after this many newer.
DRIFTS_KEPT = 1000

DEFAULT_WARM_TRIALS = 3
# Mixed into the root's seed so that a re-tune's seed differs from the root's.
_SEED_KEY = 0x7E7E


@dataclass(frozen=True)
class Origin:
    """What started a re-tune: the drift, the study whose model drifted, the
    root of the loop (the study the user created), the model and the version
    serving when the drift was seen."""

    drift_id: str
    previous_study: str
    root_study: str
    model_name: str
    serving_version: str

    @classmethod
    def load(cls, stored: Mapping[str, Any] | None) -> Origin | None:
        if not stored:
            return None
        return cls(**{k: str(stored.get(k, "")) for k in cls.__dataclass_fields__})

    def dump(self) -> dict[str, str]:
        return asdict(self)


def follow_up_spec(
    spec: tuning_pb2.StudySpec,
    drift: monitoring_pb2.DriftDetected,
    name: str,
    count: int,
    *,
    version_offset: int,
) -> tuning_pb2.StudySpec:
    """The ``count``-th re-tune of ``spec``'s loop, for ``drift``; its models'
    versions start after ``version_offset`` (the trials of the loop's studies
    so far: they published under the same model name)."""
    follow = tuning_pb2.StudySpec()
    follow.CopyFrom(spec)
    follow.name = name
    follow.task.options[objective.VERSION_OFFSET] = str(version_offset)
    follow.budget.max_trials = spec.retune.max_trials or spec.budget.max_trials
    if spec.HasField("seed"):
        follow.seed = specs.trial_seed(spec.seed, _SEED_KEY, count)
    options = follow.task.options
    options.pop(WINDOW_FROM, None)
    options.pop(WINDOW_TO, None)
    # The fresh data: every window newer than those the serving version
    # trained on (its distribution's last), up to the last the monitor judged.
    # Pinned at both ends, so that every trial reads the same windows; the
    # horizon alone is too few windows to train on.
    trained = drift.serving.training_distribution
    if trained.HasField("last_window_start"):
        fresh = Timestamp()
        fresh.FromMicroseconds(trained.last_window_start.ToMicroseconds() + 1)
        options[WINDOW_FROM] = fresh.ToJsonString()
    elif drift.HasField("first_window_start"):
        options[WINDOW_FROM] = drift.first_window_start.ToJsonString()
    if drift.HasField("last_window_start"):
        options[WINDOW_TO] = drift.last_window_start.ToJsonString()
    follow.task.ClearField("baseline")
    if drift.HasField("serving"):
        follow.task.baseline.CopyFrom(drift.serving)
    return follow


def warm_trials(spec: tuning_pb2.StudySpec) -> int:
    """How many parameter sets a re-tune of ``spec`` tries first (within its budget)."""
    wanted = spec.retune.warm_trials or DEFAULT_WARM_TRIALS
    return min(wanted, spec.retune.max_trials or spec.budget.max_trials)


def best_params(trials: Iterable[FrozenTrial], direction: int, count: int) -> list[dict[str, Any]]:
    """The ``count`` best distinct parameter sets of completed trials, best
    first, by the rule of the study's best trial (``shared.objective``: a
    refit, or a trial without a value, is not judged)."""
    ranked: list[tuple[objective.Standing, FrozenTrial]] = []
    for trial in trials:
        if trial.state != OptunaState.COMPLETE:
            continue
        standing = objective.Standing.of(
            trial.value, direction, trial.number, refit=is_refit(trial)
        )
        if standing.judged:
            ranked.append((standing, trial))
    ranked.sort(key=lambda pair: (pair[0].value, pair[0].order))
    chosen: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _, trial in ranked:
        key = json.dumps(trial.params, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        chosen.append(dict(trial.params))
        if len(chosen) == count:
            break
    return chosen


def outcome(
    origin: Origin,
    spec: tuning_pb2.StudySpec,
    best: FrozenTrial | None,
    policy: ServingPolicy = "champion",
) -> tuning_pb2.RetuneOutcome:
    """What the re-tune decided: whether its best trial's model beats the
    serving version on the best trial's validation data, and why. Under the
    ``live`` policy a winner is not promoted but shadowed: it serves once a
    decision on live traffic promotes it."""
    decided = tuning_pb2.RetuneOutcome(
        drift_id=origin.drift_id,
        previous_study_id=origin.previous_study,
        model_name=origin.model_name,
        serving_version=origin.serving_version,
    )
    serving = f"the serving version {origin.serving_version or '(unknown)'}"
    if best is None or best.value is None:
        decided.reason = f"no trial completed, {serving} keeps serving"
        return decided
    metric = spec.objective.metric
    value = float(best.value)
    baseline = Result.of(best).metrics.get(objective.baseline_metric(metric))
    if baseline is not None:
        decided.serving_value = baseline
    decided.promoted = objective.beats_baseline(value, baseline, spec.objective.direction)
    if baseline is None:
        decided.reason = (
            f"{metric} {value:.4g} and no value of {serving} on the same validation windows "
            "(the trainer reported none): the new version is judged on its own"
        )
    elif decided.promoted:
        decided.reason = (
            f"{metric} {value:.4g} beats {serving}'s {baseline:.4g} on the same validation windows"
        )
    else:
        decided.reason = (
            f"{metric} {value:.4g} does not beat {serving}'s {baseline:.4g} "
            f"on the same validation windows, version {origin.serving_version} keeps serving"
        )
    if decided.promoted and policy == "live":
        decided.promoted, decided.shadowed = False, True
        decided.reason += (
            ": it runs in the serving version's shadow until live traffic promotes it "
            "(AISTACK_MODEL_POLICY=live)"
        )
    return decided
