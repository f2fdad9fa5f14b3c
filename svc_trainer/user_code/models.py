"""A model of the user's: ``task.model: "package.module:function"``.

The function is called with the trial's parameters (every one of them, the
user's own untouched) and its data (an ``aistack.Dataset``: its shapes,
task and classes, and the arrays for statistics such as a normalisation's),
and returns the framework's model: a ``torch.nn.Module`` that maps a batch
of inputs to logits (a classification) or the prediction (a regression,
one column), or a ``keras.Model`` that does the same. The platform's loops
train it like a built-in family, under every strategy, and export it with
a softmax for a classifier.
"""

from __future__ import annotations

from typing import Any

from svc_trainer.plan import DataSplits, RunSpec, TrialError
from svc_trainer.user_code import failures
from svc_trainer.user_code.imports import resolve
from svc_trainer.user_code.loop import dataset_view


def build(spec: RunSpec, data: DataSplits, expected: type, kind: str) -> Any:
    """The model ``spec.model`` builds; TrialError when it cannot be
    imported (fatal to the study), raises, or returns no ``expected``."""
    field = f"task.model {spec.model!r}"
    builder = resolve(spec.model, "task.model")
    try:
        model = builder(dict(spec.params), dataset_view(data))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise failures.from_exception(exc, field) from exc
    if not isinstance(model, expected):
        raise TrialError(
            f"{field} returned a {type(model).__name__}, not a {kind}",
            reason=failures.USER_CODE_ERROR,
        )
    return model
