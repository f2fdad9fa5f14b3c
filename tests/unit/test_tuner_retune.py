"""Re-tuning on drift: a drift event on an opted-in study's model starts one
warm-started follow-up study (its first trials the previous best), one at a
time per model, each drift id once; its result says whether its best model
beats the serving version on the new data."""

from __future__ import annotations

from optuna.storages import InMemoryStorage

from aistack.studies import load_spec
from shared import search_space
from shared.contracts.aistack.v1 import models_pb2, monitoring_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.objective import VERSION_OFFSET, baseline_metric
from svc_tuner.engine import Engine
from tests.unit.test_tuner_engine import QUADRATIC, Clock, publish, quadratic, report

RETUNE = "retune: {on_drift: true, max_trials: 4, warm_trials: 2}\n"


def _params(request: tuning_pb2.TrialRequested) -> dict[str, object]:
    return {k: search_space.python_value(v) for k, v in request.params.items()}


def _complete(
    engine: Engine, request: tuning_pb2.TrialRequested, baseline: float | None = None
) -> None:
    """The trial completes with the quadratic (and the baseline's value)."""
    metrics = {} if baseline is None else {baseline_metric("loss"): baseline}
    done = tuning_pb2.TrialCompleted(
        value=quadratic(request), metrics=metrics, model_name="m", model_version="9"
    )
    engine.apply(report(request, completed=done))


def _run(engine: Engine, study_id: str, baseline: float | None = None) -> None:
    """Every trial it asks completes (it asks only when the study has room)."""
    while engine.state(study_id) == api.STUDY_STATE_RUNNING:
        requests = publish(engine, engine.ask(study_id))
        assert requests, "trials in flight that no one completes"
        for request in requests:
            _complete(engine, request, baseline)


def _drift(study_id: str, drift_id: str = "d1") -> monitoring_pb2.DriftDetected:
    drift = monitoring_pb2.DriftDetected(
        drift_id=drift_id,
        model_name="quad",
        model_version="2",
        study_id=study_id,
        serving=models_pb2.ModelReady(model_name="quad", version="2"),
    )
    drift.first_window_start.FromJsonString("2024-05-01T10:00:00Z")
    drift.last_window_start.FromJsonString("2024-05-01T11:00:00Z")
    return drift


def _finished_root(engine: Engine, unique: str, retune: str = RETUNE) -> str:
    spec = load_spec(QUADRATIC.format(unique=unique) + retune)
    spec.budget.max_trials, spec.budget.max_parallel = 6, 2
    study_id, _ = engine.create_study(spec)
    _run(engine, study_id)
    return study_id


def test_a_drift_starts_one_warm_started_study_on_the_drifted_windows(unique: str) -> None:
    engine = Engine(InMemoryStorage(), clock=Clock())
    root = _finished_root(engine, unique)
    ranked = sorted(
        (t for t in engine.trials(root)), key=lambda t: (t.value, t.number)
    )  # best first

    decision = engine.retune(_drift(root))

    assert (decision.why, decision.study_id) == ("started", f"{root}-retune-1")
    spec = engine.spec(decision.study_id)
    assert spec.budget.max_trials == 4 and spec.retune.on_drift
    assert spec.seed != engine.spec(root).seed
    assert dict(spec.task.options) == {
        "window_from": "2024-05-01T10:00:00Z",
        "window_to": "2024-05-01T11:00:00Z",
        # The root's six trials took versions 1..6 of the model.
        VERSION_OFFSET: "6",
    }
    assert spec.task.baseline.version == "2"
    first = publish(engine, engine.ask(decision.study_id))
    assert [r.trial_number for r in first] == [0, 1]
    assert [_params(r) for r in first] == [ranked[0].params, ranked[1].params]
    assert all(r.task.baseline.version == "2" for r in first)
    # The rest are sampled as usual, up to the re-tune's own budget.
    for request in first:
        _complete(engine, request, baseline=100.0)
    _run(engine, decision.study_id, baseline=100.0)
    assert len(engine.trials(decision.study_id)) == 4
    # The warm start replays: its enqueued trials are marked as such.
    replayed = engine.replay(decision.study_id)
    assert replayed.identical
    assert [t.enqueued for t in replayed.trials] == [True, True, False, False]
    assert replayed.task.options["window_from"] == "2024-05-01T10:00:00Z"


def test_a_retune_trains_on_the_windows_newer_than_the_serving_versions_training(
    unique: str,
) -> None:
    engine = Engine(InMemoryStorage(), clock=Clock())
    root = _finished_root(engine, unique)
    drift = _drift(root)
    drift.serving.training_distribution.last_window_start.FromJsonString("2024-05-01T08:59:00Z")

    decision = engine.retune(drift)

    assert dict(engine.spec(decision.study_id).task.options) == {
        "window_from": "2024-05-01T08:59:00.000001Z",
        "window_to": "2024-05-01T11:00:00Z",
        VERSION_OFFSET: "6",
    }


def test_one_retune_at_a_time_per_model_and_each_drift_id_once(unique: str) -> None:
    storage = InMemoryStorage()
    engine = Engine(storage, clock=Clock())
    root = _finished_root(engine, unique)

    decisions = [engine.retune(_drift(root, d)) for d in ("d1", "d1", "d1", "d2")]

    assert [d.why for d in decisions] == ["started", "repeat", "repeat", "retune_running"]
    retune_id = decisions[0].study_id
    assert decisions[3].other == retune_id
    assert sorted(engine.study_ids()) == sorted([root, retune_id])
    # A restarted tuner remembers the drift ids it decided.
    restarted = Engine(storage, clock=Clock())
    assert restarted.retune(_drift(root, "d1")).why == "repeat"
    assert restarted.retune(_drift(root, "d2")).why == "repeat"
    # Once the re-tune ends, a new drift (on its model) starts the next one,
    # numbered in the root's loop.
    _run(restarted, retune_id, baseline=100.0)
    following = restarted.retune(_drift(retune_id, "d3"))
    assert (following.why, following.study_id) == ("started", f"{root}-retune-2")
    # Its models' versions come after the root's six and the first re-tune's four.
    assert restarted.spec(following.study_id).task.options[VERSION_OFFSET] == "10"


def test_a_study_not_opted_in_or_unknown_starts_nothing(unique: str) -> None:
    engine = Engine(InMemoryStorage(), clock=Clock())
    root = _finished_root(engine, unique, retune="")

    assert engine.retune(_drift(root)).why == "not_opted_in"
    assert engine.retune(_drift("no-such-study")).why == "unknown_study"
    assert engine.study_ids() == [root]


def _outcome(unique: str, baseline: float | None) -> tuning_pb2.StudyResult:
    engine = Engine(InMemoryStorage(), clock=Clock())
    root = _finished_root(engine, unique)
    retune_id = engine.retune(_drift(root)).study_id
    _run(engine, retune_id, baseline=baseline)
    result = engine.unannounced_result(retune_id)
    assert result is not None and result.HasField("retune")
    assert engine.unannounced_result(root) is not None
    assert not engine.unannounced_result(root).HasField("retune")  # type: ignore[union-attr]
    return result


def test_a_better_retune_is_promoted(unique: str) -> None:
    result = _outcome(unique, baseline=100.0)

    decided = result.retune
    assert (decided.drift_id, decided.model_name, decided.serving_version) == ("d1", "quad", "2")
    assert decided.previous_study_id == f"quadratic-{unique}"
    assert decided.serving_value == 100.0 and decided.promoted
    assert decided.reason == (
        f"loss {result.best_value:.4g} beats the serving version 2's 100 "
        "on the same validation windows"
    )


def test_a_worse_retune_is_refused_and_says_why(unique: str) -> None:
    result = _outcome(unique, baseline=-1.0)

    decided = result.retune
    assert decided.serving_value == -1.0 and not decided.promoted
    assert "does not beat the serving version 2's -1" in decided.reason
    assert decided.reason.endswith("version 2 keeps serving")


def test_a_retune_with_no_completed_trial_keeps_the_serving_version(unique: str) -> None:
    engine = Engine(InMemoryStorage(), clock=Clock())
    root = _finished_root(engine, unique)
    retune_id = engine.retune(_drift(root)).study_id
    failure = tuning_pb2.TrialFailed(reason="config", message="bad", retryable=False)
    while engine.state(retune_id) == api.STUDY_STATE_RUNNING:
        for request in publish(engine, engine.ask(retune_id)):
            engine.apply(report(request, failed=failure))

    result = engine.unannounced_result(retune_id)

    assert result is not None and not result.retune.promoted
    assert not result.retune.HasField("serving_value")
    assert result.retune.reason == "no trial completed, the serving version 2 keeps serving"


def test_warm_trials_not_yet_asked_are_no_trials_of_the_study(unique: str) -> None:
    engine = Engine(InMemoryStorage(), clock=Clock())
    root = _finished_root(engine, unique, retune="retune: {on_drift: true, warm_trials: 3}\n")
    retune_id = engine.retune(_drift(root)).study_id

    first = publish(engine, engine.ask(retune_id))

    # Two in flight (max_parallel); the third best waits its turn, unlisted.
    assert [t.number for t in engine.trials(retune_id)] == [r.trial_number for r in first] == [0, 1]
    assert engine.counts(retune_id) == {"requested": 2}
    _complete(engine, first[0], baseline=100.0)
    third = publish(engine, engine.ask(retune_id))
    ranked = sorted(engine.trials(root), key=lambda t: (t.value, t.number))
    assert [_params(r) for r in third] == [ranked[2].params]


def test_under_the_live_policy_a_better_retune_is_shadowed_not_promoted(unique: str) -> None:
    engine = Engine(InMemoryStorage(), clock=Clock(), policy="live")
    root = _finished_root(engine, unique)
    retune_id = engine.retune(_drift(root)).study_id
    _run(engine, retune_id, baseline=100.0)
    result = engine.unannounced_result(retune_id)
    assert result is not None
    decided = result.retune
    assert decided.shadowed and not decided.promoted
    assert decided.reason.startswith(f"loss {result.best_value:.4g} beats the serving version 2's")
    assert decided.reason.endswith("until live traffic promotes it (AISTACK_MODEL_POLICY=live)")
    worse = Engine(InMemoryStorage(), clock=Clock(), policy="live")
    root = _finished_root(worse, f"{unique}-worse")
    retune_id = worse.retune(_drift(root)).study_id
    _run(worse, retune_id, baseline=-1.0)
    refused = worse.unannounced_result(retune_id)
    assert refused is not None and not (refused.retune.shadowed or refused.retune.promoted)
