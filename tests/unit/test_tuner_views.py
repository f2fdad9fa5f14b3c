"""svc_tuner.views: the engine's studies and trials as the TunerService answers them."""

from __future__ import annotations

from optuna.storages import InMemoryStorage

from aistack.studies import load_spec
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1 import tuning_pb2
from svc_tuner import views
from svc_tuner.engine import Engine
from tests.unit.test_tuner_engine import QUADRATIC, Clock, completed, publish


def test_a_study_shows_its_counts_and_best_trial_and_trials_filter_by_state() -> None:
    engine = Engine(InMemoryStorage(), clock=Clock())
    study_id, _ = engine.create_study(load_spec(QUADRATIC.format(unique="views")))
    first, second, _third = publish(engine, engine.ask(study_id))
    done = completed(first, 2.5)
    done.completed.model_name, done.completed.model_version = "m", "1"
    done.completed.metrics["loss"] = 2.5
    engine.apply(done)
    engine.apply(completed(second, 3.0))

    study = views.study_message(engine, study_id)

    assert study.state == api.STUDY_STATE_RUNNING
    assert dict(study.trial_counts) == {"completed": 2, "requested": 1}
    best = study.best_trial
    assert (best.trial_id, best.value, best.model_version) == (first.trial_id, 2.5, "1")
    assert dict(best.metrics) == {"loss": 2.5} and best.attempts == 1
    assert set(best.params) == {"x", "y"} and best.HasField("end_time")
    requested = views.trial_messages(engine, study_id, frozenset({api.TRIAL_STATE_REQUESTED}))
    assert [t.number for t in requested] == [2]
    assert len(views.trial_messages(engine, study_id, frozenset())) == 3


def test_a_study_with_no_completed_trial_has_no_best() -> None:
    engine = Engine(InMemoryStorage(), clock=Clock())
    study_id, _ = engine.create_study(load_spec(QUADRATIC.format(unique="empty")))
    (request, *_) = publish(engine, engine.ask(study_id))
    engine.apply(
        tuning_pb2.TrialReport(
            trial_id=request.trial_id,
            study_id=study_id,
            attempt=1,
            failed=tuning_pb2.TrialFailed(reason="nan", retryable=False),
        )
    )

    study = views.study_message(engine, study_id)

    assert not study.HasField("best_trial")
    assert dict(study.trial_counts) == {"quarantined": 1, "requested": 2}
