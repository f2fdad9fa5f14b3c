"""What a warm executor and the worker say to each other over their pipe:
the worker sends ``Job``s (and ``None`` to retire it), the executor answers
with ``Event``s."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from svc_trainer.plan import DataLoaded, DataRequest, RunResult, RunSpec, TrialError


@dataclass(frozen=True)
class Ready:
    """The executor imported its runner and warmed up; it takes trials now."""

    pid: int
    warm_seconds: float


@dataclass(frozen=True)
class Started:
    resumed_from_step: int
    note: str = ""
    # Which process runs the trial, and how many trials it ran before (0:
    # this is its first): the proof that executors are reused.
    pid: int = 0
    trials_before: int = 0
    data_cached: bool = False


@dataclass(frozen=True)
class Epoch:
    step: int
    metrics: Mapping[str, float]


@dataclass(frozen=True)
class Finished:
    result: RunResult


@dataclass(frozen=True)
class Failed:
    reason: str
    message: str
    # False when the configuration is at fault (the tuner quarantines it).
    retryable: bool
    # The last lines of the traceback that explains it.
    traceback: str = ""
    # The study's code, data or settings are at fault: the tuner ends the study.
    fatal_to_study: bool = False

    @classmethod
    def of(cls, error: TrialError) -> Failed:
        return cls(
            error.reason,
            str(error),
            error.retryable,
            traceback=error.traceback,
            fatal_to_study=error.fatal_to_study,
        )


@dataclass(frozen=True)
class NeedsFresh:
    """The trial needs a process whose framework runtime never ran: the warm
    executor did not start it and exits; run it in a one-shot executor."""


@dataclass(frozen=True)
class Idle:
    """The trial ended (its Finished or Failed came first) and its state was
    released; ``retiring``: the executor exits now."""

    rss_bytes: int
    retiring: bool


@dataclass(frozen=True)
class UseCode:
    """Sent to a spare executor (before its first job) that a code package
    takes: its trials import from ``directory``."""

    directory: str


Event = Ready | Started | Epoch | DataLoaded | Finished | Failed | NeedsFresh | Idle


@dataclass(frozen=True)
class Job:
    spec: RunSpec
    data: DataRequest
