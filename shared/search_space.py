"""A study's search space as Optuna reads it: each ``aistack.v1.ParamSpec`` as
an Optuna distribution, the objective's direction, and parameter values
between ``ParamValue`` and Python.

The one rule for both sides of the tuner's API: svc_tuner asks and replays
with these distributions, and a client that rebuilds a study from the API's
trials (``aistack.report``) reads them the same way. Optuna is imported
inside the functions that return its objects: a reader of values alone needs
none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shared.contracts.aistack.v1 import common_pb2, tuning_pb2

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.study import StudyDirection

Choice = float | int | str | bool


def python_value(value: common_pb2.ParamValue) -> Choice | None:
    """The Python value a ``ParamValue`` holds; None when it holds none."""
    kind = value.WhichOneof("kind")
    return None if kind is None else getattr(value, kind)


def param_value(value: Any) -> common_pb2.ParamValue:
    """A Python parameter value as ParamValue, keeping its type (bool before int)."""
    if isinstance(value, bool):
        return common_pb2.ParamValue(bool_value=value)
    if isinstance(value, int):
        return common_pb2.ParamValue(int_value=value)
    if isinstance(value, float):
        return common_pb2.ParamValue(float_value=value)
    if isinstance(value, str):
        return common_pb2.ParamValue(string_value=value)
    raise TypeError(f"no ParamValue for {type(value).__name__}")


def direction(spec: tuning_pb2.StudySpec) -> StudyDirection:
    """The objective's direction as Optuna's (minimise unless the spec says maximise)."""
    from optuna.study import StudyDirection

    maximize = spec.objective.direction == common_pb2.DIRECTION_MAXIMIZE
    return StudyDirection.MAXIMIZE if maximize else StudyDirection.MINIMIZE


def distributions(spec: tuning_pb2.StudySpec) -> dict[str, BaseDistribution]:
    """Each parameter of ``spec`` as an Optuna distribution: a float range
    (a step of 0 is continuous), an int range (a step of 0 is 1), a
    categorical's choices in order. Assumes a valid spec (svc_tuner's
    ``spec.validate``)."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    space: dict[str, BaseDistribution] = {}
    for param in spec.params:
        domain = param.WhichOneof("domain")
        if domain == "float_range":
            r = param.float_range
            space[param.name] = FloatDistribution(r.low, r.high, log=r.log, step=r.step or None)
        elif domain == "int_range":
            i = param.int_range
            space[param.name] = IntDistribution(i.low, i.high, log=i.log, step=i.step or 1)
        else:
            choices = tuple(python_value(c) for c in param.categorical.choices)
            space[param.name] = CategoricalDistribution(choices)
    return space


__all__ = ["Choice", "direction", "distributions", "param_value", "python_value"]
