"""What a process's batches cost in page faults when each holds a few MiB
live and frees it: the probe of the tests that hold Spark's Python workers
and plain processes to ``shared.malloc.hold_freed_memory``."""

from __future__ import annotations

import resource

#: A batch holds 24 blocks of 2 MiB live: each below the most glibc keeps
#: in the heap for reuse, all together below the most free heap it keeps.
BATCH_BLOCKS = 24
BLOCK_BYTES = 2 << 20
#: One batch's pages: what glibc's default faults in again in every batch.
BATCH_PAGES = BATCH_BLOCKS * BLOCK_BYTES // resource.getpagesize()


def batches_faults(batches: int = 8) -> int:
    """The page faults of ``batches`` batches, after one batch before."""

    def batch() -> None:
        blocks = [bytearray(BLOCK_BYTES) for _ in range(BATCH_BLOCKS)]
        del blocks

    batch()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(batches):
        batch()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
