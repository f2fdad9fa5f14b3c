"""How much memory a trial's processes hold: its executor and every process
under it (DDP ranks, TensorFlow workers, torchrun, a Spark driver's JVM).

Proportional set sizes (``/proc/PID/smaps_rollup``'s Pss) are summed, so the
libraries forked ranks share count once, not once per rank; where the kernel
has no rollup, resident sizes. Linux only: elsewhere it reads 0 (no limit is
enforced).
"""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it, parents first."""
    children = _children()
    found = [pid]
    index = 0
    while index < len(found):
        found.extend(c for c in children.get(found[index], ()) if c not in found)
        index += 1
    return found


def _children() -> dict[int, list[int]]:
    """Each process's children, by parent, from every ``/proc/PID/stat``
    (kernels without CONFIG_PROC_CHILDREN have no ``task/*/children``)."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # The command may hold spaces and parentheses: the fields follow the last ")".
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def process_bytes(pid: int) -> int:
    """One process's proportional set size (its resident size where the
    kernel has no rollup); 0 for a process that is gone."""
    try:
        for line in (_PROC / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resident_bytes(pid)


def resident_bytes(pid: int) -> int:
    """One process's resident size (``/proc/PID/statm``: a counter the
    kernel keeps, where the rollup walks every page table); 0 for a process
    that is gone."""
    try:
        pages = int((_PROC / str(pid) / "statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def tree_bytes(pid: int) -> int:
    """What ``pid`` and its descendants hold together."""
    return sum(process_bytes(p) for p in descendants(pid))


def tree_over(pid: int, limit: int) -> int:
    """What ``pid`` and its descendants hold together when that is over
    ``limit``, else 0. Their resident sizes first: a resident size is never
    below the proportional one, so a tree under the limit by the first is
    under it by the second, and the rollups (a trainer's watch read them
    twice a second: 6-9% of its CPU time, beside the training, in
    bench.study_speedup's profile) are read only for a tree that might be
    over."""
    tree = descendants(pid)
    if sum(resident_bytes(p) for p in tree) <= limit:
        return 0
    held = sum(process_bytes(p) for p in tree)
    return held if held > limit else 0


def machine_bytes() -> int:
    """This machine's physical memory (0 where it cannot be read)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0
