"""One trial's training in a process of its own.

The worker keeps its consumer-group membership, heartbeats and control
messages going while a trial trains for as long as it takes; a framework
crash, a leak or a hung collective stays in the trial's process, which the
worker can always kill. The process is started with ``spawn`` (no inherited
Kafka clients or threads) and is not a daemon, so it may start the ranks or
workers of a multi-process strategy itself.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.log import configure_logging, get_logger
from svc_trainer.lifetime import die_with_parent
from svc_trainer.plan import RunResult, RunSpec, StopReason, TrialError


@dataclass(frozen=True)
class DataRequest:
    """What the trial process loads (``svc_trainer.data.load``)."""

    dataset: str
    options: Mapping[str, str] = field(default_factory=dict)
    features_path: str = ""
    seed: int = 0


@dataclass(frozen=True)
class Started:
    resumed_from_step: int
    note: str = ""


@dataclass(frozen=True)
class Epoch:
    step: int
    metrics: Mapping[str, float]


@dataclass(frozen=True)
class DataLoaded:
    name: str
    version: str
    source: str
    offsets: tuple[tuple[str, int, int], ...]
    feature: str = ""


@dataclass(frozen=True)
class Finished:
    result: RunResult


@dataclass(frozen=True)
class Failed:
    reason: str
    message: str
    # False when the configuration is at fault (the tuner quarantines it).
    retryable: bool


Event = Started | Epoch | DataLoaded | Finished | Failed


class TrialProcess:
    """Start, watch, stop and reap one trial's process."""

    def __init__(
        self, spec: RunSpec, data: DataRequest, *, log_level: str = "INFO", log_format: str = "json"
    ) -> None:
        context = mp.get_context("spawn")
        self._events: mp.Queue[Event] = context.Queue()
        self._stop = context.Value("i", int(StopReason.NONE))
        self._process = context.Process(
            target=_main,
            args=(spec, data, self._events, self._stop, log_level, log_format),
            name=f"trial-{spec.trial_id}",
            daemon=False,
        )

    def start(self) -> TrialProcess:
        self._process.start()
        return self

    def request_stop(self, reason: StopReason) -> None:
        """Ask the run to stop at its next check. A shutdown wins over a
        prune (the trial is handed back rather than reported)."""
        with self._stop.get_lock():
            if reason is StopReason.SHUTDOWN or self._stop.value == StopReason.NONE:
                self._stop.value = int(reason)

    @property
    def stop_reason(self) -> StopReason:
        return StopReason(self._stop.value)

    def events(self, timeout: float) -> list[Event]:
        """What the run said since the last call, waiting up to ``timeout``
        for the first event."""
        out: list[Event] = []
        try:
            out.append(self._events.get(timeout=timeout))
            while True:
                out.append(self._events.get_nowait())
        except queue.Empty:
            return out

    def alive(self) -> bool:
        return self._process.is_alive()

    @property
    def exitcode(self) -> int | None:
        return self._process.exitcode

    def join(self, timeout: float) -> None:
        self._process.join(timeout)

    def kill(self) -> None:
        """Kill the process and its ranks or workers (they see their parent
        go and their collectives fail; the strategies reap them)."""
        if self._process.is_alive():
            self._process.kill()
        self._process.join(timeout=30)

    def close(self) -> None:
        self._events.close()


class _QueueChannel:
    def __init__(self, events: mp.Queue[Event], stop: Any) -> None:
        self._events, self._stop = events, stop

    def started(self, resumed_from_step: int, note: str = "") -> None:
        self._events.put(Started(resumed_from_step, note))

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        self._events.put(Epoch(step, dict(metrics)))

    def stop_requested(self) -> StopReason:
        return StopReason(self._stop.value)


def _main(
    spec: RunSpec,
    request: DataRequest,
    events: mp.Queue[Event],
    stop: Any,
    log_level: str,
    log_format: str,
) -> None:
    die_with_parent()
    configure_logging("svc_trainer", log_level, log_format)
    log = get_logger("svc_trainer")
    try:
        from svc_trainer import data as datasets

        loaded = datasets.load(
            request.dataset, request.options, seed=request.seed, features_path=request.features_path
        )
        events.put(
            DataLoaded(loaded.name, loaded.version, loaded.source, loaded.offsets, loaded.feature)
        )
        result = _runner(spec.framework)(spec, loaded, _QueueChannel(events, stop))
        events.put(Finished(result))
    except TrialError as exc:
        events.put(Failed(exc.reason, str(exc), retryable=False))
    except Exception as exc:  # the machine's fault, not the trial's: may be retried
        log.error("trial.crashed", trial_id=spec.trial_id, error=traceback.format_exc())
        events.put(Failed("training_error", f"{type(exc).__name__}: {exc}", retryable=True))
    finally:
        events.close()
        events.join_thread()
        # Everything is said; skip the interpreter's teardown, where a
        # framework's threads (gloo, TensorFlow) now and then abort the process.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _runner(framework: str) -> Any:
    if framework == "torch":
        from svc_trainer import torch_runner

        return torch_runner.run
    if framework == "tensorflow":
        from svc_trainer import tf_runner

        return tf_runner.run
    raise TrialError(
        f"unknown framework {framework!r}; known: torch, tensorflow", reason="unknown_framework"
    )
