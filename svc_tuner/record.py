"""What the engine keeps about a trial beside Optuna's own fields, typed.

Both records live in Optuna trial user attributes (set while the trial runs:
Optuna freezes finished trials), one attribute each so that a change is one
journal record. The stored form is a JSON object holding only the fields that
differ from their defaults, as every earlier version wrote it: a record
written by any version loads, and one written by this version reads the same
in optuna-dashboard.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.errors import NotFound

RUN_ATTR = "aistack:run"
RESULT_ATTR = "aistack:result"

#: How a failed trial ended, when not by a report: quarantined (out of
#: attempts, or at fault), or skipped (never sent: not a trial of the study).
RunOutcome = Literal["", "quarantined", "skipped"]
QUARANTINED: RunOutcome = "quarantined"
SKIPPED: RunOutcome = "skipped"


def trial_id(study_id: str, number: int) -> str:
    return f"{study_id}/{number}"


def parse_trial_id(value: str) -> tuple[str, int]:
    study_id, _, number = value.rpartition("/")
    if not study_id or not number.isdigit():
        raise NotFound(f"no trial {value!r}: trial ids are <study>/<number>")
    return study_id, int(number)


@dataclass(frozen=True)
class Run:
    """A trial's run: ``attempt`` (the current one), ``published`` (the attempt
    last published on the bus), ``seen`` (epoch seconds of the last report or
    request; None: never, so never lost), ``running`` (a trainer has
    reported), ``trainer``, ``errors`` (one per failed or lost attempt),
    ``outcome``, ``refit`` (a refit of the study's best parameters) and
    ``traceback`` (the last failure's, as its trainer quoted it)."""

    attempt: int = 1
    published: int | None = None
    seen: float | None = None
    running: bool = False
    trainer: str = ""
    errors: tuple[str, ...] = ()
    outcome: RunOutcome = ""
    refit: bool = False
    # The last lines of the last failure's traceback.
    traceback: str = ""

    @classmethod
    def of(cls, trial: FrozenTrial) -> Run:
        return cls.load(trial.user_attrs.get(RUN_ATTR, {}))

    @classmethod
    def load(cls, stored: Mapping[str, Any]) -> Run:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in stored.items() if k in known}
        if "errors" in values:
            values["errors"] = tuple(values["errors"])
        return cls(**values)

    def dump(self) -> dict[str, Any]:
        return _non_default(self)

    def but(self, **changes: Any) -> Run:
        return replace(self, **changes)

    @property
    def unsent(self) -> bool:
        """The current attempt was not marked published."""
        return self.published != self.attempt


@dataclass(frozen=True)
class Result:
    """A completed trial's result as its trainer reported it."""

    metrics: Mapping[str, float]
    model_name: str = ""
    model_version: str = ""
    trainer: str = ""

    @classmethod
    def of(cls, trial: FrozenTrial) -> Result:
        stored = trial.user_attrs.get(RESULT_ATTR, {})
        return cls(
            metrics=dict(stored.get("metrics", {})),
            model_name=stored.get("model_name", ""),
            model_version=stored.get("model_version", ""),
            trainer=stored.get("trainer", ""),
        )

    def dump(self) -> dict[str, Any]:
        # Every field, as the first version wrote it.
        return {
            "metrics": dict(self.metrics),
            "model_name": self.model_name,
            "model_version": self.model_version,
            "trainer": self.trainer,
        }


@dataclass(frozen=True)
class TrialDetails:
    """A trial's records as the tuner's API shows them."""

    attempts: int
    errors: list[str]
    trainer_id: str
    metrics: dict[str, float]
    model_name: str
    model_version: str
    traceback: str


def details(trial: FrozenTrial) -> TrialDetails:
    run, result = Run.of(trial), Result.of(trial)
    return TrialDetails(
        attempts=run.attempt,
        errors=list(run.errors),
        trainer_id=result.trainer or run.trainer,
        metrics=dict(result.metrics),
        model_name=result.model_name,
        model_version=result.model_version,
        traceback=run.traceback,
    )


def trial_state(trial: FrozenTrial) -> int:
    """The trial's ``aistack.v1.TrialState``, from Optuna's state and the run."""
    if trial.state == OptunaState.RUNNING:
        running = Run.of(trial).running
        return api.TRIAL_STATE_RUNNING if running else api.TRIAL_STATE_REQUESTED
    if trial.state == OptunaState.FAIL and Run.of(trial).outcome == QUARANTINED:
        return api.TRIAL_STATE_QUARANTINED
    return _STATES.get(trial.state, api.TRIAL_STATE_UNSPECIFIED)


_STATES = {
    OptunaState.COMPLETE: api.TRIAL_STATE_COMPLETED,
    OptunaState.PRUNED: api.TRIAL_STATE_PRUNED,
    OptunaState.FAIL: api.TRIAL_STATE_FAILED,
}


def is_refit(trial: FrozenTrial) -> bool:
    return Run.of(trial).refit


def is_skipped(trial: FrozenTrial) -> bool:
    return Run.of(trial).outcome == SKIPPED


def _non_default(record: Run) -> dict[str, Any]:
    stored: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if value != f.default:
            stored[f.name] = list(value) if isinstance(value, tuple) else value
    return stored
