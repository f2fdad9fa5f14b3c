"""Study specs: YAML loading, validation naming the field, and the Optuna objects."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from aistack.studies import load_spec
from shared import search_space
from shared.contracts.aistack.v1 import tuning_pb2
from shared.errors import FailedPrecondition, InvalidArgument
from svc_tuner import spec as specs

# The article's search space, as a user writes it for `aistack study create -f`.
DIGITS_YAML = """
name: digits-cnn
objective: {metric: val_error, direction: DIRECTION_MINIMIZE}
params:
  - {name: learning_rate, float_range: {low: 1.0e-4, high: 1.0e-1, log: true}}
  - {name: dropout, float_range: {low: 0.0, high: 0.5, step: 0.1}}
  - {name: dense_layers, int_range: {low: 1, high: 3}}
  - {name: units, int_range: {low: 32, high: 256, log: true}}
  - {name: kernel_width, int_range: {low: 3, high: 7, step: 2}}
  - name: activation
    categorical: {choices: [{string_value: relu}, {string_value: tanh}]}
  - name: optimizer
    categorical: {choices: [{string_value: adam}, {string_value: sgd}]}
  - name: batch_size
    categorical: {choices: [{int_value: 32}, {int_value: 64}, {int_value: 128}]}
sampler: {kind: SAMPLER_KIND_TPE, startup_trials: 4}
pruner: {kind: PRUNER_KIND_SUCCESSIVE_HALVING, min_resource: 1, reduction_factor: 3}
budget: {max_trials: 16, max_parallel: 4, trial_timeout: 120s, max_attempts: 2}
task: {dataset: digits, model_family: cnn, framework: FRAMEWORK_TORCH, strategy: single, epochs: 5}
seed: 7
"""


def digits() -> tuning_pb2.StudySpec:
    return load_spec(DIGITS_YAML)


def test_the_articles_search_space_loads_from_yaml_and_is_valid() -> None:
    spec = digits()
    specs.validate(spec)

    space = search_space.distributions(spec)
    assert space["learning_rate"] == optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)
    assert space["dropout"] == optuna.distributions.FloatDistribution(0.0, 0.5, step=0.1)
    assert space["kernel_width"] == optuna.distributions.IntDistribution(3, 7, step=2)
    assert space["batch_size"] == optuna.distributions.CategoricalDistribution((32, 64, 128))
    assert spec.budget.trial_timeout.ToSeconds() == 120 and spec.seed == 7
    assert (
        search_space.direction(spec) == optuna.study.StudyDirection.MINIMIZE
        and specs.max_attempts(spec) == 2
    )


def test_json_is_accepted_too() -> None:
    spec = load_spec(
        '{"name": "q", "objective": {"metric": "loss", "direction": "DIRECTION_MAXIMIZE"},'
        ' "params": [{"name": "x", "floatRange": {"low": -1, "high": 1}}],'
        ' "budget": {"maxTrials": 3, "maxParallel": 1},'
        ' "task": {"framework": "FRAMEWORK_TENSORFLOW"}}'
    )
    specs.validate(spec)
    assert search_space.direction(spec) == optuna.study.StudyDirection.MAXIMIZE


def _broken(change: Callable[[tuning_pb2.StudySpec], None]) -> tuning_pb2.StudySpec:
    spec = digits()
    change(spec)
    return spec


def _user_model(ref: str) -> Callable[[tuning_pb2.StudySpec], None]:
    def change(spec: tuning_pb2.StudySpec) -> None:
        spec.task.ClearField("model_family")
        spec.task.model = ref

    return change


def _set_low(index: int, domain: str, value: float) -> Callable[[tuning_pb2.StudySpec], None]:
    return lambda s: setattr(getattr(s.params[index], domain), "low", value)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: s.ClearField("params"), "params"),
        (_set_low(1, "float_range", 0.9), "params[1].float_range.low"),
        (_set_low(3, "int_range", 512), "params[3].int_range.low"),
        (_set_low(0, "float_range", 0.0), "params[0].float_range.low"),
        (_set_low(0, "float_range", -1.0), "params[0].float_range.low"),
        (lambda s: setattr(s.sampler, "kind", 99), "sampler.kind"),
        (lambda s: setattr(s.pruner, "kind", 42), "pruner.kind"),
        (lambda s: setattr(s.budget, "max_parallel", 0), "budget.max_parallel"),
        (lambda s: setattr(s.budget, "max_trials", 0), "budget.max_trials"),
        (lambda s: setattr(s.params[2], "name", "dropout"), "params[2].name"),
        (lambda s: setattr(s.params[2], "name", ""), "params[2].name"),
        (lambda s: s.params[5].categorical.ClearField("choices"), "params[5].categorical.choices"),
        (lambda s: s.params[5].ClearField("categorical"), "params[5]"),
        (lambda s: setattr(s.objective, "metric", ""), "objective.metric"),
        (lambda s: setattr(s.objective, "direction", 0), "objective.direction"),
        (lambda s: setattr(s, "name", "has space"), "name"),
        (lambda s: setattr(s.task, "framework", 0), "task.framework"),
        (lambda s: s.sampler.options.__setitem__("no_such", "1"), "sampler.options.no_such"),
        (lambda s: setattr(s.pruner, "reduction_factor", 1), "pruner.reduction_factor"),
        (lambda s: setattr(s.params[3].int_range, "step", 2), "params[3].int_range.step"),
        (lambda s: setattr(s.retune, "max_trials", -1), "retune.max_trials"),
        (lambda s: setattr(s.retune, "warm_trials", -2), "retune.warm_trials"),
        (lambda s: setattr(s.task, "model", "mypkg.models"), "task.model_family"),
        (
            lambda s: (s.task.ClearField("model_family"), setattr(s.task, "model", "x")),
            "task.model",
        ),
        (lambda s: setattr(s.task, "dataset", "pkg.data:load me"), "task.dataset"),
        (lambda s: setattr(s.task.code, "uri", "file:///x.tar.gz"), "task.code.sha256"),
    ],
)
def test_an_invalid_spec_names_the_field(
    change: Callable[[tuning_pb2.StudySpec], None], field: str
) -> None:
    with pytest.raises(specs.SpecError) as raised:
        specs.validate(_broken(change))
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")
    assert raised.value.reason == "invalid_spec"


def test_a_grid_needs_steps_for_floats() -> None:
    spec = digits()
    spec.sampler.kind = tuning_pb2.SAMPLER_KIND_GRID
    with pytest.raises(specs.SpecError) as raised:
        specs.validate(spec)
    assert raised.value.field == "params[0].float_range.step"


def test_unparseable_specs_are_invalid_arguments() -> None:
    with pytest.raises(InvalidArgument, match="StudySpec"):
        load_spec("name: x\nsampler: {kind: SAMPLER_KIND_MAGIC}\n")
    with pytest.raises(InvalidArgument, match="mapping"):
        load_spec("- just a list")
    with pytest.raises(InvalidArgument, match="YAML"):
        load_spec("name: [unclosed")


def test_samplers_are_seeded_and_tpe_lies_about_trials_in_flight() -> None:
    spec = digits()
    tpe = specs.sampler(spec)
    assert isinstance(tpe, optuna.samplers.TPESampler)
    assert tpe._constant_liar and tpe._n_startup_trials == 4

    spec.sampler.kind = tuning_pb2.SAMPLER_KIND_RANDOM
    assert isinstance(specs.sampler(spec), optuna.samplers.RandomSampler)
    spec.sampler.kind = tuning_pb2.SAMPLER_KIND_CMAES
    assert isinstance(specs.sampler(spec), optuna.samplers.CmaEsSampler)


def test_the_gaussian_process_needs_torch_and_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = digits()
    spec.sampler.kind = tuning_pb2.SAMPLER_KIND_GP
    assert isinstance(specs.sampler(spec), optuna.samplers.GPSampler)

    # A tuner deployed without the tuner-gp group refuses the spec, saying why.
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torch" else real_find_spec(name, *a),
    )
    with pytest.raises(FailedPrecondition, match="needs torch"):
        specs.sampler(spec)


def test_a_grid_sampler_walks_every_step() -> None:
    spec = digits()
    del spec.params[0]  # the log-scale float has no grid
    spec.sampler.kind = tuning_pb2.SAMPLER_KIND_GRID
    specs.validate(spec)

    grid = specs._grid(spec)
    assert grid["dropout"] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert grid["kernel_width"] == [3, 5, 7] and grid["batch_size"] == [32, 64, 128]
    assert isinstance(specs.sampler(spec), optuna.samplers.GridSampler)


def test_pruners_follow_the_spec() -> None:
    spec = digits()
    assert isinstance(specs.pruner(spec), optuna.pruners.SuccessiveHalvingPruner)
    spec.pruner.kind = tuning_pb2.PRUNER_KIND_HYPERBAND
    assert isinstance(specs.pruner(spec), optuna.pruners.HyperbandPruner)
    spec.pruner.kind = tuning_pb2.PRUNER_KIND_NONE
    assert isinstance(specs.pruner(spec), optuna.pruners.NopPruner)
    spec.pruner.kind = tuning_pb2.PRUNER_KIND_MEDIAN
    assert isinstance(specs.pruner(spec), optuna.pruners.MedianPruner)


def test_param_values_keep_their_type() -> None:
    for value in (True, 3, 0.25, "adam"):
        round_trip = search_space.python_value(search_space.param_value(value))
        assert round_trip == value and type(round_trip) is type(value)


def test_the_readme_example_spec_is_valid() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "studies" / "digits-cnn.yaml"
    spec = load_spec(path.read_text())
    specs.validate(spec)
    assert len(spec.params) == 9 and spec.budget.max_parallel == 4
    assert isinstance(specs.pruner(spec), optuna.pruners.SuccessiveHalvingPruner)


def test_a_seeded_sampler_travels_pickled_and_proposes_the_same() -> None:
    # Ray Tune's OptunaSearch pickles its sampler (bench.user_code runs the
    # tuner's own sampler there).
    import pickle

    spec = digits()
    spec.seed = 11
    original = specs.seeded_sampler(spec)
    copy = pickle.loads(pickle.dumps(original))
    proposals = []
    for chosen in (original, copy):
        study = optuna.create_study(sampler=chosen)
        trial = study.ask(search_space.distributions(spec))
        proposals.append(trial.params)
    assert proposals[0] == proposals[1]
