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
  next trial starts (``reporting.Reporter``).
- A request that is not a TrialRequested is dead-lettered the bus's way
  (``shared.bus.loop.DeadLetters``), in its turn among the endings. The
  worker does not run ``shared.bus.loop.ConsumeLoop``: a request is handled
  over many polls (the group needs them while a trial trains) and committed
  later, in order, from another thread; the loop handles and commits a
  batch per poll.
- Control messages (prune, stop) are read from ``aistack.tuning.control`` by
  every replica and honoured at the run's next check.
- The group's lag (``aistack_consumer_lag``, ``shared.bus.lag``) counts from
  the committed offsets, so the requests waiting here count as not yet done.
- SIGTERM, or losing the trial's partition in a rebalance, stops the run at
  its next check and hands the trial back uncommitted: whoever gets it next
  resumes from its last checkpoint.
- An executor that dies mid-trial (a crash, an out-of-memory kill,
  ``os.abort()`` in a user's code) fails the trial with a retryable report,
  quoting the Python stacks it wrote as it died, and is replaced; the worker
  lives on. One whose processes hold more memory than the trial limit is
  killed and the trial fails, not retryable (``memory_limit``); one that
  stops checking in is killed as stalled (retryable), or, for a user's loop
  that stopped reporting, as silent (``loop_silent``, not retryable).
- A trial of a shipped code package runs in an executor of that package
  (``ExecutorPool``); the package is fetched and verified here first, and a
  package whose bytes do not match its digest is refused before any process
  imports it.
"""

from __future__ import annotations

import functools
import math
import shutil
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path

from shared import object_store
from shared.artifacts import ArtifactStore
from shared.bus.consumer import BusConsumer, BusTail, Record
from shared.bus.loop import DeadLetters, Publisher
from shared.contracts.aistack.v1 import tuning_pb2
from shared.errors import UndecodableRecord
from shared.log import get_logger
from svc_trainer import trials
from svc_trainer.background import Uploads
from svc_trainer.executors import memory
from svc_trainer.executors.pool import (
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
from svc_trainer.reporting import Reporter, Running
from svc_trainer.settings import TrainerSettings
from svc_trainer.tensorboard import TrialBoard
from svc_trainer.user_code import packages

SERVICE = "svc_trainer"
log = get_logger(SERVICE)

# How long a shutdown waits for the run to reach its next check.
HAND_BACK_SECONDS = 120.0
# How long a trial's executor may take to go idle once the trial ended.
IDLE_SECONDS = 60.0
# How often the memory of a running trial's processes is measured.
MEMORY_CHECK_SECONDS = 0.5
# Control messages kept for trials not (yet) running here.
_REMEMBERED_CONTROLS = 10_000
_ACTIONS = {
    tuning_pb2.CONTROL_ACTION_PRUNE: StopReason.PRUNE,
    tuning_pb2.CONTROL_ACTION_STOP: StopReason.STOP,
}

Consumer = BusConsumer[tuning_pb2.TrialRequested]


class Worker:
    def __init__(
        self,
        settings: TrainerSettings,
        producer: Publisher,
        metrics: TrainerMetrics,
        executors: ExecutorPool,
    ) -> None:
        self._settings = settings
        self._producer = producer
        self._metrics = metrics
        self._executors = executors
        self._trainer_id = settings.replica_id()
        self._store = ArtifactStore(settings.artifact_location(), settings.object_store)
        self._work = settings.work_dir()
        self._running: Running | None = None
        self._controls: OrderedDict[str, StopReason] = OrderedDict()
        self._revoked: set[tuple[str, int]] = set()
        # Requests taken from the bus, not yet started: oldest first.
        self._waiting: deque[Record[tuning_pb2.TrialRequested]] = deque()
        self._reporter = Reporter(
            settings,
            producer,
            metrics,
            self._store,
            self._trainer_id,
            DeadLetters(
                producer, topic=settings.dlq_topic, service=SERVICE, counter=metrics.dead_letters
            ),
        )
        self._uploads = None if self._store.local else Uploads(self._store, self._work / "uploads")
        # A remote TensorBoard directory: each run written here, then mirrored.
        self._boards: Uploads | None = None
        if object_store.scheme(settings.tensorboard_location()):
            boards = ArtifactStore(settings.tensorboard_location(), settings.object_store)
            self._boards = Uploads(boards, self._work / "board-uploads", put=boards.mirror_dir)
        self._next_memory_check = 0.0

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
            # Named by its trainer id in the group, as in its reports: the
            # tuner places trials by the group's assignment (shared.bus.groups).
            config={
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 1_000,
                "client.id": self._trainer_id,
            },
        )
        control: BusTail[tuning_pb2.TrialControl] = BusTail(
            settings.kafka,
            topics=[settings.control_topic],
            message_cls=tuning_pb2.TrialControl,
            reader=f"{SERVICE}.control",
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
            if not self._reporter.drain(HAND_BACK_SECONDS):
                log.error("trainer.endings_not_drained", pending=self._reporter.pending)
            self._reporter.close()
            for uploads in (self._uploads, self._boards):
                if uploads is not None:
                    uploads.drain(HAND_BACK_SECONDS)
                    uploads.close()
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
            self._reporter.dead_letter(consumer.commit, record, error)
            return
        self._revoked.clear()
        earlier = self._controls.pop(request.trial_id, None)
        if earlier is not None:
            # Pruned or stopped before it reached a trainer: nothing to train.
            pruned = tuning_pb2.TrialPruned(step=0, value=math.nan)
            self._reporter.refuse(consumer.commit, record, pruned=pruned)
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
        run_key = key.replace("/", "/trial-", 1)
        if self._boards is None:
            run_dir = Path(settings.tensorboard_location()) / run_key
            mirror = None
        else:
            run_dir = self._work / "tensorboard" / run_key
            mirror = functools.partial(self._boards.submit, key=run_key)
        try:
            spec = trials.run_spec(
                request,
                code_cache=self._work / "code",
                checkpoint_dir=checkpoint_dir,
                export_dir=export_dir,
                tensorboard_dir=run_dir,
                device=settings.device,
                threads=settings.threads,
                world_size=settings.world_size,
                tf_config=settings.tf_config,
                frameworks=self._executors.frameworks,
                spark=settings.spark,
                spark_work_dir=settings.spark_work_dir(),
                baseline_dir=self._work / "baselines",
            )
            params = trials.params(request)
            if spec.code is not None:
                # Fetched and verified here, before any process imports it.
                packages.ensure(spec.code)
            executor = self._executors.executor_for(spec.framework, spec.code)
        except TrialError as error:
            failed = tuning_pb2.TrialFailed(
                reason=error.reason,
                message=str(error),
                retryable=error.retryable,
                traceback=error.traceback,
                fatal_to_study=error.fatal_to_study,
            )
            self._metrics.trials.labels("failed", "").inc()
            log.warning("trial.refused", trial_id=request.trial_id, reason=error.reason)
            self._reporter.refuse(consumer.commit, record, failed=failed)
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
        self._running = Running(
            record=record,
            request=request,
            job=job,
            executor=executor,
            board=TrialBoard(
                run_dir, request.trial_id, params, _board_metrics(request), mirror=mirror
            ),
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
            self._reporter.report(
                running.request, heartbeat=tuning_pb2.TrialHeartbeat(step=running.last_step)
            )
            running.next_heartbeat = now + running.heartbeat_every
        self._producer.poll(0)
        executor = running.executor
        if running.outcome is not None:
            # Reported now, while the executor releases the trial's state
            # (a garbage collection): the tuner hears of it that much sooner.
            self._end(consumer, running, stopping)
        if not executor.busy:
            self._done(consumer, running, stopping)
        elif not executor.alive():
            for event in executor.events(timeout=0.5):
                self._on_event(running, event)
            # Its dying words first: replacing the executor removes them.
            crash = executor.crash_report()
            self._executors.trial_ended(executor, None)
            if running.outcome is None:
                running.outcome = Failed(
                    "executor_died",
                    f"the trial's executor (pid {executor.pid}) {executor.death()}",
                    retryable=True,
                    traceback=crash,
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
            running.outcome = _stalled(running, self._settings.executor_stall_seconds)
            log.error("trial.executor_stalled", trial_id=running.request.trial_id, quiet_s=quiet)
            self._done(consumer, running, stopping)
        elif running.outcome is None and (held := self._over_memory(executor)):
            self._executors.discard(executor)
            limit = self._settings.trial_memory_limit_bytes()
            running.outcome = Failed(
                "memory_limit",
                f"the trial's processes held {held >> 20} MiB, over the trainer's limit of "
                f"{limit >> 20} MiB (AISTACK_TRAINER_TRIAL_MEMORY_LIMIT_MB), and were killed: "
                "a runaway allocation? Smaller batches or model, or a higher limit",
                retryable=False,
            )
            log.error("trial.memory_limit", trial_id=running.request.trial_id, held=held)
            self._done(consumer, running, stopping)
        elif running.outcome is not None and now - running.ended_at > IDLE_SECONDS:
            log.error("executor.not_idle", pid=executor.pid, trial_id=running.request.trial_id)
            self._executors.discard(executor)
            self._done(consumer, running, stopping)

    def _on_event(self, running: Running, event: Event) -> None:
        request = running.request
        if isinstance(event, Started):
            self._reporter.report(
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
            self._reporter.report(
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
            spec = running.job.spec
            running.executor = self._executors.one_shot(spec.framework, spec.code)
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

    def _over_memory(self, executor: Executor) -> int:
        """The memory the trial's processes hold when it is over the limit
        (0 otherwise); measured at most every MEMORY_CHECK_SECONDS."""
        limit = self._settings.trial_memory_limit_bytes()
        now = time.monotonic()
        if not limit or executor.pid is None or now < self._next_memory_check:
            return 0
        self._next_memory_check = now + MEMORY_CHECK_SECONDS
        return memory.tree_over(executor.pid, limit)

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

    def _done(self, consumer: Consumer, running: Running, stopping: threading.Event) -> None:
        """The trial's executor is free (or gone): the ending handed to the
        background (if it was not yet), and the next trial taken."""
        self._running = None
        self._metrics.busy.set(0)
        self._end(consumer, running, stopping)

    def _end(self, consumer: Consumer, running: Running, stopping: threading.Event) -> None:
        """Hand how the trial ended to the background, once."""
        if running.ending_sent:
            return
        running.ending_sent = True
        running.board.close()
        self._reporter.end(consumer.commit, running, stopping)

    def _hand_back(self) -> None:
        """Shutdown: stop the run at its next check, report nothing, commit
        nothing. Its checkpoint stays for whoever gets the trial next."""
        running = self._running
        assert running is not None
        executor = running.executor
        if running.ending_sent:
            # It ended before the shutdown: its ending reports and commits it.
            self._running = None
            self._metrics.busy.set(0)
            return
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


def _stalled(running: Running, limit: float) -> Failed:
    """How a run that stopped checking in for over ``limit`` seconds fails: a
    user's loop that stopped reporting is its code's fault; a built-in run
    that hangs (a collective whose peer is gone) the machine's. The message
    names the limit, not the silence measured: that depends on when the
    worker's loop looked, later on a busy machine (the log has it)."""
    pid = running.executor.pid
    if running.job.spec.entrypoint:
        return Failed(
            "loop_silent",
            f"the training loop neither reported nor asked should_stop() for {limit:g} s "
            "(AISTACK_TRAINER_EXECUTOR_STALL_SECONDS) and was killed: report, or ask "
            "ctx.should_stop(), more often",
            retryable=False,
        )
    return Failed(
        "executor_stalled",
        f"the trial's executor (pid {pid}) made no progress for {limit:g} s "
        "(a hung collective or a deadlock?) and was killed",
        retryable=True,
    )


def _board_metrics(request: tuning_pb2.TrialRequested) -> tuple[str, ...]:
    names = ["loss", "samples_per_s", request.objective.metric]
    return tuple(dict.fromkeys(names))
