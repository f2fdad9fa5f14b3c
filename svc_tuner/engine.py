"""The tuning engine: Optuna's ask-and-tell on a shared storage, made safe to
crash and to repeat.

Everything the tuner knows lives in Optuna's storage (studies, trials,
parameters, intermediate values) plus a few attributes of ours: the spec and
the study's state here, each trial's run and result in ``svc_tuner.record``.
A new ``Engine`` on the same storage (the journal in Redis,
``svc_tuner.storage``) carries on where a killed one stopped. Every method is
idempotent: a report applied twice, or an ``ask`` repeated after a crash,
changes nothing more.

The engine does not touch Kafka: it returns what to publish (``Outcome``) and
records that it was published (``mark_published``), so a tuner killed between
the two publishes again on restart rather than losing a request.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from google.protobuf.duration_pb2 import Duration
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from shared import objective, search_space
from shared.contracts.aistack.v1 import monitoring_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.errors import AlreadyExists, FailedPrecondition, NotFound
from shared.log import get_logger
from shared.settings import ServingPolicy
from svc_tuner import replay as replays
from svc_tuner import retune as retunes
from svc_tuner import spec as specs
from svc_tuner.record import (
    QUARANTINED,
    RESULT_ATTR,
    RUN_ATTR,
    SKIPPED,
    Result,
    Run,
    RunOutcome,
    is_refit,
    is_skipped,
    parse_trial_id,
    trial_id,
    trial_state,
)

# Study attributes.
_SPEC = "aistack:spec"
_STOPPED = "aistack:stopped"
_FAILED = "aistack:failed"
_CREATED = "aistack:created"
_QUARANTINED = "aistack:quarantined"
_ANNOUNCED = "aistack:announced"

log = get_logger("svc_tuner")

DEFAULT_TRIAL_TIMEOUT_SECONDS = 600.0
HEARTBEAT_FRACTION = 4  # trainers beat four times per timeout
_ASKED = (OptunaState.RUNNING, OptunaState.COMPLETE, OptunaState.PRUNED, OptunaState.FAIL)


@dataclass
class Outcome:
    """What a call decided: trial requests and control messages to publish,
    and the trials that changed (for watchers)."""

    requests: list[tuning_pb2.TrialRequested] = field(default_factory=list)
    controls: list[tuning_pb2.TrialControl] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    def extend(self, other: Outcome) -> None:
        self.requests += other.requests
        self.controls += other.controls
        self.changed += other.changed


@dataclass(frozen=True)
class RetuneDecision:
    """What a drift event started: ``study_id``, the new re-tune (empty: none),
    and ``why`` (``started``, or why not: ``unknown_study``, ``not_opted_in``,
    ``repeat``, ``retune_running``); ``other`` the re-tune already running."""

    why: str
    study_id: str = ""
    other: str = ""


class Engine:
    def __init__(
        self, storage: BaseStorage, *, clock: Any = time.time, policy: ServingPolicy = "champion"
    ) -> None:
        self._storage = storage
        self._clock = clock
        # The model server's AISTACK_MODEL_POLICY: what a re-tune's winner does.
        self._policy = policy
        self._studies: dict[str, optuna.Study] = {}
        self._specs: dict[str, tuning_pb2.StudySpec] = {}

    # ---- studies ----

    def create_study(
        self,
        spec: tuning_pb2.StudySpec,
        *,
        first: Sequence[Mapping[str, Any]] = (),
        attrs: Mapping[str, Any] | None = None,
    ) -> tuple[str, bool]:
        """The study's id and whether it is new; the same name with the same
        spec is the same study, with another spec it is AlreadyExists. A new
        study asks the parameter sets ``first`` before any it samples, and
        carries the user attributes ``attrs``."""
        specs.validate(spec)
        encoded = base64.b64encode(spec.SerializeToString(deterministic=True)).decode()
        try:
            existing = self._storage.get_study_id_from_name(spec.name)
        except KeyError:
            existing = None
        if existing is not None:
            stored = self._storage.get_study_user_attrs(existing).get(_SPEC)
            if stored is None:
                # Cut short by a crash before its spec: never used, made anew.
                optuna.delete_study(study_name=spec.name, storage=self._storage)
            elif stored != encoded:
                raise AlreadyExists(f"study {spec.name!r} exists with another spec")
            else:
                return spec.name, False
        study = optuna.create_study(
            storage=self._storage,
            study_name=spec.name,
            direction=search_space.direction(spec),
            sampler=specs.seeded_sampler(spec),
            pruner=specs.pruner(spec),
        )
        study.set_user_attr(_CREATED, self._clock())
        for name, value in (attrs or {}).items():
            study.set_user_attr(name, value)
        for params in first:
            study.enqueue_trial(dict(params), skip_if_exists=False)
        # Written last: a study without its spec is one a crash cut short.
        study.set_user_attr(_SPEC, encoded)
        self._specs[spec.name] = tuning_pb2.StudySpec.FromString(base64.b64decode(encoded))
        self._studies[spec.name] = study
        return spec.name, True

    def study_ids(self) -> list[str]:
        return [s.study_name for s in self._storage.get_all_studies()]

    def spec(self, study_id: str) -> tuning_pb2.StudySpec:
        """A copy of the study's spec (callers may change it)."""
        copy = tuning_pb2.StudySpec()
        copy.CopyFrom(self._spec(study_id))
        return copy

    def _spec(self, study_id: str) -> tuning_pb2.StudySpec:
        # A spec never changes once stored: parsed once per study, not per call.
        self._study(study_id)
        return self._specs[study_id]

    def stop(self, study_id: str) -> Outcome:
        """No new trials; trials in flight are told to stop and recorded as failed."""
        study = self._study(study_id)
        study.set_user_attr(_STOPPED, True)
        outcome = Outcome()
        for trial in self._in_flight(study):
            outcome.controls.append(
                self._control(study_id, trial, tuning_pb2.CONTROL_ACTION_STOP, "study stopped")
            )
            self._finish(study, trial, OptunaState.FAIL, errors=["study stopped"])
            outcome.changed.append(trial_id(study_id, trial.number))
        return outcome

    def replay(self, study_id: str) -> api.ReplayStudyResponse:
        """The study's proposals again, from its log (``svc_tuner.replay``).
        Raises NotFound, and FailedPrecondition for a study still running."""
        spec = self._spec(study_id)
        if self.state(study_id) == api.STUDY_STATE_RUNNING:
            raise FailedPrecondition(f"study {study_id!r} is running: replay a finished study")
        return replays.replay(spec, self._study(study_id).get_trials(deepcopy=False))

    # ---- re-tunes ----

    def retune(self, drift: monitoring_pb2.DriftDetected) -> RetuneDecision:
        """Start the follow-up study ``drift`` calls for (``svc_tuner.retune``),
        when the study it names opted in, the drift id is new to that study's
        loop, and no re-tune of the model is running. Idempotent: a drift id
        is decided once, and a repeat after a crash finds the study it
        started. Raises SpecError when the follow-up's name is too long."""
        try:
            spec = self._spec(drift.study_id)
        except NotFound:
            return RetuneDecision("unknown_study")
        if not spec.retune.on_drift:
            return RetuneDecision("not_opted_in")
        origin = retunes.Origin.load(
            self._study(drift.study_id).user_attrs.get(retunes.ORIGIN_ATTR)
        )
        root_id = origin.root_study if origin is not None else drift.study_id
        try:
            root = self._study(root_id)
        except NotFound:
            root_id, root = drift.study_id, self._study(drift.study_id)
        decided = list(root.user_attrs.get(retunes.DRIFTS_ATTR, []))
        if drift.drift_id in decided:
            return RetuneDecision("repeat")
        for running_id, running in self._running_retunes(drift.model_name):
            if running.drift_id == drift.drift_id:
                # Started by this drift before a crash cut the records short.
                self._record_retune(root, drift.drift_id, running_id)
                return RetuneDecision("repeat", other=running_id)
            self._record_retune(root, drift.drift_id)
            return RetuneDecision("retune_running", other=running_id)
        started = list(root.user_attrs.get(retunes.RETUNES_ATTR, []))
        count = len(started) + 1
        while self._exists(f"{root_id}-retune-{count}"):
            count += 1  # recorded nowhere: a crash came between the two
        follow = retunes.follow_up_spec(
            spec,
            drift,
            f"{root_id}-retune-{count}",
            count,
            version_offset=self._versions_used(root_id, started),
        )
        warm = retunes.best_params(
            self._study(drift.study_id).get_trials(deepcopy=False),
            spec.objective.direction,
            retunes.warm_trials(spec),
        )
        new = retunes.Origin(
            drift_id=drift.drift_id,
            previous_study=drift.study_id,
            root_study=root_id,
            model_name=drift.model_name,
            serving_version=drift.serving.version or drift.model_version,
        )
        study_id, _ = self.create_study(follow, first=warm, attrs={retunes.ORIGIN_ATTR: new.dump()})
        self._record_retune(root, drift.drift_id, study_id)
        return RetuneDecision("started", study_id=study_id)

    def _versions_used(self, root_id: str, retunes_started: Sequence[str]) -> int:
        """The model versions the loop's studies took: each took its offset
        plus one per trial number it asked (none is running: one re-tune at
        a time)."""
        used = 0
        for study_id in (root_id, *retunes_started):
            if not self._exists(study_id):
                continue
            offset = int(self._spec(study_id).task.options.get(objective.VERSION_OFFSET, "0") or 0)
            numbers = [t.number for t in self._study(study_id).get_trials(deepcopy=False)]
            used = max(used, offset + max(numbers, default=-1) + 1)
        return used

    def _exists(self, study_id: str) -> bool:
        try:
            self._spec(study_id)
        except NotFound:
            return False
        return True

    def _running_retunes(self, model_name: str) -> list[tuple[str, retunes.Origin]]:
        running = []
        for frozen in self._storage.get_all_studies():
            origin = retunes.Origin.load(frozen.user_attrs.get(retunes.ORIGIN_ATTR))
            if origin is None or origin.model_name != model_name:
                continue
            try:
                if self.state(frozen.study_name) == api.STUDY_STATE_RUNNING:
                    running.append((frozen.study_name, origin))
            except NotFound:
                continue  # cut short by a crash before its spec
        return running

    def _record_retune(self, root: optuna.Study, drift_id: str, study_id: str = "") -> None:
        decided = list(root.user_attrs.get(retunes.DRIFTS_ATTR, []))
        if drift_id not in decided:
            decided.append(drift_id)
            root.set_user_attr(retunes.DRIFTS_ATTR, decided[-retunes.DRIFTS_KEPT :])
        started = list(root.user_attrs.get(retunes.RETUNES_ATTR, []))
        if study_id and study_id not in started:
            root.set_user_attr(retunes.RETUNES_ATTR, [*started, study_id])

    def state(self, study_id: str) -> int:
        study = self._study(study_id)
        if study.user_attrs.get(_FAILED):
            return api.STUDY_STATE_FAILED
        if study.user_attrs.get(_STOPPED):
            return api.STUDY_STATE_STOPPED
        spec = self._spec(study_id)
        if self._in_flight(study) or self._budget_left(study, spec) > 0:
            return api.STUDY_STATE_RUNNING
        if spec.refit and self._refit_due(study):
            return api.STUDY_STATE_RUNNING
        return api.STUDY_STATE_COMPLETED

    # ---- trials out ----

    def unsent(self, study_id: str) -> Outcome:
        """Requests recorded but not marked published: a tuner stopped between
        the two, or a publish that failed. Sending them again is safe (trainers
        take a trial id and attempt once)."""
        spec = self._spec(study_id)
        study = self._study(study_id)
        outcome = Outcome()
        for trial in self._in_flight(study):
            if RUN_ATTR not in trial.user_attrs:
                # Asked by a tuner that stopped before recording it: its
                # parameters may be partial. Dropped, not counted; ask() refills.
                self._store_run(trial, Run(outcome=SKIPPED))
                study.tell(trial.number, state=OptunaState.FAIL)
                continue
            if Run.of(trial).unsent:
                outcome.requests.append(self._request(spec, trial))
        return outcome

    def ask(self, study_id: str) -> Outcome:
        """Fill the study up to ``max_parallel`` trials in flight, within its budget."""
        spec = self._spec(study_id)
        study = self._study(study_id)
        outcome = Outcome()
        in_flight = self._in_flight(study)
        if study.user_attrs.get(_STOPPED) or study.user_attrs.get(_FAILED):
            return outcome
        quarantined = study.user_attrs.get(_QUARANTINED, [])
        budget_left = self._budget_left(study, spec)
        if spec.refit and not in_flight and budget_left == 0 and self._refit_due(study):
            return self._ask_refit(spec, study)
        room = min(spec.budget.max_parallel - len(in_flight), budget_left)
        skipped = 0
        while room > 0 and skipped < 100:
            asked = study.ask(search_space.distributions(spec))
            if _key(asked.params) in quarantined:
                # Kept out of the rest of the study, and not counted against it.
                asked.set_user_attr(RUN_ATTR, Run(outcome=SKIPPED).dump())
                study.tell(asked, state=OptunaState.FAIL)
                skipped += 1
                continue
            asked.set_user_attr(RUN_ATTR, Run(seen=self._clock()).dump())
            frozen = self._storage.get_trial(asked._trial_id)
            outcome.requests.append(self._request(spec, frozen))
            outcome.changed.append(trial_id(study_id, asked.number))
            room -= 1
        return outcome

    def mark_published(self, request: tuning_pb2.TrialRequested) -> None:
        study_id, number = parse_trial_id(request.trial_id)
        trial = self._trial(study_id, number)
        if not trial.state.is_finished():
            self._store_run(trial, Run.of(trial).but(published=request.attempt))

    # ---- reports in ----

    def apply(self, report: tuning_pb2.TrialReport) -> Outcome:
        """Apply one report. Repeats, reports of an earlier attempt (except a
        result) and reports on finished trials change nothing."""
        study_id, number = parse_trial_id(report.trial_id)
        if study_id != report.study_id:
            raise NotFound(f"trial {report.trial_id!r} is not in study {report.study_id!r}")
        study = self._study(study_id)
        trial = self._trial(study_id, number)
        outcome = Outcome()
        if trial.state.is_finished():
            return outcome
        event = report.WhichOneof("event")
        run = Run.of(trial)
        if report.attempt < run.attempt and event != "completed":
            return outcome
        tid = trial._trial_id
        trainer = report.trainer_id or run.trainer
        if event not in ("completed", "pruned"):  # those end the trial: no need
            self._store_run(trial, run.but(seen=self._clock(), running=True, trainer=trainer))
        outcome.changed.append(report.trial_id)
        if event == "progress":
            step, value = report.progress.step, report.progress.value
            if step not in trial.intermediate_values:
                self._storage.set_trial_intermediate_value(tid, step, value)
            frozen = self._storage.get_trial(tid)
            # A refit trains on the validation data it reports: never judged by it.
            if not is_refit(frozen) and study.pruner.prune(study, frozen):
                outcome.controls.append(
                    self._control(study_id, frozen, tuning_pb2.CONTROL_ACTION_PRUNE, "pruned", step)
                )
                self._finish(study, frozen, OptunaState.PRUNED)
        elif event == "completed":
            done = report.completed
            result = Result(dict(done.metrics), done.model_name, done.model_version, trainer)
            self._storage.set_trial_user_attr(tid, RESULT_ATTR, result.dump())
            self._finish(study, trial, OptunaState.COMPLETE, value=done.value)
        elif event == "pruned":
            self._finish(study, trial, OptunaState.PRUNED)
        elif event == "failed":
            failure = report.failed
            error = f"attempt {report.attempt}: {failure.reason}: {failure.message}"
            trial = self._storage.get_trial(tid)
            if failure.traceback:
                self._store_run(trial, Run.of(trial).but(traceback=failure.traceback))
                trial = self._storage.get_trial(tid)
            if failure.fatal_to_study:
                outcome.extend(self._fail_study(study_id, trial, error))
            else:
                outcome.extend(self._retry_or_quarantine(study_id, trial, error, failure.retryable))
        return outcome

    def find_lost(self, study_id: str) -> Outcome:
        """Trials with no report within the trial timeout: requested again (same
        parameters, next attempt) or, out of attempts, quarantined."""
        spec = self._spec(study_id)
        timeout = _seconds(spec.budget.trial_timeout) or DEFAULT_TRIAL_TIMEOUT_SECONDS
        now = self._clock()
        outcome = Outcome()
        for trial in self._in_flight(self._study(study_id)):
            run = Run.of(trial)
            if run.seen is not None and now - run.seen > timeout:
                error = f"attempt {run.attempt}: no report for {timeout:g} s"
                outcome.extend(self._retry_or_quarantine(study_id, trial, error, retryable=True))
        return outcome

    # ---- results ----

    def unannounced_result(self, study_id: str) -> tuning_pb2.StudyResult | None:
        """The study's result once it has ended, until ``mark_announced``."""
        study = self._study(study_id)
        if study.user_attrs.get(_ANNOUNCED) or self.state(study_id) == api.STUDY_STATE_RUNNING:
            return None
        spec = self._spec(study_id)
        result = tuning_pb2.StudyResult(
            study_id=study_id,
            objective=spec.objective,
            stopped=bool(study.user_attrs.get(_STOPPED)),
            trial_counts=self.counts(study_id),
            error=self.error(study_id),
        )
        result.end_time.FromSeconds(int(self._clock()))
        best = self.best(study_id)
        if best is not None:
            model = Result.of(best)
            result.best_trial_id = trial_id(study_id, best.number)
            result.best_value = float(best.value or 0.0)
            result.best_model_name = model.model_name
            result.best_model_version = model.model_version
            for name, value in best.params.items():
                result.best_params[name].CopyFrom(search_space.param_value(value))
        for trial in self.trials(study_id):
            if is_refit(trial) and trial.state == OptunaState.COMPLETE:
                model = Result.of(trial)
                result.refit_model_name = model.model_name
                result.refit_model_version = model.model_version
        origin = retunes.Origin.load(study.user_attrs.get(retunes.ORIGIN_ATTR))
        if origin is not None:
            result.retune.CopyFrom(retunes.outcome(origin, spec, best, self._policy))
        return result

    def mark_announced(self, study_id: str) -> None:
        self._study(study_id).set_user_attr(_ANNOUNCED, True)

    # ---- views ----

    def error(self, study_id: str) -> str:
        """Why the study failed ("" unless it did)."""
        return str(self._study(study_id).user_attrs.get(_FAILED, ""))

    def created(self, study_id: str) -> float:
        return float(self._study(study_id).user_attrs.get(_CREATED, 0.0))

    def trial(self, study_id: str, number: int) -> FrozenTrial:
        return self._trial(study_id, number)

    def trials(self, study_id: str) -> list[FrozenTrial]:
        """The study's trials; not those skipped, nor those enqueued and not
        yet asked (a warm start's next ones: no trial yet)."""
        trials = self._study(study_id).get_trials(deepcopy=False, states=_ASKED)
        return [t for t in trials if not is_skipped(t)]

    def best(self, study_id: str) -> FrozenTrial | None:
        """The best completed trial by ``shared.objective``'s rule, the one the
        model server's champion follows (so a refit is never it)."""
        direction = self._spec(study_id).objective.direction

        def standing(trial: FrozenTrial) -> objective.Standing:
            refit = is_refit(trial)
            return objective.Standing.of(trial.value, direction, trial.number, refit=refit)

        complete = [t for t in self.trials(study_id) if t.state == OptunaState.COMPLETE]
        return objective.best(complete, standing)

    def counts(self, study_id: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for trial in self.trials(study_id):
            name = api.TrialState.Name(trial_state(trial)).removeprefix("TRIAL_STATE_")
            counts[name.lower()] = counts.get(name.lower(), 0) + 1
        return counts

    # ---- inside ----

    def _study(self, study_id: str) -> optuna.Study:
        study = self._studies.get(study_id)
        if study is not None:
            return study
        try:
            self._storage.get_study_id_from_name(study_id)
        except KeyError:
            raise NotFound(f"no study {study_id!r}") from None
        study = optuna.load_study(storage=self._storage, study_name=study_id)
        encoded = study.user_attrs.get(_SPEC)
        if encoded is None:
            raise NotFound(f"no study {study_id!r}")
        spec = tuning_pb2.StudySpec.FromString(base64.b64decode(encoded))
        study.sampler = specs.seeded_sampler(spec)
        study.pruner = specs.pruner(spec)
        self._specs[study_id] = spec
        self._studies[study_id] = study
        return study

    def _trial(self, study_id: str, number: int) -> FrozenTrial:
        study = self._study(study_id)
        try:
            tid = self._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
        except KeyError:
            raise NotFound(f"no trial {trial_id(study_id, number)!r}") from None
        return self._storage.get_trial(tid)

    def _in_flight(self, study: optuna.Study) -> list[FrozenTrial]:
        return study.get_trials(deepcopy=False, states=(OptunaState.RUNNING,))

    def _budget_left(self, study: optuna.Study, spec: tuning_pb2.StudySpec) -> int:
        limit = _seconds(spec.budget.time_limit)
        if limit and self._clock() - study.user_attrs.get(_CREATED, 0) > limit:
            return 0
        # Trials asked; those enqueued but not yet asked are within the budget.
        trials = study.get_trials(deepcopy=False, states=_ASKED)
        counted = [t for t in trials if not is_skipped(t) and not is_refit(t)]
        return max(0, spec.budget.max_trials - len(counted))

    def _refit_due(self, study: optuna.Study) -> bool:
        """No refit yet, and a completed trial whose parameters it would train."""
        trials = study.get_trials(deepcopy=False)
        if any(is_refit(t) for t in trials):
            return False
        return any(t.state == OptunaState.COMPLETE for t in trials)

    def _ask_refit(self, spec: tuning_pb2.StudySpec, study: optuna.Study) -> Outcome:
        best = self.best(spec.name)
        assert best is not None  # _refit_due saw a completed trial
        study.enqueue_trial(best.params, skip_if_exists=False)
        asked = study.ask(search_space.distributions(spec))
        asked.set_user_attr(RUN_ATTR, Run(seen=self._clock(), refit=True).dump())
        log.info("study.refit", study=spec.name, trial=asked.number, best_trial=best.number)
        frozen = self._storage.get_trial(asked._trial_id)
        return Outcome(
            requests=[self._request(spec, frozen)],
            changed=[trial_id(spec.name, asked.number)],
        )

    def _fail_study(self, study_id: str, trial: FrozenTrial, error: str) -> Outcome:
        """A trial found the study's code, data or settings at fault: every
        trial would fail alike, so none is asked again. The trial fails with
        its error (not quarantined: its parameters are not to blame), the
        trials in flight are told to stop, and the study fails, saying why."""
        study = self._study(study_id)
        study.set_user_attr(_FAILED, f"trial {trial.number}: {error}")
        log.warning("study.failed", study=study_id, trial=trial.number, error=error)
        outcome = Outcome(changed=[trial_id(study_id, trial.number)])
        self._finish(study, trial, OptunaState.FAIL, errors=[error])
        for other in self._in_flight(study):
            outcome.controls.append(
                self._control(study_id, other, tuning_pb2.CONTROL_ACTION_STOP, "study failed")
            )
            self._finish(study, other, OptunaState.FAIL, errors=["the study failed"])
            outcome.changed.append(trial_id(study_id, other.number))
        return outcome

    def _retry_or_quarantine(
        self, study_id: str, trial: FrozenTrial, error: str, retryable: bool
    ) -> Outcome:
        spec = self._spec(study_id)
        study = self._study(study_id)
        outcome = Outcome(changed=[trial_id(study_id, trial.number)])
        run = Run.of(trial)
        if retryable and run.attempt < specs.max_attempts(spec):
            retry = run.but(
                errors=(*run.errors, error),
                attempt=run.attempt + 1,
                seen=self._clock(),
                running=False,
            )
            self._store_run(trial, retry)
            outcome.requests.append(self._request(spec, self._storage.get_trial(trial._trial_id)))
            return outcome
        quarantined = [*study.user_attrs.get(_QUARANTINED, []), _key(trial.params)]
        study.set_user_attr(_QUARANTINED, quarantined)
        self._finish(study, trial, OptunaState.FAIL, errors=[error], outcome=QUARANTINED)
        return outcome

    def _finish(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: OptunaState,
        *,
        value: float | None = None,
        errors: Iterable[str] = (),
        outcome: RunOutcome = "",
    ) -> None:
        if errors or outcome:
            run = Run.of(self._storage.get_trial(trial._trial_id))
            ended = run.but(errors=(*run.errors, *errors), outcome=outcome or run.outcome)
            self._store_run(trial, ended)
        # A pruned trial's value is its last intermediate one: Optuna fills it in.
        study.tell(trial.number, value if state == OptunaState.COMPLETE else None, state=state)

    def _store_run(self, trial: FrozenTrial, run: Run) -> None:
        # The whole record in one attribute: one journal record per change.
        self._storage.set_trial_user_attr(trial._trial_id, RUN_ATTR, run.dump())

    def _request(self, spec: tuning_pb2.StudySpec, trial: FrozenTrial) -> tuning_pb2.TrialRequested:
        timeout = _seconds(spec.budget.trial_timeout) or DEFAULT_TRIAL_TIMEOUT_SECONDS
        request = tuning_pb2.TrialRequested(
            trial_id=trial_id(spec.name, trial.number),
            study_id=spec.name,
            trial_number=trial.number,
            task=spec.task,
            objective=spec.objective,
            attempt=Run.of(trial).attempt,
            heartbeat_interval=Duration(seconds=max(1, int(timeout / HEARTBEAT_FRACTION))),
        )
        for name, value in trial.params.items():
            request.params[name].CopyFrom(search_space.param_value(value))
        request.requested_time.FromSeconds(int(self._clock()))
        if spec.HasField("seed"):
            request.seed = spec.seed + trial.number
        if is_refit(trial):
            request.task.options[objective.REFIT] = "true"
        return request

    def _control(
        self, study_id: str, trial: FrozenTrial, action: int, reason: str, step: int = 0
    ) -> tuning_pb2.TrialControl:
        return tuning_pb2.TrialControl(
            trial_id=trial_id(study_id, trial.number),
            study_id=study_id,
            action=action,  # type: ignore[arg-type]
            reason=reason,
            step=step,
        )


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def _seconds(duration: Duration) -> float:
    return duration.ToNanoseconds() / 1e9
