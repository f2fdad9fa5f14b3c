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
mostly ``py4j`` waiting). So the Spark driver of each such process (and of
the benchmark's own) records itself too, with the JVM's flight recorder
(``SPARK_SUBMIT_OPTS``, the options spark-submit gives the driver's JVM and
no other: the job's own Spark settings stay as they are; local mode runs
the tasks in the driver), into ``BENCH-LABEL.jfr.d/`` as it exits, and
``BENCH-LABEL.jvm-top.txt`` ranks its Java frames and threads the same way
(``jfr print``'s execution samples).
Only the standard library at module level, as in ``bench.harness``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"
RATE_HZ = 100
TOP_WRITTEN = 25
TOP_PRINTED = 8
TOP_THREADS = 6
STOP_WAIT_S = 60.0
#: JVM options spark-submit gives the driver it starts (pyspark's too).
DRIVER_OPTIONS_ENV = "SPARK_SUBMIT_OPTS"
#: Frames ``jfr print`` gives per sample (the flight recorder keeps 64).
JFR_STACK_DEPTH = 64


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
    return "\n".join([*lines, *_share_rows(shares)])


def _share_rows(shares: Sequence[FrameShare]) -> list[str]:
    return [
        f"{'self%':>6} {'total%':>7}  frame",
        *(f"{s.self_share:>6.1%} {s.total_share:>7.1%}  {s.frame}" for s in shares),
    ]


_FLIGHT_OPTION = re.compile(r"-XX:StartFlightRecording=\S*")
_JFR_THREAD = re.compile(r'^\s*sampledThread = "(.*)" \(javaThreadId')
# A frame: "    pkg.Class.method(ArgType, ...) line: N" (native ones have no line).
_JFR_FRAME = re.compile(r"^\s+([\w$.<>/]+)\([^)]*\)(?:\s+line:\s*[0-9]+)?\s*$")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_DIGITS = re.compile(r"[0-9]+")


def jvm_top_frames(
    printed: Iterable[str], limit: int
) -> tuple[int, list[FrameShare], list[tuple[str, float]]]:
    """(samples, the ``limit`` Java methods that ran the most, the threads'
    shares) from ``jfr print --events jdk.ExecutionSample``'s text, read a
    line at a time (a long run prints hundreds of megabytes). Threads are
    grouped by name with their numbers and ids left out (Spark's task
    threads are one per task, "Executor task launch worker for task N.0 in
    stage ...", a query's thread is named by its ids)."""
    ran: Counter[str] = Counter()
    on_stack: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    samples = 0
    frames: list[str] | None = None
    thread = ""
    for line in printed:
        if line.startswith("jdk.ExecutionSample"):
            frames, thread = [], ""
        elif frames is None:
            continue
        elif line.startswith("}"):
            if frames:
                samples += 1
                ran[frames[0]] += 1
                on_stack.update(set(frames))
                threads[_DIGITS.sub("N", _UUID.sub("ID", thread))] += 1
            frames = None
        elif (frame := _JFR_FRAME.match(line)) is not None:
            frames.append(frame.group(1))
        elif (named := _JFR_THREAD.match(line)) is not None:
            thread = named.group(1)
    if samples == 0:
        return 0, [], []
    ranked = sorted(on_stack, key=lambda name: (-ran[name], -on_stack[name]))[:limit]
    shares = [FrameShare(name, ran[name] / samples, on_stack[name] / samples) for name in ranked]
    return samples, shares, [(name, count / samples) for name, count in threads.most_common()]


def jvm_top_table(
    title: str,
    samples: int,
    shares: Sequence[FrameShare],
    threads: Sequence[tuple[str, float]] = (),
) -> str:
    lines = [f"{title}: {samples:,} execution samples (the flight recorder's, Java frames)"]
    if threads:
        lines.append("threads: " + ", ".join(f"{name} {share:.0%}" for name, share in threads))
    return "\n".join([*lines, *_share_rows(shares)])


def jfr_executable() -> str | None:
    """The JDK's ``jfr`` beside the java Spark starts (``JAVA_HOME``), else on PATH."""
    home = os.environ.get("JAVA_HOME")
    beside = Path(home) / "bin" / "jfr" if home else None
    if beside is not None and beside.is_file():
        return str(beside)
    return shutil.which("jfr")


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
        self._recordings: dict[str, Path] = {}

    def unique_label(self, label: str) -> str:
        """``label``, numbered from its second use on (``svc_model-2``)."""
        self._labels[label] += 1
        return label if self._labels[label] == 1 else f"{label}-{self._labels[label]}"

    def jvm_env(self, env: Mapping[str, str], label: str) -> dict[str, str]:
        """``env`` asking a Spark driver's JVM started with it to record itself
        into ``BENCH-LABEL.jfr.d/`` (``label`` as ``unique_label`` gave it)."""
        # A directory: each JVM writes a file of its own into it, named by
        # its pid (a process the benchmark starts some other way, with this
        # environment, adds its own file instead of overwriting one).
        recordings = self._out / f"{self._bench}-{label}.jfr.d"
        shutil.rmtree(recordings, ignore_errors=True)  # an earlier run's
        recordings.mkdir(parents=True)
        self._recordings[label] = recordings
        # The recording a parent's environment asked for makes way for this one.
        options = _FLIGHT_OPTION.sub("", env.get(DRIVER_OPTIONS_ENV, "")).strip()
        flight = f"-XX:StartFlightRecording=filename={recordings},settings=profile,dumponexit=true"
        return {**env, DRIVER_OPTIONS_ENV: f"{options} {flight}".strip()}

    @contextlib.contextmanager
    def jvm_environ(self, label: str) -> Iterator[None]:
        """This process's environment as ``jvm_env`` makes it, while a child
        is started that takes it (a spawned ``multiprocessing`` process)."""
        was = os.environ.get(DRIVER_OPTIONS_ENV)
        os.environ[DRIVER_OPTIONS_ENV] = self.jvm_env(os.environ, label)[DRIVER_OPTIONS_ENV]
        try:
            yield
        finally:
            if was is None:
                os.environ.pop(DRIVER_OPTIONS_ENV, None)
            else:
                os.environ[DRIVER_OPTIONS_ENV] = was

    def attach(
        self, pid: int, label: str, *, subprocesses: bool = True, unique: bool = False
    ) -> None:
        """py-spy on ``pid``; ``unique``: ``label`` came from ``unique_label``."""
        if not unique:
            label = self.unique_label(label)
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
        for label, recording in self._recordings.items():
            written += self._jvm_table(label, recording)
        return written

    def _jvm_table(self, label: str, recordings: Path) -> list[Path]:
        """A top table per recording its JVMs wrote into ``recordings`` (a
        process that started no Spark session writes none, and says nothing)."""
        found = sorted(recordings.glob("*.jfr"))
        if not found:
            shutil.rmtree(recordings, ignore_errors=True)
            return []
        jfr = jfr_executable()
        if jfr is None:
            print(f"profile {label}: no jfr (a JDK's) to read {recordings}", flush=True)
            return found
        written: list[Path] = []
        for number, recording in enumerate(found, 1):
            name = label if len(found) == 1 else f"{label}-jvm{number}"
            command = [jfr, "print", "--events", "jdk.ExecutionSample"]
            command += ["--stack-depth", str(JFR_STACK_DEPTH), str(recording)]
            with subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            ) as printing:
                assert printing.stdout is not None
                samples, shares, threads = jvm_top_frames(printing.stdout, TOP_WRITTEN)
            title = f"profile {self._bench} {name} (the JVM)"
            table = self._out / f"{self._bench}-{name}.jvm-top.txt"
            table.write_text(jvm_top_table(title, samples, shares, threads[:TOP_THREADS]) + "\n")
            print(jvm_top_table(title, samples, shares[:TOP_PRINTED], threads[:3]), flush=True)
            print(f"  flight recording: {recording}\n  top frames:  {table}", flush=True)
            written += [recording, table]
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
            label = _active.unique_label("bench")
            # A Spark session the benchmark starts itself reads this.
            os.environ[DRIVER_OPTIONS_ENV] = _active.jvm_env(os.environ, label)[DRIVER_OPTIONS_ENV]
            _active.attach(os.getpid(), label, subprocesses=self._own_children, unique=True)
            atexit.register(_finish)


def _finish() -> None:
    global _active
    profiler, _active = _active, None
    if profiler is not None:
        if "pyspark" in sys.modules:
            # The benchmark's own driver JVM writes its recording as it exits,
            # which pyspark leaves until after this process has.
            from shared.spark_session import stop_driver_jvm

            stop_driver_jvm()
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
