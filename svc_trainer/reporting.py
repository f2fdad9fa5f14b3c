"""What the trainer tells the bus about a trial, and when its offset is
committed.

Reports while a trial trains (started, progress, heartbeats) are published
from the worker's poll loop. Everything that ends a request — the final
report, a completed trial's model (digest, upload, model-ready event), a
dead letter — runs on one background thread in the order the requests were
taken (``background.InOrder``), and the request's offset is committed only
after what ends it is delivered. So a commit never passes a request whose
reports are not yet out, and the poll loop takes the next trial meanwhile.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shared.artifacts import ArtifactStore, digest
from shared.bus.consumer import Record
from shared.bus.loop import DeadLetters, Publisher
from shared.contracts.aistack.v1 import tuning_pb2
from shared.errors import Unavailable, UndecodableRecord
from shared.log import get_logger
from svc_trainer import trials
from svc_trainer.background import InOrder
from svc_trainer.executors.pool import Executor, Failed, Finished, Job
from svc_trainer.metrics import TrainerMetrics
from svc_trainer.plan import DataLoaded, StopReason, TrialError
from svc_trainer.settings import TrainerSettings

if TYPE_CHECKING:
    # Only a type here; importing it pulls in TensorBoard's protos.
    from svc_trainer.tensorboard import TrialBoard

log = get_logger("svc_trainer")

Request = Record[tuning_pb2.TrialRequested]
# Commits the position after a record (the consumer group's commit).
Commit = Callable[[list[Request]], None]


@dataclass
class Running:
    """The trial in flight on this replica."""

    record: Request
    request: tuning_pb2.TrialRequested
    job: Job
    executor: Executor
    board: TrialBoard
    checkpoint_dir: Path
    checkpoint_key: str
    export_dir: Path
    started_at: float
    heartbeat_every: float
    next_heartbeat: float
    last_step: int = 0
    data: DataLoaded | None = None
    outcome: Finished | Failed | None = None
    ended_at: float = 0.0
    revoked: bool = False
    # Its ending was handed to the background (once its outcome is known,
    # before its executor is idle).
    ending_sent: bool = False


class Reporter:
    def __init__(
        self,
        settings: TrainerSettings,
        producer: Publisher,
        metrics: TrainerMetrics,
        store: ArtifactStore,
        trainer_id: str,
        dead_letters: DeadLetters,
    ) -> None:
        self._settings = settings
        self._producer = producer
        self._metrics = metrics
        self._store = store
        self._trainer_id = trainer_id
        self._dead_letters = dead_letters
        self._in_order = InOrder("trial-endings")

    # ---- while a trial trains (the poll loop's thread) ----

    def report(self, request: tuning_pb2.TrialRequested, **event: object) -> None:
        report = trials.report(request, self._trainer_id, **event)
        self._producer.publish(self._settings.reports_topic, report, key=request.study_id)

    # ---- endings, in the order submitted ----

    def dead_letter(self, commit: Commit, record: Request, error: UndecodableRecord) -> None:
        """A request that is not a TrialRequested: dead-lettered, then committed."""

        def send() -> None:
            self._dead_letters.undecodable(error)
            self._deliver()
            commit([record])

        self._in_order.submit(send)

    def refuse(self, commit: Commit, record: Request, **event: object) -> None:
        """A request ended before it trained (pruned before it arrived, a
        configuration that cannot run): its final report, then the commit."""
        self._in_order.submit(lambda: self._final_and_commit(commit, record, **event))

    def end(self, commit: Commit, running: Running, stopping: threading.Event) -> None:
        """The trial's executor is free (or gone): report how it ended and
        commit, or leave the offset when it was handed back."""
        self._in_order.submit(lambda: self._end(commit, running, stopping))

    @property
    def pending(self) -> int:
        return self._in_order.pending

    def drain(self, timeout: float) -> bool:
        """Wait until every ending submitted ran; False on timeout."""
        return self._in_order.drain(timeout)

    def close(self) -> None:
        self._in_order.close()

    # ---- on the endings' thread ----

    def _end(self, commit: Commit, running: Running, stopping: threading.Event) -> None:
        request, outcome = running.request, running.outcome
        framework = trials.framework_name(request)
        handed_back = (
            running.revoked
            or outcome is None
            or (isinstance(outcome, Finished) and outcome.result.stopped is StopReason.SHUTDOWN)
        )
        try:
            if handed_back:
                outcome_name = "handed_back"
            elif isinstance(outcome, Failed):
                self._final(
                    request,
                    failed=tuning_pb2.TrialFailed(
                        reason=outcome.reason,
                        message=outcome.message,
                        retryable=outcome.retryable,
                        traceback=outcome.traceback,
                        fatal_to_study=outcome.fatal_to_study,
                    ),
                )
                outcome_name = "failed"
                log.warning(
                    "trial.failed",
                    trial_id=request.trial_id,
                    reason=outcome.reason,
                    message=outcome.message,
                )
            else:
                assert isinstance(outcome, Finished)
                outcome_name = self._finished(running, outcome)
            if not handed_back:
                commit([running.record])
        except (Unavailable, TrialError) as error:
            # Not delivered: leave the offset, the trial comes back.
            outcome_name = "handed_back"
            log.error("trial.not_reported", trial_id=request.trial_id, error=str(error))
            if not stopping.is_set():
                time.sleep(1.0)
        finally:
            shutil.rmtree(running.export_dir, ignore_errors=True)
        self._metrics.trials.labels(outcome_name, framework).inc()
        self._metrics.trial_seconds.observe(time.monotonic() - running.started_at)
        log.info("trial.ended", trial_id=request.trial_id, outcome=outcome_name)

    def _finished(self, running: Running, outcome: Finished) -> str:
        request, result = running.request, outcome.result
        metric = request.objective.metric
        if result.stopped is not StopReason.NONE:
            value = result.val_metrics.get(metric, math.nan)
            self._final(
                request, pruned=tuning_pb2.TrialPruned(step=result.epochs_completed, value=value)
            )
            log.info("trial.pruned", trial_id=request.trial_id, step=result.epochs_completed)
            return "pruned"
        value = trials.objective_value(result, metric)
        metrics = trials.progress_metrics({**result.val_metrics, **result.test_metrics})
        if not result.export_format:
            # An evaluation (cross-validation): metrics, no model.
            self._final(request, completed=tuning_pb2.TrialCompleted(value=value, metrics=metrics))
            log.info("trial.completed", trial_id=request.trial_id, value=value, model="")
            return "completed"
        sha, size = digest(running.export_dir)
        name, version = trials.model_name(request), trials.model_version(request)
        uri = self._store.put_dir(running.export_dir, f"models/{trials.safe_name(name)}/{version}")
        ready = trials.model_ready(
            request,
            result,
            running.data,
            artifact_uri=uri,
            sha256=sha,
            size_bytes=size,
            trainer_id=self._trainer_id,
        )
        # One record per version: compaction keeps every version, so a restarted
        # model server still knows the champion and the last versions.
        self._producer.publish(self._settings.models_topic, ready, key=f"{name}/{version}")
        self._metrics.models_published.inc()
        self._final(
            request,
            completed=tuning_pb2.TrialCompleted(
                value=value, metrics=metrics, model_name=name, model_version=version
            ),
        )
        log.info(
            "trial.completed",
            trial_id=request.trial_id,
            value=value,
            model=name,
            version=version,
            sha256=sha,
        )
        return "completed"

    def _final_and_commit(self, commit: Commit, record: Request, **event: object) -> None:
        request = record.decode()
        try:
            self._final(request, **event)
            commit([record])
        except Unavailable as error:
            log.error("trial.not_reported", trial_id=request.trial_id, error=str(error))

    def _final(self, request: tuning_pb2.TrialRequested, **event: object) -> None:
        self.report(request, **event)
        self._deliver()

    def _deliver(self) -> None:
        """Flush, retrying with backoff: a broker that is down is waited for,
        never a reason to drop a final report."""
        delay = 1.0
        for attempt in range(6):
            try:
                self._producer.flush(timeout=30)
                return
            except Unavailable as error:
                log.warning("trainer.flush_retry", attempt=attempt, error=str(error))
                time.sleep(delay)
                delay = min(delay * 2, 30)
        self._producer.flush(timeout=30)
