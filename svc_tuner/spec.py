"""Study specs: validation, and the Optuna samplers and pruners a spec stands
for (its distributions and direction: ``shared.search_space``).

A spec arrives as ``aistack.v1.StudySpec`` over gRPC (the CLI reads it from
YAML or JSON: ``aistack.studies.load_spec``). ``validate`` raises ``SpecError``
naming the first field that is wrong, which the gRPC layer returns as
INVALID_ARGUMENT.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import optuna
import yaml
from optuna.distributions import BaseDistribution
from optuna.pruners import BasePruner
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from shared import code_refs
from shared.contracts.aistack.v1 import common_pb2, tuning_pb2
from shared.errors import FailedPrecondition, InvalidArgument
from shared.search_space import Choice, python_value

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
DEFAULT_MAX_ATTEMPTS = 3


class SpecError(InvalidArgument):
    """A study spec field is wrong; ``field`` is its path, e.g. ``params[2].float_range.low``."""

    reason = "invalid_spec"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def validate(spec: tuning_pb2.StudySpec) -> None:
    """Raise ``SpecError`` for the first field that is wrong."""
    if not _NAME.match(spec.name):
        raise SpecError("name", "1-100 letters, digits, '.', '_' or '-', starting alphanumeric")
    if not spec.objective.metric:
        raise SpecError("objective.metric", "name the metric trainers report")
    if spec.objective.direction not in (
        common_pb2.DIRECTION_MINIMIZE,
        common_pb2.DIRECTION_MAXIMIZE,
    ):
        raise SpecError("objective.direction", "must be DIRECTION_MINIMIZE or DIRECTION_MAXIMIZE")
    if not spec.params:
        raise SpecError("params", "the search space is empty")
    seen: set[str] = set()
    for i, param in enumerate(spec.params):
        where = f"params[{i}]"
        if not param.name:
            raise SpecError(f"{where}.name", "is empty")
        if param.name in seen:
            raise SpecError(f"{where}.name", f"{param.name!r} appears twice")
        seen.add(param.name)
        _validate_domain(param, where)
    _validate_sampler(spec)
    _validate_pruner(spec.pruner)
    _validate_budget(spec.budget)
    for name in ("max_trials", "warm_trials"):
        if getattr(spec.retune, name) < 0:
            raise SpecError(f"retune.{name}", "must not be negative")
    if spec.task.framework not in (common_pb2.FRAMEWORK_TORCH, common_pb2.FRAMEWORK_TENSORFLOW):
        raise SpecError("task.framework", "must be FRAMEWORK_TORCH or FRAMEWORK_TENSORFLOW")
    if spec.task.epochs < 0:
        raise SpecError("task.epochs", "must not be negative")
    problem = code_refs.task_problem(spec.task)
    if problem is not None:
        raise SpecError(*problem)


def _validate_domain(param: tuning_pb2.ParamSpec, where: str) -> None:
    domain = param.WhichOneof("domain")
    if domain is None:
        raise SpecError(where, "needs one of float_range, int_range, categorical")
    if domain == "categorical":
        choices = [python_value(c) for c in param.categorical.choices]
        if not choices:
            raise SpecError(f"{where}.categorical.choices", "is empty")
        if any(c is None for c in choices):
            raise SpecError(f"{where}.categorical.choices", "a choice has no value")
        if len(set(map(repr, choices))) != len(choices):
            raise SpecError(f"{where}.categorical.choices", "has a choice twice")
        return
    bounds = param.float_range if domain == "float_range" else param.int_range
    field = f"{where}.{domain}"
    if not (math.isfinite(bounds.low) and math.isfinite(bounds.high)):
        raise SpecError(f"{field}.low", "bounds must be finite numbers")
    if bounds.low > bounds.high:
        raise SpecError(f"{field}.low", f"low {bounds.low} is above high {bounds.high}")
    if bounds.log and bounds.low <= 0:
        raise SpecError(f"{field}.low", "a log scale needs a positive low bound")
    if bounds.step < 0:
        raise SpecError(f"{field}.step", "must not be negative")
    plain_step = 1 if domain == "int_range" else 0
    if bounds.log and bounds.step not in (0, plain_step):
        raise SpecError(f"{field}.step", "a log scale takes no step")


def _validate_sampler(spec: tuning_pb2.StudySpec) -> None:
    kind = spec.sampler.kind
    if kind not in _SAMPLERS:
        raise SpecError("sampler.kind", f"unknown sampler {kind}")
    if spec.sampler.startup_trials < 0:
        raise SpecError("sampler.startup_trials", "must not be negative")
    if kind == tuning_pb2.SAMPLER_KIND_GRID:
        for i, param in enumerate(spec.params):
            if param.WhichOneof("domain") == "float_range" and not param.float_range.step:
                raise SpecError(
                    f"params[{i}].float_range.step", "a grid needs a step for float parameters"
                )
    accepted = _option_names(_SAMPLERS[kind])
    for name in spec.sampler.options:
        if name not in accepted:
            raise SpecError(
                f"sampler.options.{name}", f"not an option of this sampler: {sorted(accepted)}"
            )


def _validate_pruner(pruner: tuning_pb2.PrunerSpec) -> None:
    if pruner.kind not in _PRUNERS:
        raise SpecError("pruner.kind", f"unknown pruner {pruner.kind}")
    for name in ("min_resource", "max_resource", "warmup_steps", "startup_trials"):
        if getattr(pruner, name) < 0:
            raise SpecError(f"pruner.{name}", "must not be negative")
    if pruner.reduction_factor == 1 or pruner.reduction_factor < 0:
        raise SpecError("pruner.reduction_factor", "must be 2 or more (0: the default)")
    if pruner.max_resource and pruner.min_resource > pruner.max_resource:
        raise SpecError("pruner.min_resource", "is above max_resource")


def _validate_budget(budget: tuning_pb2.Budget) -> None:
    if budget.max_trials < 1:
        raise SpecError("budget.max_trials", "must be at least 1")
    if budget.max_parallel < 1:
        raise SpecError("budget.max_parallel", "must be at least 1")
    if budget.time_limit.ToNanoseconds() < 0:
        raise SpecError("budget.time_limit", "must not be negative")
    if budget.trial_timeout.ToNanoseconds() < 0:
        raise SpecError("budget.trial_timeout", "must not be negative")
    if budget.max_attempts < 0:
        raise SpecError("budget.max_attempts", "must not be negative")


# ---- values ----


def max_attempts(spec: tuning_pb2.StudySpec) -> int:
    return spec.budget.max_attempts or DEFAULT_MAX_ATTEMPTS


# ---- Optuna ----


def trial_seed(seed: int, *keys: int) -> int:
    """A seed for one use of ``seed`` (a trial number, a re-tune's count):
    well mixed, the same on every machine and in every process."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1)[0])


def seeded_sampler(spec: tuning_pb2.StudySpec) -> BaseSampler:
    """The sampler the engine asks with. With a seed, each trial is sampled by
    a sampler seeded for that trial alone, so a proposal depends only on the
    spec's seed, the trial's number and the study's history: a restarted tuner
    proposes what the killed one would have, and a replay what the log holds.
    Without a seed, Optuna's own sampler, random."""
    if not spec.HasField("seed"):
        return sampler(spec)
    return _PerTrialSeed(_SpecSampler(spec), spec.seed)


class _SpecSampler:
    """Builds ``spec``'s sampler for a seed: picklable (the spec kept as
    bytes), so that a seeded sampler can travel (Ray Tune's OptunaSearch
    pickles its sampler)."""

    def __init__(self, spec: tuning_pb2.StudySpec) -> None:
        self._spec = spec.SerializeToString(deterministic=True)

    def __call__(self, seed: int) -> BaseSampler:
        spec = tuning_pb2.StudySpec.FromString(self._spec)
        if spec.sampler.kind == tuning_pb2.SAMPLER_KIND_GRID:
            # The seed orders the grid: one order for every trial, so that the
            # points tried (stored as grid ids) mean the same to each.
            return sampler(spec)
        return sampler(spec, seed=seed)


def sampler(spec: tuning_pb2.StudySpec, *, seed: int | None = None) -> BaseSampler:
    """The spec's sampler, seeded (``seed``, else the spec's); TPE with the
    constant liar, so that trials in flight count as (pessimistic) results
    and are not sampled again."""
    kind = spec.sampler.kind
    options: dict[str, Any] = {k: yaml.safe_load(v) for k, v in spec.sampler.options.items()}
    if seed is None and spec.HasField("seed"):
        seed = spec.seed
    if spec.sampler.startup_trials and "n_startup_trials" in _option_names(_SAMPLERS[kind]):
        options.setdefault("n_startup_trials", spec.sampler.startup_trials)
    if kind == tuning_pb2.SAMPLER_KIND_GRID:
        return _BudgetedGrid(_grid(spec), seed=seed, **options)
    if kind in (tuning_pb2.SAMPLER_KIND_TPE, tuning_pb2.SAMPLER_KIND_UNSPECIFIED):
        options.setdefault("constant_liar", True)
        options.setdefault("multivariate", True)
    if kind == tuning_pb2.SAMPLER_KIND_GP:
        missing = [m for m in ("torch", "scipy") if importlib.util.find_spec(m) is None]
        if missing:
            raise FailedPrecondition(
                f"the Gaussian-process sampler needs {' and '.join(missing)} in the tuner's "
                "environment"
            )
    try:
        return _SAMPLERS[kind](seed=seed, **options)
    except (TypeError, ValueError) as error:
        raise SpecError("sampler.options", str(error)) from error


class _PerTrialSeed(BaseSampler):
    """Delegates to a sampler built afresh for each trial (Optuna calls
    ``before_trial`` before it samples anything of a trial) with
    ``trial_seed(seed, trial.number)``. The samplers keep what they learn in
    the study's storage, not in themselves (CMA-ES in trial attributes), so
    a fresh one per trial loses nothing but caches."""

    def __init__(self, build: Callable[[int], BaseSampler], seed: int) -> None:
        self._build = build
        self._seed = seed
        self._current = build(trial_seed(seed, 0))

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._current = self._build(trial_seed(self._seed, trial.number))
        self._current.before_trial(study, trial)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._current.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self._current.sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._current.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Any,
    ) -> None:
        self._current.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        # Each trial is seeded by its number; nothing to reseed.
        return None


def pruner(spec: tuning_pb2.StudySpec) -> BasePruner:
    """The spec's pruner; unspecified means Optuna's default, the median rule."""
    p = spec.pruner
    if p.kind == tuning_pb2.PRUNER_KIND_NONE:
        return optuna.pruners.NopPruner()
    if p.kind == tuning_pb2.PRUNER_KIND_SUCCESSIVE_HALVING:
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=p.min_resource or "auto", reduction_factor=p.reduction_factor or 4
        )
    if p.kind == tuning_pb2.PRUNER_KIND_HYPERBAND:
        return optuna.pruners.HyperbandPruner(
            min_resource=p.min_resource or 1,
            max_resource=p.max_resource or spec.task.epochs or "auto",
            reduction_factor=p.reduction_factor or 3,
        )
    return optuna.pruners.MedianPruner(
        n_startup_trials=p.startup_trials or 5, n_warmup_steps=p.warmup_steps
    )


def _grid(spec: tuning_pb2.StudySpec) -> dict[str, list[Choice]]:
    grid: dict[str, list[Choice]] = {}
    for param in spec.params:
        domain = param.WhichOneof("domain")
        if domain == "categorical":
            grid[param.name] = [
                v for v in (python_value(c) for c in param.categorical.choices) if v is not None
            ]
        elif domain == "int_range":
            i = param.int_range
            grid[param.name] = list(range(i.low, i.high + 1, i.step or 1))
        else:
            r = param.float_range
            count = round((r.high - r.low) / r.step) + 1
            grid[param.name] = [r.low + k * r.step for k in range(count)]
    return grid


class _BudgetedGrid(optuna.samplers.GridSampler):
    """Optuna's grid, which calls ``study.stop()`` once every point is tried:
    that works inside ``study.optimize`` only and raises in an ask-and-tell
    loop like the tuner's. The study's budget ends it here instead."""

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        return None


_SAMPLERS: dict[int, Callable[..., BaseSampler]] = {
    tuning_pb2.SAMPLER_KIND_UNSPECIFIED: optuna.samplers.TPESampler,
    tuning_pb2.SAMPLER_KIND_RANDOM: optuna.samplers.RandomSampler,
    tuning_pb2.SAMPLER_KIND_GRID: optuna.samplers.GridSampler,
    tuning_pb2.SAMPLER_KIND_TPE: optuna.samplers.TPESampler,
    tuning_pb2.SAMPLER_KIND_GP: optuna.samplers.GPSampler,
    tuning_pb2.SAMPLER_KIND_CMAES: optuna.samplers.CmaEsSampler,
}
_PRUNERS = frozenset(tuning_pb2.PrunerKind.values())


def _option_names(cls: Callable[..., Any]) -> set[str]:
    # What the spec may set by name; seed and the grid come from the spec itself.
    return set(inspect.signature(cls).parameters) - {"self", "seed", "search_space"}
