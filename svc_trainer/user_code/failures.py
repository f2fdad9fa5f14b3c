"""What a user's code did wrong, as a failure a user can act on.

Each failure has a reason, one line saying what happened, the last lines of
the traceback, and whether another attempt may go otherwise (retryable):

- the code cannot be imported (no such module, a syntax error, an error at
  import): ``user_code_import``; it imports a module the trainer's
  environment lacks: ``missing_dependency``. Not retryable, and fatal to the
  study (every trial would fail the same).
- it raised an exception: ``user_code_error``, not retryable; but an OSError
  (a file, the network) is retryable.
- it called ``sys.exit``: ``user_code_exit``; it raised MemoryError:
  ``out_of_memory``. Not retryable.
- a report the platform cannot use (no objective, a NaN one, steps that do
  not increase): ``unknown_metric``, ``nan_metric``, ``invalid_report``; it
  returned without reporting: ``no_report``; its model cannot be exported:
  ``export_failed``. Not retryable.

Failures that end the process (``os.abort()``, a segfault, the kernel's
out-of-memory kill) or make it hang are seen by the worker: see
``svc_trainer.worker``.
"""

from __future__ import annotations

import traceback as tracebacks

from aistack.trial import ExportFailed, InvalidReport
from svc_trainer.plan import TrialError

USER_CODE_IMPORT = "user_code_import"
MISSING_DEPENDENCY = "missing_dependency"
USER_CODE_ERROR = "user_code_error"
USER_CODE_EXIT = "user_code_exit"
OUT_OF_MEMORY = "out_of_memory"
NO_REPORT = "no_report"
#: Lines of a traceback a failure keeps.
TRACEBACK_LINES = 15


def traceback_tail(exc: BaseException, lines: int = TRACEBACK_LINES) -> str:
    """The last ``lines`` lines of ``exc``'s traceback (its message last)."""
    text = "".join(tracebacks.format_exception(exc)).rstrip()
    return "\n".join(text.splitlines()[-lines:])


def from_exception(exc: BaseException, where: str) -> TrialError:
    """The failure for ``exc``, raised by the user's ``where`` ("training
    loop", "task.model 'pkg.mod:build'"...)."""
    tail = traceback_tail(exc)
    if isinstance(exc, TrialError):
        return exc
    if isinstance(exc, InvalidReport):
        return TrialError(str(exc), reason=exc.reason, traceback=tail)
    if isinstance(exc, ExportFailed):
        return TrialError(f"the {where}'s export: {exc}", reason=exc.reason, traceback=tail)
    if isinstance(exc, SystemExit):
        return TrialError(
            f"the {where} called sys.exit({exc.code!r}): end the function with return instead",
            reason=USER_CODE_EXIT,
            traceback=tail,
        )
    if isinstance(exc, MemoryError):
        return TrialError(
            f"the {where} ran out of memory (MemoryError): smaller batches or model",
            reason=OUT_OF_MEMORY,
            traceback=tail,
        )
    said = f"{type(exc).__name__}: {exc}"
    return TrialError(
        f"the {where} raised {said[:1000]}",
        reason=USER_CODE_ERROR,
        # I/O may go otherwise next time (a file server, the network); a bug will not.
        retryable=isinstance(exc, OSError),
        traceback=tail,
    )
