"""shared.malloc: glibc's malloc settings, each in a process of its own (they
hold for the whole process)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the settings are glibc's mallopt"
)

# Eight batches that each hold 24 blocks of 2 MiB live, then free them, after
# one batch before: the page faults they cost.
_BATCHES = """
import resource
def batch():
    blocks = [bytearray(2 << 20) for _ in range(24)]
    del blocks
batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    batch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


def test_arenas_are_capped() -> None:
    assert run("from shared.malloc import limit_arenas; print(limit_arenas(2))") == "True"


def test_a_batch_reuses_what_the_batch_before_freed() -> None:
    setting = "from shared.malloc import hold_freed_memory; print(hold_freed_memory())"
    applied, faults = run(f"{setting}\n{_BATCHES}").splitlines()
    assert applied == "True"
    # glibc's default: each batch's 12,288 pages back to the kernel and faulted in again.
    assert int(run(_BATCHES)) > 8 * 12_288 * 9 // 10
    assert int(faults) < 12_288 // 10
