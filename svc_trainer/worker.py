"""The trainer on the bus: one trial at a time per replica.

- Trials come from ``aistack.tuning.trials`` as one consumer group: each
  replica takes whole trials. A trial trains in a warm executor
  (``executor.py``: a long-lived process per framework that has imported it
  and keeps its datasets loaded). While it trains, the worker keeps polling,
  so an hour-long trial never gets the replica thrown out of the group;
  requests that arrive meanwhile wait in order, uncommitted, in the worker
  (their partitions are this replica's: no other could take them), and are
  dropped if a rebalance moves their partition. (Pausing the partitions
  instead costs about 0.65 s per trial: librdkafka's first fetch after a
  resume comes that late.)
- Reports go to ``aistack.tuning.reports``: started, one progress per epoch,
  heartbeats, and a final completed / pruned / failed. The trial's offset is
  committed only after its final report (and, for a completed trial, its
  model-ready event) is delivered. That ending (digest, upload, model-ready,
  report, commit) runs on a background thread in trial order, while the
  next trial starts (``background.InOrder``).
- Control messages (prune, stop) are read from ``aistack.tuning.control`` by
  every replica and honoured at the run's next check.
- SIGTERM, or losing the trial's partition in a rebalance, stops the run at
  its next check and hands the trial back uncommitted: whoever gets it next
  resumes from its last checkpoint.
- An executor that dies mid-trial (a crash, an out-of-memory kill) fails the
  trial with a retryable report and is replaced; the worker lives on.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path

from shared.artifacts import ArtifactStore, digest
from shared.bus.consumer import BusConsumer, BusTail, Record
from shared.bus.deadletter import from_undecodable
from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import tuning_pb2
from shared.errors import Unavailable, UndecodableRecord
from shared.log import get_logger
from svc_trainer import trials
from svc_trainer.background import InOrder, Uploads
from svc_trainer.executor import (
    Epoch,
    Event,
    Executor,
    ExecutorPool,
    Failed,
    Finished,
    Idle,
    Job,
    NeedsFresh,
    Ready,
    Started,
)
from svc_trainer.metrics import TrainerMetrics
from svc_trainer.plan import DataLoaded, StopReason, TrialError
from svc_trainer.settings import TrainerSettings
from svc_trainer.tensorboard import TrialBoard

SERVICE = "svc_trainer"
log = get_logger(SERVICE)

# How long a shutdown waits for the run to reach its next check.
HAND_BACK_SECONDS = 120.0
# How long a trial's executor may take to go idle once the trial ended.
IDLE_SECONDS = 60.0
# Control messages kept for trials not (yet) running here.
_REMEMBERED_CONTROLS = 10_000
_ACTIONS = {
    tuning_pb2.CONTROL_ACTION_PRUNE: StopReason.PRUNE,
    tuning_pb2.CONTROL_ACTION_STOP: StopReason.STOP,
}

Consumer = BusConsumer[tuning_pb2.TrialRequested]


@dataclass
class _Running:
    record: Record[tuning_pb2.TrialRequested]
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


class Worker:
    def __init__(
        self,
        settings: TrainerSettings,
        producer: BusProducer,
        metrics: TrainerMetrics,
        executors: ExecutorPool,
    ) -> None:
        self._settings = settings
        self._producer = producer
        self._metrics = metrics
        self._executors = executors
        self._trainer_id = settings.replica_id()
        self._store = ArtifactStore(settings.artifact_location())
        self._work = settings.common.state_dir / "trainer" / trials.safe_name(self._trainer_id)
        self._running: _Running | None = None
        self._controls: OrderedDict[str, StopReason] = OrderedDict()
        self._revoked: set[tuple[str, int]] = set()
        # Requests taken from the bus, not yet started: oldest first.
        self._waiting: deque[Record[tuning_pb2.TrialRequested]] = deque()
        self._ending = InOrder("trial-endings")
        self._uploads = None if self._store.local else Uploads(self._store, self._work / "uploads")

    @property
    def trainer_id(self) -> str:
        return self._trainer_id

    def run(self, stopping: threading.Event) -> None:
        """Train trials until ``stopping`` is set; then hand back the one in
        flight (uncommitted) and leave the group."""
        settings = self._settings
        consumer: Consumer = BusConsumer(
            settings.kafka,
            group_id=settings.group_id,
            topics=[settings.trials_topic],
            message_cls=tuning_pb2.TrialRequested,
            on_revoke=self._on_revoke,
            # A replica that dies is noticed in seconds and its trial goes to
            # another; the worker polls several times a second, even mid-trial.
            config={"session.timeout.ms": 10_000, "heartbeat.interval.ms": 1_000},
        )
        control: BusTail[tuning_pb2.TrialControl] = BusTail(
            settings.kafka, topics=[settings.control_topic], message_cls=tuning_pb2.TrialControl
        )
        self._executors.warm(settings.warm_framework_names())
        log.info("trainer.started", trainer_id=self._trainer_id, group=settings.group_id)
        try:
            while not stopping.is_set():
                self._read_controls(control)
                self._idle_executors()
                idle = self._running is None and not self._waiting
                self._waiting.extend(consumer.poll_batch(10, timeout=0.2 if idle else 0))
                if self._running is None and self._waiting:
                    self._begin(consumer, self._waiting.popleft())
                elif self._running is not None:
                    self._watch(consumer, stopping)
            if self._running is not None:
                self._hand_back()
        finally:
            if not self._ending.drain(HAND_BACK_SECONDS):
                log.error("trainer.endings_not_drained", pending=self._ending.pending)
            self._ending.close()
            if self._uploads is not None:
                self._uploads.drain(HAND_BACK_SECONDS)
                self._uploads.close()
            self._executors.close()
            consumer.close()
            control.close()
            self._producer.flush()
            log.info("trainer.stopped", trainer_id=self._trainer_id)

    def _on_revoke(self, partitions: list[tuple[str, int]]) -> None:
        """A rebalance moves ``partitions`` to another replica: it reads their
        waiting requests again from the last commit."""
        self._revoked.update(partitions)
        moved = set(partitions)
        self._waiting = deque(r for r in self._waiting if (r.topic, r.partition) not in moved)

    # ---- starting a trial ----

    def _begin(self, consumer: Consumer, record: Record[tuning_pb2.TrialRequested]) -> None:
        try:
            request = record.decode()
        except UndecodableRecord as error:
            letter = from_undecodable(error, service=SERVICE)
            self._metrics.dead_letters.labels(letter.reason).inc()
            log.warning("trial.dead_lettered", reason=letter.reason, message=letter.message)

            def dead_letter() -> None:
                self._producer.publish_dead_letter(self._settings.dlq_topic, letter)
                self._deliver()
                self._commit(consumer, record)

            self._ending.submit(dead_letter)
            return
        self._revoked.clear()
        earlier = self._controls.pop(request.trial_id, None)
        if earlier is not None:
            # Pruned or stopped before it reached a trainer: nothing to train.
            pruned = tuning_pb2.TrialPruned(step=0, value=math.nan)
            self._ending.submit(lambda: self._final_and_commit(consumer, record, pruned=pruned))
            return
        key = trials.trial_key(request)
        checkpoint_key = f"checkpoints/{key}"
        if self._store.local:
            checkpoint_dir = Path(self._store.path(checkpoint_key))
        else:
            checkpoint_dir = self._work / checkpoint_key
            self._store.get_checkpoint(checkpoint_key, checkpoint_dir)
        export_dir = self._work / "export" / f"{key}-{request.attempt}"
        shutil.rmtree(export_dir, ignore_errors=True)
        settings = self._settings
        run_dir = settings.tensorboard_location() / key.replace("/", "/trial-", 1)
        try:
            spec = trials.run_spec(
                request,
                checkpoint_dir=checkpoint_dir,
                export_dir=export_dir,
                tensorboard_dir=run_dir,
                device=settings.device,
                threads=settings.threads,
                world_size=settings.world_size,
                tf_config=settings.tf_config,
                frameworks=self._executors.frameworks,
            )
            params = trials.params(request)
            executor = self._executors.executor_for(spec.framework)
        except TrialError as error:
            failed = tuning_pb2.TrialFailed(
                reason=error.reason, message=str(error), retryable=False
            )
            self._metrics.trials.labels("failed", "").inc()
            log.warning("trial.refused", trial_id=request.trial_id, reason=error.reason)
            self._ending.submit(lambda: self._final_and_commit(consumer, record, failed=failed))
            return
        job = Job(
            spec,
            trials.data_request(
                request, features_path=settings.features_location(), mnist_path=settings.mnist_path
            ),
        )
        executor.submit(job)
        every = request.heartbeat_interval.ToTimedelta().total_seconds()
        every = every if every > 0 else settings.heartbeat_seconds
        now = time.monotonic()
        self._running = _Running(
            record=record,
            request=request,
            job=job,
            executor=executor,
            board=TrialBoard(run_dir, request.trial_id, params, _board_metrics(request)),
            checkpoint_dir=checkpoint_dir,
            checkpoint_key=checkpoint_key,
            export_dir=export_dir,
            started_at=now,
            heartbeat_every=every,
            next_heartbeat=now + every,
        )
        self._metrics.busy.set(1)
        log.info(
            "trial.taken",
            trial_id=request.trial_id,
            attempt=request.attempt,
            framework=spec.framework,
            strategy=spec.strategy or "default",
            partition=record.partition,
            offset=record.offset,
        )

    # ---- while it trains ----

    def _watch(self, consumer: Consumer, stopping: threading.Event) -> None:
        running = self._running
        assert running is not None
        if (running.record.topic, running.record.partition) in self._revoked:
            running.revoked = True
            running.executor.request_stop(StopReason.SHUTDOWN)
        for event in running.executor.events(timeout=0.2):
            self._on_event(running, event)
        now = time.monotonic()
        if now >= running.next_heartbeat and running.outcome is None:
            self._report(
                running.request, heartbeat=tuning_pb2.TrialHeartbeat(step=running.last_step)
            )
            running.next_heartbeat = now + running.heartbeat_every
        self._producer.poll(0)
        executor = running.executor
        if not executor.busy:
            self._done(consumer, running, stopping)
        elif not executor.alive():
            for event in executor.events(timeout=0.5):
                self._on_event(running, event)
            self._executors.trial_ended(executor, None)
            if running.outcome is None:
                running.outcome = Failed(
                    "executor_died",
                    f"the trial's executor (pid {executor.pid}) {executor.death()}",
                    retryable=True,
                )
                self._metrics.executor_deaths.inc()
                log.error(
                    "trial.executor_died",
                    trial_id=running.request.trial_id,
                    pid=executor.pid,
                    how=executor.death(),
                )
            self._done(consumer, running, stopping)
        elif (
            running.outcome is None
            and running.data is not None
            and self._settings.executor_stall_seconds
            and (quiet := executor.quiet_for()) > self._settings.executor_stall_seconds
        ):
            self._executors.discard(executor)
            running.outcome = Failed(
                "executor_stalled",
                f"the trial's executor (pid {executor.pid}) made no progress for {quiet:.0f} s "
                "(a hung collective or a deadlock?) and was killed",
                retryable=True,
            )
            log.error("trial.executor_stalled", trial_id=running.request.trial_id, quiet_s=quiet)
            self._done(consumer, running, stopping)
        elif running.outcome is not None and now - running.ended_at > IDLE_SECONDS:
            log.error("executor.not_idle", pid=executor.pid, trial_id=running.request.trial_id)
            self._executors.discard(executor)
            self._done(consumer, running, stopping)

    def _on_event(self, running: _Running, event: Event) -> None:
        request = running.request
        if isinstance(event, Started):
            self._report(
                request, started=tuning_pb2.TrialStarted(resumed_from_step=event.resumed_from_step)
            )
            running.last_step = event.resumed_from_step
            log.info(
                "trial.started",
                trial_id=request.trial_id,
                executor_pid=event.pid,
                executor_trials_before=event.trials_before,
                data_cached=event.data_cached,
                resumed_from_step=event.resumed_from_step,
                waited_s=round(time.monotonic() - running.started_at, 3),
            )
            if event.note:
                log.warning("trial.checkpoint_not_used", trial_id=request.trial_id, note=event.note)
        elif isinstance(event, Epoch):
            if self._uploads is not None:
                self._uploads.submit(running.checkpoint_dir, running.checkpoint_key)
            value = event.metrics.get(request.objective.metric, math.nan)
            self._report(
                request,
                progress=tuning_pb2.TrialProgress(
                    step=event.step, value=value, metrics=trials.progress_metrics(event.metrics)
                ),
            )
            running.board.epoch(event.step, event.metrics)
            running.last_step = event.step
            self._metrics.epochs.inc()
            self._metrics.samples_per_second.set(event.metrics.get("samples_per_s", 0.0))
            log.info(
                "trial.epoch",
                trial_id=request.trial_id,
                step=event.step,
                value=value,
                samples_per_s=round(event.metrics.get("samples_per_s", 0.0)),
            )
        elif isinstance(event, DataLoaded):
            running.data = event
        elif isinstance(event, Finished | Failed):
            running.outcome = event
            running.ended_at = time.monotonic()
        elif isinstance(event, NeedsFresh):
            # The warm executor left for good; the trial runs in a one-shot one.
            self._executors.trial_ended(running.executor, Idle(0, retiring=True))
            running.executor = self._executors.one_shot(running.job.spec.framework)
            running.executor.submit(running.job)
            log.info("trial.fresh_process", trial_id=request.trial_id, pid=running.executor.pid)
        elif isinstance(event, Idle):
            self._executors.trial_ended(running.executor, event)

    def _idle_executors(self) -> None:
        running = self._running.executor if self._running is not None else None
        for executor, event in self._executors.idle_events(running):
            if isinstance(event, Ready):
                log.info(
                    "executor.ready",
                    framework=executor.framework,
                    pid=event.pid,
                    warm_seconds=round(event.warm_seconds, 1),
                )

    def _read_controls(self, control: BusTail[tuning_pb2.TrialControl]) -> None:
        for record in control.poll_batch(100, timeout=0):
            try:
                message = record.decode()
            except UndecodableRecord as error:
                log.warning("control.undecodable", message=error.detail)
                continue
            reason = _ACTIONS.get(message.action)
            if reason is None:
                continue
            running = self._running
            if running is not None and running.request.trial_id == message.trial_id:
                running.executor.request_stop(reason)
                log.info(
                    "trial.stop_requested",
                    trial_id=message.trial_id,
                    action=tuning_pb2.ControlAction.Name(message.action),
                    step=message.step,
                    # The last epoch reported when the request arrived: the
                    # run stops within the epoch after it.
                    reached=running.last_step,
                )
            else:
                self._controls[message.trial_id] = reason
                while len(self._controls) > _REMEMBERED_CONTROLS:
                    self._controls.popitem(last=False)

    # ---- ending it ----

    def _done(self, consumer: Consumer, running: _Running, stopping: threading.Event) -> None:
        """The trial's executor is free (or gone): hand the ending to the
        background and take the next trial."""
        self._running = None
        self._metrics.busy.set(0)
        running.board.close()
        self._ending.submit(lambda: self._end(consumer, running, stopping))

    def _end(self, consumer: Consumer, running: _Running, stopping: threading.Event) -> None:
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
                        reason=outcome.reason, message=outcome.message, retryable=outcome.retryable
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
                self._commit(consumer, running.record)
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

    def _finished(self, running: _Running, outcome: Finished) -> str:
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

    def _hand_back(self) -> None:
        """Shutdown: stop the run at its next check, report nothing, commit
        nothing. Its checkpoint stays for whoever gets the trial next."""
        running = self._running
        assert running is not None
        executor = running.executor
        executor.request_stop(StopReason.SHUTDOWN)
        deadline = time.monotonic() + HAND_BACK_SECONDS
        while executor.alive() and executor.busy and time.monotonic() < deadline:
            for event in executor.events(timeout=0.5):
                if isinstance(event, Epoch | Started | DataLoaded):
                    self._on_event(running, event)
        if executor.busy:
            self._executors.discard(executor)
        running.board.close()
        shutil.rmtree(running.export_dir, ignore_errors=True)
        self._running = None
        self._metrics.busy.set(0)
        self._metrics.trials.labels("handed_back", trials.framework_name(running.request)).inc()
        log.info("trial.handed_back", trial_id=running.request.trial_id, step=running.last_step)

    # ---- publishing (on the endings' thread, but for reports while training) ----

    def _final_and_commit(
        self, consumer: Consumer, record: Record[tuning_pb2.TrialRequested], **event: object
    ) -> None:
        request = record.decode()
        try:
            self._final(request, **event)
            self._commit(consumer, record)
        except Unavailable as error:
            log.error("trial.not_reported", trial_id=request.trial_id, error=str(error))

    def _commit(self, consumer: Consumer, record: Record[tuning_pb2.TrialRequested]) -> None:
        consumer.commit([record])

    def _report(self, request: tuning_pb2.TrialRequested, **event: object) -> None:
        report = trials.report(request, self._trainer_id, **event)
        self._producer.publish(self._settings.reports_topic, report, key=request.study_id)

    def _final(self, request: tuning_pb2.TrialRequested, **event: object) -> None:
        self._report(request, **event)
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


def _board_metrics(request: tuning_pb2.TrialRequested) -> tuple[str, ...]:
    names = ["loss", "samples_per_s", request.objective.metric]
    return tuple(dict.fromkeys(names))
