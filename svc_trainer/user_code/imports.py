"""Importing a user's function named ``"package.module:function"``.

The code is on the path already: installed in the trainer's environment, or
a shipped package the executor put first on ``sys.path``
(``svc_trainer.user_code.packages``). A name that cannot be imported fails
the trial with one line saying why, and the whole study with it: every trial
would fail the same way.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from shared import code_refs
from svc_trainer.plan import TrialError
from svc_trainer.user_code.failures import MISSING_DEPENDENCY, USER_CODE_IMPORT, traceback_tail


def resolve(ref: str, field: str) -> Callable[..., Any]:
    """The function ``ref`` names (``field`` says which setting named it, for
    the message). Raises TrialError (``user_code_import`` or
    ``missing_dependency``, fatal to the study)."""
    try:
        module_name, attribute = code_refs.parse(ref)
    except ValueError as exc:
        raise TrialError(f"{field} {exc}", reason=USER_CODE_IMPORT, fatal_to_study=True) from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        ours = exc.name is not None and module_name.split(".")[0] == exc.name.split(".")[0]
        if ours or exc.name is None:
            raise TrialError(
                f"cannot import {field} {ref!r}: no module {exc.name or module_name!r} "
                "(ship the code with the study, --code DIR, or install it in the trainer's "
                "environment)",
                reason=USER_CODE_IMPORT,
                traceback=traceback_tail(exc),
                fatal_to_study=True,
            ) from exc
        raise TrialError(
            f"{field} {ref!r} imports {exc.name!r}, which the trainer's environment lacks: "
            "install it in the trainer's image or environment",
            reason=MISSING_DEPENDENCY,
            traceback=traceback_tail(exc),
            fatal_to_study=True,
        ) from exc
    except BaseException as exc:  # a syntax error, an exception at import, sys.exit
        raise TrialError(
            f"cannot import {field} {ref!r}: {type(exc).__name__}: {exc}",
            reason=USER_CODE_IMPORT,
            traceback=traceback_tail(exc),
            fatal_to_study=True,
        ) from exc
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise TrialError(
                f"cannot import {field} {ref!r}: {module_name} has no {attribute!r}",
                reason=USER_CODE_IMPORT,
                fatal_to_study=True,
            )
        found = getattr(found, part)
    if not callable(found):
        raise TrialError(
            f"{field} {ref!r} is a {type(found).__name__}, not a function",
            reason=USER_CODE_IMPORT,
            fatal_to_study=True,
        )
    result: Callable[..., Any] = found
    return result
