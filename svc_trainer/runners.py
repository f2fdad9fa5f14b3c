"""Framework runners by name: the frameworks this trainer can train with.

A trial names its framework (``task.framework``, or a ``framework``
parameter); the name picks a ``plan.Runner``, given here as the import path
of an object ("module:attribute") so that the worker names runners without
importing any framework: only an executor imports its runner. More runners
(a JAX runner, say) are registered with ``AISTACK_TRAINER_RUNNERS``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from svc_trainer.plan import Runner, TrialError

BUILT_IN: Mapping[str, str] = {
    "torch": "svc_trainer.backends.torch.runner:RUNNER",
    "tensorflow": "svc_trainer.backends.tensorflow.runner:RUNNER",
}


def registry(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The built-in runners and ``extra`` (which may replace one)."""
    return {**BUILT_IN, **(extra or {})}


def load(path: str) -> Runner:
    """The runner at ``path`` ("module:attribute"), imported here. Raises
    TrialError when it cannot be imported or is not a Runner."""
    module_name, _, attribute = path.partition(":")
    try:
        runner = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise TrialError(
            f"runner {path!r} cannot be loaded: {exc}", reason="unknown_framework"
        ) from exc
    if not isinstance(runner, Runner):
        raise TrialError(
            f"{path!r} is a {type(runner).__name__}, not a Runner "
            "(name, warm_up, fresh_process, run, release)",
            reason="unknown_framework",
        )
    return runner


def check_path(path: str) -> str:
    """``path`` if it has the "module:attribute" form, else ValueError."""
    module_name, colon, attribute = path.partition(":")
    if not (module_name and colon and attribute.isidentifier()):
        raise ValueError(f"{path!r}: expected module:attribute")
    return path
