"""``--profile``: where a benchmark's time goes, kept beside its figures.

py-spy samples, from outside, each process a benchmark starts through
``harness.spawn`` (the services, and the peers run as processes) and the
benchmark's own process (the in-process peers and the work a benchmark does
itself). Per process it writes into ``bench/out/``:

- ``BENCH-LABEL.speedscope.json``, the samples as a flame graph
  (https://www.speedscope.app opens it; so does ``py-spy``'s own viewer);
- ``BENCH-LABEL.top.txt``, its frames ranked by the share of the samples in
  which each was running (self) and on the stack (total);

and prints the first lines of each table, so a run's log holds the hot frames.

py-spy reads Python stacks only: the JVM's share of a Spark job shows as the
Python frame that waits for it (a profile of svc_transform's Python side is
mostly ``py4j`` waiting). Only the standard library at module level, as in
``bench.harness``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"
RATE_HZ = 100
TOP_WRITTEN = 25
TOP_PRINTED = 8
TOP_THREADS = 6
STOP_WAIT_S = 60.0


@dataclass(frozen=True)
class FrameShare:
    frame: str
    self_share: float
    total_share: float


def top_frames(document: Mapping[str, Any], limit: int) -> tuple[int, list[FrameShare]]:
    """(samples, the ``limit`` frames that ran the most) of a speedscope
    document as py-spy writes it: one sampled profile per thread, each
    sample a stack of frame indices from the root to the running frame,
    weighted by the time it stands for. The root frame py-spy adds per
    process under ``--subprocesses`` (its command line) is no code, and
    is left out; so are the samples taken while a module was imported
    (start-up, most of a short run's samples, not the path measured)."""
    frames = document["shared"]["frames"]
    ran: defaultdict[int, float] = defaultdict(float)
    on_stack: defaultdict[int, float] = defaultdict(float)
    samples, weights = 0, 0.0
    for _, stack, weight in _measured(document):
        samples += 1
        weights += weight
        if stack:
            ran[stack[-1]] += weight
            for index in set(stack):
                on_stack[index] += weight
    if samples == 0:
        return 0, []
    code = [i for i in on_stack if not _is_process(frames[i])]
    ranked = sorted(code, key=lambda index: (-ran[index], -on_stack[index]))[:limit]
    return samples, [
        FrameShare(_frame_name(frames[i]), ran[i] / weights, on_stack[i] / weights) for i in ranked
    ]


def thread_seconds(document: Mapping[str, Any]) -> list[tuple[str, float]]:
    """Each thread's name and the seconds it ran (imports left out), the
    busiest first: a thread that works beside the one that serves shows
    here whether its work is what the run lost."""
    busy: dict[str, float] = {}
    for thread, _, weight in _measured(document):
        busy[thread] = busy.get(thread, 0.0) + weight
    return sorted(busy.items(), key=lambda item: -item[1])


def _measured(document: Mapping[str, Any]) -> Iterator[tuple[str, list[int], float]]:
    """(thread, stack, weight) of every sample not taken during an import."""
    importing = {i for i, frame in enumerate(document["shared"]["frames"]) if _is_import(frame)}
    for profile in document["profiles"]:
        name = str(profile.get("name", ""))
        quoted = name.split('"')
        thread = quoted[1] if len(quoted) > 2 else name.rsplit(" ", 1)[-1]
        thread = thread or "main"  # py-spy names a process's first thread ""
        for stack, weight in zip(profile["samples"], profile["weights"], strict=True):
            if not importing.intersection(stack):
                yield thread, stack, weight


def _is_import(frame: Mapping[str, Any]) -> bool:
    return str(frame.get("file") or "").startswith("<frozen importlib")


def _is_process(frame: Mapping[str, Any]) -> bool:
    return not frame.get("file") and str(frame["name"]).startswith("process ")


def _frame_name(frame: Mapping[str, Any]) -> str:
    where = str(frame.get("file") or "")
    root = f"{Path(__file__).resolve().parent.parent}{os.sep}"
    if where.startswith(root):
        where = where[len(root) :]
    elif "site-packages/" in where:
        where = where.split("site-packages/", 1)[1]
    line = frame.get("line")
    return f"{frame['name']} ({where}:{line})" if line else f"{frame['name']} ({where})"


def top_table(
    title: str,
    samples: int,
    shares: Sequence[FrameShare],
    threads: Sequence[tuple[str, float]] = (),
) -> str:
    lines = [f"{title}: {samples:,} samples at {RATE_HZ} Hz (idle threads and imports left out)"]
    if threads:
        ran = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in threads)
        lines.append(f"threads: {ran}")
    lines.append(f"{'self%':>6} {'total%':>7}  frame")
    lines += [f"{s.self_share:>6.1%} {s.total_share:>7.1%}  {s.frame}" for s in shares]
    return "\n".join(lines)


@dataclass
class _Sampler:
    label: str
    target: int
    process: subprocess.Popen[bytes]
    flame: Path


class Profiler:
    """py-spy on each process ``attach`` names, until it exits or ``finish``."""

    def __init__(self, bench: str, out_dir: Path = OUT) -> None:
        executable = shutil.which("py-spy", path=str(Path(sys.executable).parent))
        if executable is None:
            executable = shutil.which("py-spy")
        if executable is None:
            raise SystemExit("--profile needs py-spy: make setup installs it (the bench extra)")
        self._py_spy = executable
        self._bench = bench
        self._out = out_dir
        self._out.mkdir(parents=True, exist_ok=True)
        self._samplers: list[_Sampler] = []
        self._labels: Counter[str] = Counter()

    def attach(self, pid: int, label: str, *, subprocesses: bool = True) -> None:
        self._labels[label] += 1
        if self._labels[label] > 1:
            label = f"{label}-{self._labels[label]}"
        flame = self._out / f"{self._bench}-{label}.speedscope.json"
        command = [
            self._py_spy, "record", "--pid", str(pid), "--rate", str(RATE_HZ),
            "--format", "speedscope", "--output", str(flame), "--nonblocking",
        ]  # fmt: skip
        if subprocesses:
            command.append("--subprocesses")
        sampler = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self._samplers.append(_Sampler(label, pid, sampler, flame))

    def finish(self) -> list[Path]:
        """Stops the samplers whose process still runs (py-spy writes what it
        has on SIGINT), then writes and prints each top table."""
        written: list[Path] = []
        for sampler in self._samplers:
            if sampler.process.poll() is None:
                sampler.process.send_signal(signal.SIGINT)
            try:
                _, errors = sampler.process.communicate(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                sampler.process.kill()
                _, errors = sampler.process.communicate()
            if not sampler.flame.is_file():
                said = errors.decode(errors="replace").strip().splitlines()[-1:] or ["nothing"]
                print(f"profile {sampler.label}: py-spy wrote no profile ({said[0]})", flush=True)
                continue
            document = json.loads(sampler.flame.read_text())
            samples, shares = top_frames(document, TOP_WRITTEN)
            threads = thread_seconds(document)[:TOP_THREADS]
            title = f"profile {self._bench} {sampler.label} (pid {sampler.target})"
            table = sampler.flame.with_name(f"{self._bench}-{sampler.label}.top.txt")
            table.write_text(top_table(title, samples, shares, threads) + "\n")
            print(top_table(title, samples, shares[:TOP_PRINTED], threads), flush=True)
            print(f"  flame graph: {sampler.flame}\n  top frames:  {table}", flush=True)
            written += [sampler.flame, table]
        return written


_active: Profiler | None = None


def active() -> Profiler | None:
    """The profiler of the benchmark running in this process, under ``--profile``."""
    return _active


class _ProfileFlag(argparse.Action):
    """``--profile``: starts the profiler as the arguments are read, and
    finishes it as the process exits (after the benchmark stopped what it
    started, whose samplers have written their profiles by then)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        self._bench = kwargs.pop("bench")
        self._own_children = kwargs.pop("own_children")
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        global _active
        setattr(namespace, self.dest, True)
        if _active is None:
            _active = Profiler(self._bench)
            _active.attach(os.getpid(), "bench", subprocesses=self._own_children)
            atexit.register(_finish)


def _finish() -> None:
    global _active
    profiler, _active = _active, None
    if profiler is not None:
        profiler.finish()


def add_flag(parser: argparse.ArgumentParser, bench: str, *, own_children: bool = False) -> None:
    """Gives a benchmark ``--profile``: py-spy on its own process (with its
    children where ``own_children``: the Python workers of a Spark session
    it started) and on every process ``harness.spawn`` starts."""
    parser.add_argument(
        "--profile",
        action=_ProfileFlag,
        default=False,
        bench=bench,
        own_children=own_children,
        help="sample every process of the run with py-spy into bench/out/ "
        "(a speedscope flame graph and a top-frames table per process)",
    )


def label_of(command: Sequence[str]) -> str:
    """A spawned process's label: the module of ``python -m MODULE``, else
    the program's name."""
    if "-m" in command:
        index = list(command).index("-m")
        if index + 1 < len(command):
            return command[index + 1].replace(".", "_")
    return Path(command[0]).name
