"""A reference to a user's function, ``"package.module:function"``: the form
``task.model``, ``task.entrypoint`` and a loader in ``task.dataset`` take.

The tuner checks the form when a study is created (``task_problem``); the
trainer checks it again for each trial, then imports it.
"""

from __future__ import annotations

import re

from shared.contracts.aistack.v1 import tuning_pb2

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ATTRIBUTE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def is_ref(text: str) -> bool:
    """Whether ``text`` names a function (it has the colon) rather than a
    built-in (a dataset name such as "digits")."""
    return ":" in text


def parse(text: str) -> tuple[str, str]:
    """(module, attribute) of ``text``; ValueError saying the expected form."""
    module, colon, attribute = text.partition(":")
    if not (colon and _MODULE.match(module) and _ATTRIBUTE.match(attribute)):
        raise ValueError(f"{text!r}: expected package.module:function")
    return module, attribute


def task_problem(task: tuning_pb2.TrainingTask) -> tuple[str, str] | None:
    """(field, what is wrong) for a task naming the user's code in a way no
    trainer can run, else None: a model and a loop at once, a built-in family
    beside either, a reference not of the form ``package.module:function``,
    a code package without its location or digest. The tuner refuses such a
    study; a trainer, such a trial."""
    if task.model and task.entrypoint:
        return "task.entrypoint", "set task.model or task.entrypoint, not both"
    if task.model_family and (task.model or task.entrypoint):
        return "task.model_family", "leave it empty with task.model or task.entrypoint"
    for field in ("model", "entrypoint", "dataset"):
        value = getattr(task, field)
        if value and (field != "dataset" or is_ref(value)):
            try:
                parse(value)
            except ValueError as exc:
                return f"task.{field}", str(exc)
    if task.HasField("code"):
        if not task.code.uri:
            return "task.code.uri", "is empty"
        digest = task.code.sha256
        if len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
            return "task.code.sha256", "expected the package's sha256, 64 hex digits"
    return None
