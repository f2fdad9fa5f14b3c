"""shared.malloc: glibc's malloc settings, each in a process of its own (they
hold for the whole process)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.memory_probe import BATCH_PAGES

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the settings are glibc's mallopt"
)

_BATCHES = "from tests.memory_probe import batches_faults; print(batches_faults())"
_ROOT = Path(__file__).resolve().parents[2]


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=_ROOT,
    )
    return done.stdout.strip()


def test_arenas_are_capped() -> None:
    assert run("from shared.malloc import limit_arenas; print(limit_arenas(2))") == "True"


def test_a_batch_reuses_what_the_batch_before_freed() -> None:
    setting = "from shared.malloc import hold_freed_memory; print(hold_freed_memory())"
    applied, faults = run(f"{setting}\n{_BATCHES}").splitlines()
    assert applied == "True"
    # glibc's default: each batch's pages back to the kernel and faulted in again.
    assert int(run(_BATCHES)) > 8 * BATCH_PAGES * 9 // 10
    assert int(faults) < BATCH_PAGES // 10
