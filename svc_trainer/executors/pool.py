"""Warm trial executors: one long-lived process per framework, reused trial
after trial.

Ray Tune calls the idea ``reuse_actors``; here it is done for a bus. An
executor imports its framework's runner once (``Runner.warm_up``: the
framework, its threads, the compilers every trial would otherwise pay for
first), keeps the datasets it loaded (by ``data.cache_key``) and then trains
the trials the worker hands it, one at a time. Everything a process per
trial gave is kept:

- a crash, a leak, an out-of-memory kill or a hung collective stays in the
  executor, which the worker can always kill and replace; the worker lives on;
- prune, stop and SIGTERM reach the run through a shared flag the runner
  reads between batches, so they are honoured within one epoch;
- a run that stops checking in (no check between batches, no report) for
  the worker's stall limit is taken for hung (a collective that never
  returns, a deadlock): the executor is killed and replaced;
- the executor is recycled after ``max_trials`` trials or once its resident
  memory passes a limit (the worker's settings); framework state and GPU
  memory are released after every trial (``Runner.release``);
- a trial whose strategy needs a framework runtime that never ran
  (``Runner.fresh_process``) is handed back by a warm executor and runs in
  a one-shot executor of its own, which exits after it.

Executors are started with ``spawn`` (no inherited Kafka clients or threads)
and are not daemons, so they may start the ranks or workers of a
multi-process strategy. They die with the worker (``die_with_parent``).

Three modules, by the side of the pipe: this one is the worker's (the
``Executor`` handle and the ``ExecutorPool``), ``executor_process`` is what
runs in the executor, and ``executor_events`` is what they say to each
other.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.log import get_logger
from svc_trainer.executors.events import (
    Epoch,
    Event,
    Failed,
    Finished,
    Idle,
    Job,
    NeedsFresh,
    Ready,
    Started,
    UseCode,
)
from svc_trainer.executors.process import executor_main
from svc_trainer.plan import CodeRef, DataLoaded, StopReason, TrialError

log = get_logger("svc_trainer")


class Executor:
    """One executor process, seen from the worker."""

    def __init__(
        self,
        framework: str,
        runner_path: str,
        *,
        one_shot: bool = False,
        threads: int = 0,
        cached_datasets: int = 4,
        log_level: str = "INFO",
        log_format: str = "json",
        code: CodeRef | None = None,
        crash_dir: Path | None = None,
    ) -> None:
        self.framework = framework
        self.one_shot = one_shot
        #: The shipped code package its trials import from (None: installed code).
        self.code = code
        self._crash_file: Path | None = None
        if crash_dir is not None:
            crash_dir.mkdir(parents=True, exist_ok=True)
            self._crash_file = crash_dir / f"executor-{uuid.uuid4().hex[:12]}.txt"
        self.trials = 0
        self.busy = False
        self.ready = False
        self.started_at = time.monotonic()
        context = mp.get_context("spawn")
        # A pipe and raw shared memory, no queues or locks: a kill -9 of the
        # worker then leaves no semaphores for the resource tracker to mourn.
        # One writer each way: jobs from here, events from the executor.
        self._pipe, theirs = context.Pipe(duplex=True)
        self._stop = context.RawValue("i", int(StopReason.NONE))
        # Bumped by the run at every check (between batches) and report.
        self._beats = context.RawValue("Q", 0)
        self._seen_beats = (0, time.monotonic())
        self._gone = False
        self._process = context.Process(
            target=executor_main,
            args=(
                runner_path,
                one_shot,
                threads,
                cached_datasets,
                theirs,
                self._stop,
                self._beats,
                log_level,
                log_format,
                code.directory if code is not None else "",
                str(self._crash_file or ""),
            ),
            name=f"executor-{framework}{'-one-shot' if one_shot else ''}",
            daemon=False,
        )
        self._process.start()
        theirs.close()  # the executor's end: its death then reads as EOF here

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def bind(self, code: CodeRef) -> None:
        """Make a spare executor (one that ran no trial) the executor of
        ``code``: its trials import from the package from now on."""
        self.code = code
        self._send(UseCode(code.directory))

    def submit(self, job: Job) -> None:
        """Hand the executor a trial (it starts once the executor is ready)."""
        self._stop.value = int(StopReason.NONE)
        self.busy = True
        self.trials += 1
        self._seen_beats = (self._beats.value, time.monotonic())
        self._send(job)

    def quiet_for(self) -> float:
        """Seconds since the run last checked in (a check between batches,
        a report): how long it may have been stuck."""
        beats, since = self._seen_beats
        now = time.monotonic()
        if self._beats.value != beats:
            self._seen_beats = (self._beats.value, now)
            return 0.0
        return now - since

    def request_stop(self, reason: StopReason) -> None:
        """Ask the run to stop at its next check. A shutdown wins over a
        prune (the trial is handed back rather than reported)."""
        # Only the worker's loop writes it: no lock needed.
        if reason is StopReason.SHUTDOWN or self._stop.value == StopReason.NONE:
            self._stop.value = int(reason)

    def events(self, timeout: float) -> list[Event]:
        """What the executor said since the last call, waiting up to
        ``timeout`` for the first event."""
        out: list[Event] = []
        try:
            if not self._gone and self._pipe.poll(timeout):
                out.append(self._pipe.recv())
                while self._pipe.poll(0):
                    out.append(self._pipe.recv())
        except (EOFError, OSError):
            self._gone = True  # it died; alive() says so
        if out:  # anything it says is progress too
            self._seen_beats = (self._beats.value, time.monotonic())
        for event in out:
            if isinstance(event, Ready):
                self.ready = True
            elif isinstance(event, Idle | NeedsFresh):
                self.busy = False
        return out

    def _send(self, job: Job | UseCode | None) -> None:
        try:
            self._pipe.send(job)
        except (BrokenPipeError, OSError):
            self._gone = True  # it died; the watch loop sees it

    def alive(self) -> bool:
        return self._process.is_alive()

    @property
    def exitcode(self) -> int | None:
        return self._process.exitcode

    def death(self) -> str:
        """How the process ended, in words."""
        code = self._process.exitcode
        if code is None:
            return "still running"
        if code < 0:
            import signal

            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code}"

    def retire(self, timeout: float = 10.0) -> None:
        """Let the executor finish and exit; killed if it does not in time.
        One still warming up holds no trial: it is killed at once rather
        than waited for (a trainer stopped just after it started)."""
        self.events(timeout=0)  # a Ready already sent counts
        if self._process.is_alive() and (self.ready or self.busy):
            self._send(None)
            self._process.join(timeout)
        self.kill()

    def kill(self) -> None:
        """Kill the process (its ranks and workers die with it)."""
        if self._process.is_alive():
            self._process.kill()
        self._process.join(timeout=30)
        self.close()

    def crash_report(self, lines: int = 15) -> str:
        """The Python stack of the thread a signal killed the process in, as
        faulthandler wrote it, innermost frame first ("" when it wrote none)."""
        if self._crash_file is None or not self._crash_file.is_file():
            return ""
        written = self._crash_file.read_text(errors="replace").splitlines()
        head = [line for line in written[:2] if line.startswith("Fatal Python error")]
        current = next(
            (i for i, line in enumerate(written) if line.startswith("Current thread")), 0
        )
        stack: list[str] = []
        for line in written[current:]:
            if stack and not line.startswith("  "):
                break  # the end of that thread's stack
            stack.append(line)
        return "\n".join([*head, *stack][:lines])

    def close(self) -> None:
        self._pipe.close()
        if self._crash_file is not None:
            self._crash_file.unlink(missing_ok=True)


@dataclass(frozen=True)
class Limits:
    """When the pool replaces an executor between trials."""

    max_trials: int = 0  # 0: never by count
    max_memory_bytes: int = 0  # 0: never by memory


def replacement_reason(
    limits: Limits, *, trials: int, one_shot: bool, alive: bool, idle: Idle | None, death: str
) -> str:
    """Why an executor that just ended a trial must go ("": it stays)."""
    if idle is not None and idle.retiring:
        return "it ran a one-shot trial" if one_shot else "it retired"
    if not alive:
        return f"it died ({death})"
    if idle is None:
        return "it did not go idle"
    if limits.max_trials and trials >= limits.max_trials:
        return f"it ran {trials} trials"
    if limits.max_memory_bytes and idle.rss_bytes > limits.max_memory_bytes:
        return f"it holds {idle.rss_bytes >> 20} MiB, above {limits.max_memory_bytes >> 20} MiB"
    return ""


class ExecutorPool:
    """The worker's executors: one warm executor per framework and code
    package (installed code has none), started at start-up (``warm``) or by
    the first trial that needs it, replaced when it dies, recycled after
    ``limits``; and one-shot executors for the trials that need a fresh
    process. A new package gets an executor of its own, so no trial imports
    another package's modules; at most ``code_executors`` of them stay warm
    (the least recently used retires first). For the frameworks of
    ``spares``, one spare executor (warm, never used) waits for the next new
    package, which takes it instead of starting one, and a new spare starts
    behind it."""

    def __init__(
        self,
        runners: Mapping[str, str],
        limits: Limits,
        *,
        threads: int = 0,
        cached_datasets: int = 4,
        log_level: str = "INFO",
        log_format: str = "json",
        code_executors: int = 2,
        crash_dir: Path | None = None,
        spares: tuple[str, ...] = (),
    ) -> None:
        self._runners = dict(runners)
        self._limits = limits
        self._options: dict[str, Any] = {
            "threads": threads,
            "cached_datasets": cached_datasets,
            "log_level": log_level,
            "log_format": log_format,
            "crash_dir": crash_dir,
        }
        self._code_executors = code_executors
        # By (framework, package digest), the least recently used first.
        self._warm: OrderedDict[tuple[str, str], Executor] = OrderedDict()
        self._spares = tuple(spares)
        self._spare: dict[str, Executor] = {}
        self.started = 0

    @property
    def frameworks(self) -> tuple[str, ...]:
        return tuple(self._runners)

    def warm(self, frameworks: tuple[str, ...]) -> None:
        """Start the warm executors of ``frameworks`` now (they import and
        warm up while the worker waits for trials)."""
        for framework in frameworks:
            self.executor_for(framework)
        for framework in self._spares:
            self._spare_for(framework)

    def _spare_for(self, framework: str) -> Executor:
        spare = self._spare.get(framework)
        if spare is None or not spare.alive():
            if spare is not None:
                spare.close()
            spare = self._start(framework, one_shot=False, code=None)
            self._spare[framework] = spare
        return spare

    def executor_for(self, framework: str, code: CodeRef | None = None) -> Executor:
        """The warm executor of the framework and code package, started (or
        replaced) if needed."""
        key = _key(framework, code)
        executor = self._warm.get(key)
        if executor is not None and not executor.alive():
            log.warning(
                "executor.died_idle", framework=framework, pid=executor.pid, how=executor.death()
            )
            executor.close()
            del self._warm[key]
            executor = None
        if executor is None:
            executor = self._take_spare(framework, code) if code is not None else None
            if executor is None:
                executor = self._start(framework, one_shot=False, code=code)
            self._warm[key] = executor
            self._retire_unused_code()
        self._warm.move_to_end(key)
        return executor

    def _take_spare(self, framework: str, code: CodeRef) -> Executor | None:
        """The framework's spare, bound to ``code`` (a new spare starts
        behind it); None when it keeps none."""
        spare = self._spare.pop(framework, None)
        if spare is None:
            return None
        if not spare.alive():
            spare.close()
            return None
        spare.bind(code)
        log.info("executor.spare_taken", framework=framework, pid=spare.pid, code=code.sha256[:12])
        self._spare_for(framework)
        return spare

    def _retire_unused_code(self) -> None:
        packaged = [key for key in self._warm if key[1]]
        for key in packaged[: max(0, len(packaged) - self._code_executors)]:
            executor = self._warm[key]
            if executor.busy:
                continue
            log.info("executor.retired", framework=key[0], code=key[1][:12], pid=executor.pid)
            del self._warm[key]
            executor.retire()

    def one_shot(self, framework: str, code: CodeRef | None = None) -> Executor:
        return self._start(framework, one_shot=True, code=code)

    def _start(self, framework: str, *, one_shot: bool, code: CodeRef | None) -> Executor:
        path = self._runners.get(framework)
        if path is None:
            raise TrialError(
                f"unknown framework {framework!r}; known: {', '.join(self._runners)}",
                reason="unknown_framework",
            )
        self.started += 1
        executor = Executor(framework, path, one_shot=one_shot, code=code, **self._options)
        log.info(
            "executor.starting",
            framework=framework,
            pid=executor.pid,
            one_shot=one_shot,
            code=code.sha256[:12] if code is not None else "",
        )
        return executor

    def trial_ended(self, executor: Executor, idle: Idle | None) -> None:
        """After a trial: replace the executor if it died, retires, ran its
        last trial or holds too much memory. The replacement starts at once,
        so it is warm by the next trial."""
        why = replacement_reason(
            self._limits,
            trials=executor.trials,
            one_shot=executor.one_shot,
            alive=executor.alive(),
            idle=idle,
            death=executor.death(),
        )
        if not why:
            return
        log.info(
            "executor.replaced",
            framework=executor.framework,
            pid=executor.pid,
            why=why,
            trials=executor.trials,
        )
        if executor.alive():
            executor.retire()
        else:
            executor.kill()
        key = _key(executor.framework, executor.code)
        if self._warm.get(key) is executor:
            del self._warm[key]
            self.executor_for(executor.framework, executor.code)

    def discard(self, executor: Executor) -> None:
        """Kill ``executor`` (a trial could not be stopped in time)."""
        executor.kill()
        key = _key(executor.framework, executor.code)
        if self._warm.get(key) is executor:
            del self._warm[key]

    def idle_events(self, running: Executor | None) -> list[tuple[Executor, Event]]:
        """Events of the warm and spare executors not running a trial (their Ready)."""
        return [
            (executor, event)
            for executor in [*self._warm.values(), *self._spare.values()]
            if executor is not running
            for event in executor.events(timeout=0)
        ]

    def close(self) -> None:
        for executor in [*self._warm.values(), *self._spare.values()]:
            executor.retire()
        self._warm.clear()
        self._spare.clear()


def _key(framework: str, code: CodeRef | None) -> tuple[str, str]:
    return framework, code.sha256 if code is not None else ""


__all__ = [
    "DataLoaded",
    "Epoch",
    "Event",
    "Executor",
    "ExecutorPool",
    "Failed",
    "Finished",
    "Idle",
    "Job",
    "Limits",
    "NeedsFresh",
    "Ready",
    "Started",
    "replacement_reason",
]
