"""glibc malloc's settings for a process, through ``mallopt``; each returns
False where the C library is not glibc (nothing changes).

Imports only the standard library: ``shared.spark_daemon`` calls it before
Spark's Python workers are forked from it, and they inherit what it set;
svc_trainer's executors call it as they start.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

#: The largest block that glibc's own rule ever lets the heap serve: a
#: block freed after its own mapping raises the mapping threshold to its
#: size, up to 32 MiB on a 64-bit machine (``DEFAULT_MMAP_THRESHOLD_MAX``),
#: and the trim threshold to twice that.
HELD_MMAP_THRESHOLD = 32 << 20
HELD_TRIM_THRESHOLD = 2 * HELD_MMAP_THRESHOLD


def _mallopt() -> Callable[[int, int], int] | None:
    try:
        found: Callable[[int, int], int] = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    return found


def limit_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas for threads started from now on."""
    mallopt = _mallopt()
    return mallopt is not None and bool(mallopt(_M_ARENA_MAX, arenas))


def hold_freed_memory() -> bool:
    """Keep freed blocks of up to ``HELD_MMAP_THRESHOLD`` in the heap, and
    up to ``HELD_TRIM_THRESHOLD`` of free heap, for the next allocations,
    from the start: the settings glibc's own rule reaches only after the
    process has freed a block that large, which a process working in
    batches of a few MiB never does. Until then each batch's arrays come
    from fresh pages, faulted in one by one, and go back to the kernel when
    the batch ends: in a Python worker of ``aistack score``'s job, 32,000 to
    49,000 page faults in a task's 25 batches, the batches' scoring twice as
    long as the same code's in a process that had freed a large block (a
    fresh session's first large job, the one bench.batch_scoring times,
    0.75-0.78 s against 0.61-0.63 s with this, on the 2-core build
    machine); in a trainer's
    executor, 24,000 faults in a 4-epoch digits trial against 1,300."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    # The mapping threshold first: setting either one turns glibc's own rule
    # off, and with it off, blocks from 128 KiB up would be mapped afresh.
    return bool(mallopt(_M_MMAP_THRESHOLD, HELD_MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, HELD_TRIM_THRESHOLD)
    )
