"""Trial reports and drift events in, the engine's decisions out: the
tuner's handlers for ``aistack.tuning.reports`` and
``aistack.monitoring.drift``, run by ``shared.bus.loop.ConsumeLoop``.

Thin: what a report means is the engine's; this module tells it each report
of a batch, asks for the trials that the finished ones made room for, and
hands the outcome to ``publish`` (which flushes it and marks it published).
A report for a trial the engine does not know is dead-lettered
(``unknown_trial``): no redelivery can make it known. A drift event the
engine starts no re-tune for is logged and passed over (most models are not
tuned here, and repeats are expected); one whose follow-up study cannot be
named is dead-lettered (``invalid_spec``).
"""

from __future__ import annotations

from collections.abc import Callable

from shared.bus.loop import Batch, RecordRefused
from shared.contracts.aistack.v1 import monitoring_pb2, tuning_pb2
from shared.errors import InvalidArgument, NotFound
from shared.log import get_logger
from svc_tuner.dispatch import PartitionSlots
from svc_tuner.engine import Engine, Outcome

log = get_logger("svc_tuner")

UNKNOWN_TRIAL = "unknown_trial"
_FINAL = ("completed", "pruned", "failed")


class ReportHandler:
    """Not thread-safe: call it in the engine's thread."""

    def __init__(
        self, engine: Engine, slots: PartitionSlots, publish: Callable[[Outcome], None]
    ) -> None:
        self._engine = engine
        self._slots = slots
        self._publish = publish

    def __call__(self, batch: Batch[tuning_pb2.TrialReport]) -> None:
        touched: set[str] = set()
        outcome = Outcome()
        for report, record in batch:
            try:
                applied = self._engine.apply(report)
            except NotFound as error:
                batch.refuse(record, RecordRefused(error.message, reason=UNKNOWN_TRIAL))
                continue
            outcome.extend(applied)
            self._slots.reported(report.trial_id, report.trainer_id)
            # A trial pruned now ends on its trainer within an epoch.
            ended = {control.trial_id for control in applied.controls}
            if report.WhichOneof("event") in _FINAL:
                ended.add(report.trial_id)
            for trial_id in ended:
                self._slots.ended(trial_id)
            touched.add(report.study_id)
        for study_id in touched:
            # A finished trial frees a slot.
            outcome.extend(self._engine.ask(study_id))
        self._publish(outcome)


class DriftHandler:
    """Starts the re-tunes drift events call for, and asks their first
    trials. Not thread-safe: call it in the engine's thread."""

    def __init__(self, engine: Engine, publish: Callable[[Outcome], None]) -> None:
        self._engine = engine
        self._publish = publish

    def __call__(self, batch: Batch[monitoring_pb2.DriftDetected]) -> None:
        outcome = Outcome()
        for drift, record in batch:
            try:
                decision = self._engine.retune(drift)
            except InvalidArgument as error:
                batch.refuse(record, error)
                continue
            if not decision.study_id:
                log.info(
                    "drift.ignored",
                    drift=drift.drift_id,
                    model=drift.model_name,
                    study=drift.study_id,
                    why=decision.why,
                    retune=decision.other or None,
                    offset=record.offset,
                )
                continue
            log.info(
                "study.retune_started",
                study=decision.study_id,
                drift=drift.drift_id,
                model=drift.model_name,
                previous=drift.study_id,
                serving_version=drift.serving.version or drift.model_version,
            )
            outcome.extend(self._engine.ask(decision.study_id))
        self._publish(outcome)
