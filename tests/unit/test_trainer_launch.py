"""The trainer's one local launcher (``svc_trainer.backends.launch.LocalGroup``), on
real child processes: a module worker's environment and exit code, a
function worker bound to its parent, the failure watch, and the reaping.
No framework: the workers here are tiny functions and this module itself.

Run as a module (``python -m tests.unit.test_trainer_launch``), this file is
a worker that exits with the code its environment names."""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from typing import Any

import pytest

from svc_trainer.backends.launch import LocalGroup

EXIT_CODE_VARIABLE = "AISTACK_TEST_LAUNCH_EXIT"
_PR_GET_PDEATHSIG = 2


def _context() -> Any:
    return mp.get_context("fork")


def _exit_with(code: int) -> None:
    os._exit(code)


def _sleep_until_killed(ready: Any, ignore_sigterm: bool) -> None:
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    while True:
        time.sleep(1)


def _exit_zero_if_bound_to_parent() -> None:
    """Exit 0 when the kernel will SIGKILL this process with its parent."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    signal_number = ctypes.c_int(0)
    libc.prctl(_PR_GET_PDEATHSIG, ctypes.byref(signal_number), 0, 0, 0)
    os._exit(0 if signal_number.value == signal.SIGKILL else 1)


def test_a_module_worker_runs_with_its_own_environment_and_its_code_is_collected() -> None:
    with LocalGroup("launch-test") as group:
        group.start_module("task:0", __name__, [], {EXIT_CODE_VARIABLE: "0"})
        group.start_module("task:1", __name__, [], {EXIT_CODE_VARIABLE: "3"})
        assert group.wait(60)

    assert group.exit_codes() == {"task:0": 0, "task:1": 3}
    assert group.failed() == [("task:1", 3)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal")
def test_a_function_worker_dies_with_its_parent() -> None:
    with LocalGroup("launch-test") as group:
        group.start_function("rank:1", _context(), _exit_zero_if_bound_to_parent, ())
        assert group.wait(60)

    assert group.exit_codes() == {"rank:1": 0}


def test_watch_reports_the_first_worker_that_fails() -> None:
    reported: list[tuple[str, int]] = []
    seen = threading.Event()

    def on_failure(worker: str, code: int) -> None:
        reported.append((worker, code))
        seen.set()

    with LocalGroup("launch-test") as group:
        group.start_function("rank:1", _context(), _exit_with, (5,))
        group.watch(on_failure)
        assert seen.wait(60)

    assert reported == [("rank:1", 5)]


def test_closing_terminates_the_workers_and_kills_one_that_ignores_it() -> None:
    context = _context()
    polite, stubborn = context.Event(), context.Event()
    group = LocalGroup("launch-test", grace_s=0.5)
    try:
        group.start_function("rank:1", context, _sleep_until_killed, (polite, False))
        group.start_function("rank:2", context, _sleep_until_killed, (stubborn, True))
        assert polite.wait(60) and stubborn.wait(60)
        assert group.exit_codes() == {"rank:1": None, "rank:2": None}
    finally:
        # Also when an assertion fails: a worker left asleep would hang
        # pytest's exit (multiprocessing joins its children).
        group.close()

    assert group.exit_codes() == {"rank:1": -signal.SIGTERM, "rank:2": -signal.SIGKILL}


def test_an_exception_in_the_group_reaps_its_workers() -> None:
    context = _context()
    ready = context.Event()
    with pytest.raises(RuntimeError, match="rank 0 failed"), LocalGroup("launch-test") as group:
        group.start_function("rank:1", context, _sleep_until_killed, (ready, False))
        assert ready.wait(60)
        raise RuntimeError("rank 0 failed")

    assert group.exit_codes() == {"rank:1": -signal.SIGTERM}


if __name__ == "__main__":
    sys.exit(int(os.environ[EXIT_CODE_VARIABLE]))
