"""The tuning engine on the service's storage, Optuna's journal in a real
Redis (``svc_tuner.storage``): the engine's contract suite from
tests/unit/test_tuner_engine.py run again on it, and the model-based samplers
against random search on it, with trials in flight."""

from __future__ import annotations

import optuna
import pytest

from aistack.studies import load_spec
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1 import tuning_pb2
from svc_tuner import spec as specs
from svc_tuner.engine import Engine
from svc_tuner.storage import redis_storage
from tests.infra import Infra
from tests.unit.test_tuner_engine import *  # noqa: F403 (the contract suite, collected here too)
from tests.unit.test_tuner_engine import QUADRATIC, Backend, completed, publish, quadratic

pytestmark = pytest.mark.integration


@pytest.fixture(name="backend")
def redis_backend(infra: Infra, unique: str) -> Backend:
    """Overrides the unit suite's storages: each ``open`` is a new client of
    the same journal, as a restarted tuner's."""
    return Backend("redis", lambda: redis_storage(infra.redis, f"test-tuner:{unique}"))


def _best_of(tuner: Engine, spec: tuning_pb2.StudySpec) -> float:
    study_id, _ = tuner.create_study(spec)
    while tuner.state(study_id) == api.STUDY_STATE_RUNNING:
        for request in publish(tuner, tuner.ask(study_id)):
            tuner.apply(completed(request, quadratic(request)))
    best = tuner.best(study_id)
    assert best is not None and best.value is not None
    return best.value


def test_tpe_beats_random_search_over_several_seeds(infra: Infra, unique: str) -> None:
    tuner = Engine(redis_storage(infra.redis, f"test-tuner:{unique}"))
    results: dict[int, list[float]] = {}
    for kind in (tuning_pb2.SAMPLER_KIND_TPE, tuning_pb2.SAMPLER_KIND_RANDOM):
        for seed in (1, 2, 3, 4):
            spec = load_spec(QUADRATIC.format(unique=f"{unique}-{kind}-{seed}"))
            spec.sampler.kind = kind
            spec.seed = seed
            spec.budget.max_trials = 30
            spec.budget.max_parallel = 1
            results.setdefault(kind, []).append(_best_of(tuner, spec))

    tpe, random = results[tuning_pb2.SAMPLER_KIND_TPE], results[tuning_pb2.SAMPLER_KIND_RANDOM]
    assert sum(tpe) < sum(random)
    assert sum(t < r for t, r in zip(tpe, random, strict=True)) >= 3


@pytest.mark.parametrize(
    "kind", [tuning_pb2.SAMPLER_KIND_GP, tuning_pb2.SAMPLER_KIND_CMAES], ids=["gp", "cmaes"]
)
def test_model_based_samplers_beat_random_search(infra: Infra, unique: str, kind: int) -> None:
    """The Gaussian process (the article's approach; torch and scipy from the
    tuner-gp group) and CMA-ES run on the same journal storage, with trials in
    flight, and find the quadratic's minimum better than random search."""
    tuner = Engine(redis_storage(infra.redis, f"test-tuner:{unique}"))
    results: dict[int, list[float]] = {}
    for sampler_kind in (kind, tuning_pb2.SAMPLER_KIND_RANDOM):
        for seed in (1, 2):
            spec = load_spec(QUADRATIC.format(unique=f"{unique}-{sampler_kind}-{seed}"))
            spec.sampler.kind = sampler_kind
            spec.sampler.startup_trials = 5
            spec.seed = seed
            spec.budget.max_trials = 25
            spec.budget.max_parallel = 2
            results.setdefault(sampler_kind, []).append(_best_of(tuner, spec))

    assert isinstance(specs.sampler(spec_of(kind)), SAMPLER_CLASSES[kind])
    assert sum(results[kind]) < sum(results[tuning_pb2.SAMPLER_KIND_RANDOM])


SAMPLER_CLASSES = {
    tuning_pb2.SAMPLER_KIND_GP: optuna.samplers.GPSampler,
    tuning_pb2.SAMPLER_KIND_CMAES: optuna.samplers.CmaEsSampler,
}


def spec_of(kind: int) -> tuning_pb2.StudySpec:
    spec = load_spec(QUADRATIC.format(unique="sampler"))
    spec.sampler.kind = kind  # type: ignore[assignment]
    return spec
