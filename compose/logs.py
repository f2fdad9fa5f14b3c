"""The launcher's log files: their last lines, and following them as they grow."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path


def last_lines(path: Path, count: int) -> str:
    """The last ``count`` lines of ``path`` ("" when it does not exist), read
    from the end: a Kafka log grows to hundreds of megabytes."""
    if count <= 0:
        return ""
    try:
        with path.open("rb") as file:
            end = file.seek(0, os.SEEK_END)
            position, data = end, b""
            while position > 0 and data.count(b"\n") <= count:
                step = min(65536, position)
                position -= step
                file.seek(position)
                data = file.read(step) + data
    except FileNotFoundError:
        return ""
    lines = data.decode(errors="replace").splitlines()
    return "\n".join(lines[-count:])


def follow(
    files: Mapping[str, Path], *, interval: float = 0.25, from_end: bool = True
) -> Iterator[tuple[str, str]]:
    """(name, line) for each line appended to ``files`` from now on, forever.

    A file that does not exist yet is waited for; one that shrinks (truncated
    or replaced) is read again from its start. Partial lines wait for their
    newline.
    """
    positions: dict[str, int] = {}
    pending: dict[str, bytes] = {}
    for name, path in files.items():
        try:
            positions[name] = path.stat().st_size if from_end else 0
        except FileNotFoundError:
            positions[name] = 0
        pending[name] = b""
    while True:
        for name, path in files.items():
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if size < positions[name]:
                positions[name], pending[name] = 0, b""
            if size == positions[name]:
                continue
            with path.open("rb") as file:
                file.seek(positions[name])
                data = file.read(size - positions[name])
            positions[name] += len(data)
            *complete, pending[name] = (pending[name] + data).split(b"\n")
            for line in complete:
                yield name, line.decode(errors="replace")
        time.sleep(interval)


def indent(text: str) -> str:
    """``text`` indented under an error message's first line."""
    return "\n".join(f"    {line}" for line in text.splitlines()) or "    (no log)"
