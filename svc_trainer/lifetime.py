"""Processes that must not outlive the one that started them.

A trial's process and its ranks or workers train on behalf of one trainer;
if that trainer is killed (kill -9, OOM), they must die too, or they would go
on writing the trial's checkpoints beside the run that resumes it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Kill this process when its parent exits: the kernel's parent-death
    signal on Linux, else a thread watching the parent's pid."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            # The parent may have died before prctl took effect.
            if os.getppid() != parent:
                os._exit(1)
            return
    threading.Thread(target=_watch, args=(parent,), daemon=True, name="parent-watch").start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)
