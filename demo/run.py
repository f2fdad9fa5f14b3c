"""``aistack demo`` (``make demo``): the whole stack, end to end, in one command.

Starts the local stack (Kafka, Redis, every service as its own process),
then shows each stage at work: raw events in (some malformed, some repeated),
cleaned, dead-lettered, aggregated into windows; a digits study fanned out
over the trainers (PyTorch and TensorFlow trials, TPE with ASHA pruning), the
default configuration and a scikit-learn SVC on the same split; a forecasting
study on the windows Spark wrote; the best model served and called over gRPC
on held-out digits and on an entity's latest features; then the loop: the
sensors shift, the monitor reports drift, a warm-started re-tune runs and the
champion rule decides what serves (``demo.loop``). Ends with one
summary table and the path of the run's report (``demo.report``: one HTML
file in the state directory), and stops the stack unless ``--keep``.

A service that dies during the demo is shown with its last log lines, and
the demo exits non-zero. This process talks to the services only as a client
would: Kafka, the tuner's gRPC API, the Open Inference Protocol and Redis.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from compose.settings import StackSettings, apply_infra_flags
from compose.stack import ServiceStack, ServiceStatus
from demo.console import Console, ServiceDied, Summary
from demo.events import EventsStep
from demo.live import DEMO_SETTINGS
from demo.loop import LoopStep
from demo.report import LINEAGE, DemoReport, kfold_section
from demo.serving import ServingStep
from shared.settings import KafkaSettings, load_settings

T = TypeVar("T")

PROJECT_ROOT = Path(__file__).resolve().parents[1]
STUDIES = PROJECT_ROOT / "examples" / "studies"


@dataclass(frozen=True)
class DemoOptions:
    """``aistack demo``'s flags."""

    keep: bool = False  # leave the stack running at the end
    secure: bool = False  # run it in secure mode
    sensor_events: int = 16_000
    weblog_events: int = 4_000
    trials: int = 64  # of the digits study
    folds: int = 10  # of the cross-validated comparison


def run(args: DemoOptions) -> int:
    apply_infra_flags(None, args.secure)
    for name, value in DEMO_SETTINGS.items():
        # The services inherit them; the user's own values win.
        os.environ.setdefault(name, value)
    stack = ServiceStack(load_settings(StackSettings))
    console = Console(sys.stdout)
    demo = Demo(stack, console, args)
    failed = True
    try:
        summary = demo.run()
        failed = False
    except ServiceDied as exc:
        console.line(f"\ndemo failed: {exc}")
        return 1
    finally:
        if not args.keep or failed:
            console.line("stopping the stack (aistack down)…")
            stack.down()
        else:
            console.line("the stack keeps running: `aistack status`, `aistack down` to stop it")
    console.summary(summary)
    if demo.report_path is not None:
        console.line(f"report: {demo.report_path}")
    return 0


@dataclass(frozen=True)
class StudyOutcome:
    study_id: str
    counts: dict[str, int]
    best: Any  # api.Trial or None
    metric: str = ""  # the objective


class Demo:
    def __init__(self, stack: ServiceStack, console: Console, args: DemoOptions) -> None:
        self.stack = stack
        self.console = console
        self.args = args
        self.summary = Summary()
        self.run_id = time.strftime("%m%d-%H%M%S")
        self.report = DemoReport(self.run_id)
        self.report_path: Path | None = None

    def run(self) -> Summary:
        self._stack_up()
        self.events()
        digits = self._digits_study()
        forecast, cross_validations = self._forecast_study(digits)
        self._comparison(*cross_validations)
        serving = ServingStep(self.stack, self.console, self.summary, self._wait)
        request_id = serving.run(digits, forecast)
        LoopStep(
            self.stack,
            self.console,
            self.summary,
            self._kafka(),
            self._wait,
            finish_study=self._watch_to_end,
            tuner=self._tuner,
            report=self.report,
        ).run(forecast, self.args.sensor_events)
        self.console.step(8, f"done in {self.console.elapsed:.0f} s")
        self.summary.add("demo wall time", f"{self.console.elapsed:.0f} s")
        self._write_report(request_id)
        return self.summary

    def _write_report(self, request_id: str | None) -> None:
        """The run's report into the state directory (``demo.report``), with
        the lineage of the prediction by entity of step 6. A report that
        cannot be written is said in one line: the demo's work is done."""
        from aistack.lineage import trace
        from aistack.settings import LineageSettings
        from shared.errors import AistackError

        if request_id is None:
            self.report.missing[LINEAGE] = "step 6 made no prediction by entity"
        else:
            try:
                settings = LineageSettings(kafka=self._kafka(), timeout_seconds=30)
                self.report.lineage = trace(settings, request_id)
            except AistackError as exc:
                self.report.missing[LINEAGE] = f"prediction {request_id}: {exc}"
        try:
            self.report_path = self.report.write(self.stack.settings.infra.common.state_dir)
        except Exception as exc:  # a by-product: it never fails the run it reports on
            self.console.line(f"  the report was not written: {type(exc).__name__}: {exc}")

    # ---- 1: the stack ----

    def _stack_up(self) -> None:
        self.console.step(1, "starting the stack: Kafka, Redis and every service")

        def ready(status: ServiceStatus) -> None:
            self.console.line(f"  ready: {status.name:<14} {' '.join(status.addresses)}")

        settings = " ".join(f"{name}={os.environ.get(name, '')}" for name in DEMO_SETTINGS)
        self.console.line(f"  with {settings}")
        statuses = self.stack.up(progress=ready)
        for status in statuses:
            pid = status.pid if status.pid is not None else "-"
            self.console.line(f"  {status.name:<14} {status.state:<8} pid {pid}")

    def events(self) -> None:
        """Step 2: raw events in, cleaned and windowed (on whatever state an
        earlier run left)."""
        self.report.flow = EventsStep(
            self.stack, self.console, self.summary, self._kafka(), self._wait
        ).run(self.args)

    def check_services(self) -> None:
        """Raise ServiceDied with its last log lines if a service is not running."""
        for status in self.stack.status():
            if status.state != "running":
                raise ServiceDied(
                    f"{status.name} is {status.state}; its last log lines "
                    f"({status.log_file}):\n{status.last_lines}"
                )

    def _wait(
        self,
        what: str,
        probe: Callable[[], T | None],
        timeout: float,
        show: Callable[[], str],
        diagnose: Callable[[], str] | None = None,
    ) -> T:
        """Poll ``probe`` until it answers; on a timeout, ``diagnose`` says why
        nothing came."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_services()
            result = probe()
            self.console.progress(show())
            if result is not None:
                self.console.line("")
                return result
            if time.monotonic() > deadline:
                why = f": {diagnose()}" if diagnose is not None else ""
                raise ServiceDied(f"timed out after {timeout:.0f} s waiting for {what}{why}")
            time.sleep(1.0)

    # ---- 3: studies ----

    def _digits_study(self) -> StudyOutcome:
        spec = self._spec("digits-demo.yaml")
        spec.budget.max_trials = self.args.trials
        self.console.step(
            3,
            f"tuning the digits CNN: {self.args.trials} trials, {spec.budget.max_parallel} in "
            f"flight over the trainers, TPE with {_pruner_name(spec)}, PyTorch and TensorFlow "
            "trials",
        )
        digits = self._study(spec, watch=True)
        self._study_summary("digits study", digits)
        self.report.study = self._tuner(lambda stub: _study_and_trials(stub, digits.study_id))
        return digits

    def _forecast_study(self, digits: StudyOutcome) -> tuple[StudyOutcome, tuple[str, str]]:
        """The forecasting study, and beside it the default and the tuned
        configurations' cross-validations (their study ids: they end later)."""
        folds = self.args.folds
        self.console.step(
            4,
            "forecasting the next window's mean temperature from the windows Spark wrote; "
            f"beside it the default and the tuned configurations, each cross-validated in "
            f"{folds} trials (one per fold) over the trainers",
        )
        if digits.best is None:
            raise ServiceDied("the digits study completed no trial: nothing to cross-validate")
        digits_spec = self._spec("digits-demo.yaml")
        default = self._study(self._cv_spec("default", digits_spec, {}), watch=False)
        tuned = self._study(self._cv_spec("tuned", digits_spec, digits.best.params), watch=False)
        outcome = self._study(self._spec("forecast.yaml"), watch=True)
        self._study_summary("forecast study", outcome)
        return outcome, (default.study_id, tuned.study_id)

    def _cv_spec(self, label: str, digits_spec: Any, params: Any) -> Any:
        from demo.kfold import cross_validation_spec

        name = f"digits-cv-{label}-{self.run_id}"
        return cross_validation_spec(digits_spec, name, params, self.args.folds)

    def _spec(self, file: str) -> Any:
        from aistack.studies import load_spec

        spec = load_spec((STUDIES / file).read_text())
        spec.name = f"{spec.name}-{self.run_id}"
        spec.task.model_name = f"{spec.task.model_name}-{self.run_id}"
        return spec

    def _study(self, spec: Any, *, watch: bool) -> StudyOutcome:
        from shared.contracts.aistack.v1 import tuner_service_pb2 as api

        created = self._tuner(lambda stub: stub.CreateStudy(api.CreateStudyRequest(spec=spec)))
        study_id: str = created.study.study_id
        self.console.line(f"  study {study_id} created")
        return self._watch_to_end(study_id) if watch else StudyOutcome(study_id, {}, None)

    def _watch_to_end(self, study_id: str) -> StudyOutcome:
        """Watch an existing study's trials until it ends; its outcome."""
        from aistack.cli.study import follow
        from shared.contracts.aistack.v1 import tuner_service_pb2 as api
        from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub

        async def watching() -> int:
            async with self.stack.tuner().open() as channel:
                stub = TunerServiceStub(channel)  # type: ignore[no-untyped-call]
                task = asyncio.ensure_future(follow(stub, study_id, self.console.study))
                while not task.done():
                    await asyncio.to_thread(self.check_services)
                    await asyncio.wait({task}, timeout=2.0)
                return task.result()

        state = asyncio.run(watching())
        self.console.line(f"  study {study_id}: {api.StudyState.Name(state)}")
        return self._finish(study_id)

    def _finish(self, study_id: str) -> StudyOutcome:
        """Wait for the study to end; its trial counts and best trial."""
        from shared.contracts.aistack.v1 import tuner_service_pb2 as api

        def ended() -> Any:
            study = self._tuner(lambda stub: stub.GetStudy(api.GetStudyRequest(study_id=study_id)))
            return None if study.study.state == api.STUDY_STATE_RUNNING else study.study

        study = self._wait(f"study {study_id}", ended, 900, lambda: f"study {study_id} running")
        best = study.best_trial if study.HasField("best_trial") else None
        return StudyOutcome(study_id, dict(study.trial_counts), best, study.spec.objective.metric)

    def _tuner(self, call: Callable[[Any], T]) -> T:
        from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub

        with self.stack.tuner().open_sync() as channel:
            return call(TunerServiceStub(channel))  # type: ignore[no-untyped-call]

    def _study_summary(self, label: str, outcome: StudyOutcome) -> None:
        counts = ", ".join(f"{state} {n}" for state, n in sorted(outcome.counts.items()))
        self.summary.add(f"{label} trials", counts or "none")
        if outcome.best is not None:
            from aistack.studies import describe_trial

            self.summary.add(f"{label} best", describe_trial(outcome.best))

    # ---- 5: tuned against default against SVC, by k-fold cross-validation ----

    def _comparison(self, default_cv: str, tuned_cv: str) -> None:
        from demo import kfold

        folds = self.args.folds
        self.console.step(
            5,
            f"default, tuned and a scikit-learn SVC by {folds}-fold cross-validation over every "
            "digit (the same stratified folds for all three)",
        )
        errors = {
            "default CNN": self._fold_errors(default_cv),
            "tuned CNN": self._fold_errors(tuned_cv),
            "SVC (scikit-learn)": kfold.svc_fold_errors(folds),
        }
        digits = svc_digits_count()
        for name, fold_errors in errors.items():
            self.console.line(
                f"  {name:<20} error {kfold.estimate(fold_errors)} (mean ± 95% interval over "
                f"{folds} folds, {digits} digits each predicted once)"
            )
        against_default = kfold.paired(errors["tuned CNN"], errors["default CNN"])
        against_svc = kfold.paired(errors["tuned CNN"], errors["SVC (scikit-learn)"])
        helped = kfold.verdict("the tuned CNN", "the default configuration", against_default)
        versus_svc = kfold.verdict("the tuned CNN", "the SVC", against_svc)
        self.console.line(f"  {helped}")
        self.console.line(f"  {versus_svc}")
        self.console.line(
            "  (the tuned configuration was chosen by its validation loss on the study's split, "
            "whose validation digits are among those cross-validated here: nested "
            "cross-validation would remove that optimism)"
        )
        self.summary.add(
            f"{folds}-fold error: default → tuned",
            f"{kfold.estimate(errors['default CNN'])} → {kfold.estimate(errors['tuned CNN'])} "
            f"({against_default.less_error:.0%} less error, p={against_default.p_value:.3f})",
        )
        self.summary.add(
            f"{folds}-fold error: SVC", f"{kfold.estimate(errors['SVC (scikit-learn)'])}"
        )
        self.summary.add("did tuning help", helped)
        self.summary.add("tuned CNN vs SVC", versus_svc)
        self.report.kfold = kfold_section(errors, [helped, versus_svc])

    def _fold_errors(self, study_id: str) -> list[float]:
        """Each fold's error, from the study's trials (one fold each)."""
        from demo.kfold import study_fold_errors
        from shared.contracts.aistack.v1 import tuner_service_pb2 as api

        outcome = self._finish(study_id)
        trials = self._tuner(lambda stub: stub.ListTrials(api.ListTrialsRequest(study_id=study_id)))
        try:
            return study_fold_errors(trials.trials, self.args.folds)
        except KeyError as missing:
            raise ServiceDied(
                f"cross-validation {study_id} has no error for {missing}: {outcome.counts}"
            ) from None

    def _kafka(self) -> KafkaSettings:
        return self.stack.client_kafka()


def _study_and_trials(stub: Any, study_id: str) -> tuple[Any, list[Any]]:
    """A study and its trials, as the tuner's API returns them."""
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api

    study = stub.GetStudy(api.GetStudyRequest(study_id=study_id)).study
    return study, list(stub.ListTrials(api.ListTrialsRequest(study_id=study_id)).trials)


def _pruner_name(spec: Any) -> str:
    from shared.contracts.aistack.v1 import tuning_pb2

    name = tuning_pb2.PrunerKind.Name(spec.pruner.kind).removeprefix("PRUNER_KIND_")
    readable = {"SUCCESSIVE_HALVING": "ASHA", "HYPERBAND": "Hyperband", "MEDIAN": "median"}
    pruner = readable.get(name, name.lower())
    if spec.pruner.min_resource:
        return f"{pruner} pruning (at least {spec.pruner.min_resource} epochs)"
    return f"{pruner} pruning"


def svc_digits_count() -> int:
    from sklearn.datasets import load_digits

    return len(load_digits().target)


__all__ = ["Demo", "DemoOptions", "ServiceDied", "run"]
