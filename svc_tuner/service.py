"""The tuner at work: the engine on the bus.

One thread owns the engine (Optuna's study objects are not thread-safe, and
every call is a Redis round trip): gRPC handlers, the report consumer, the
drift consumer (re-tunes) and the periodic tick all hand it their work. What
the engine decides is published (trial requests keyed by trial id, control
messages) and flushed before it is marked published, and a batch's offsets
are committed only after its outcome is flushed: a tuner killed anywhere
re-sends or re-reads, and the engine's idempotence absorbs the repeat.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from confluent_kafka.admin import AdminClient
from google.protobuf.message import Message

from shared.bus.consumer import BusConsumer
from shared.bus.groups import partition_owners
from shared.bus.loop import Batch, ConsumeLoop, DeadLetters
from shared.bus.producer import BusProducer
from shared.bus.topics import partition_count
from shared.contracts.aistack.v1 import monitoring_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.errors import NotFound, Unavailable
from shared.log import get_logger
from svc_tuner import views
from svc_tuner.dispatch import PartitionSlots
from svc_tuner.engine import Engine, Outcome
from svc_tuner.handlers import DriftHandler, ReportHandler
from svc_tuner.metrics import TunerMetrics
from svc_tuner.record import parse_trial_id
from svc_tuner.settings import TunerSettings

SERVICE = "svc_tuner"

log = get_logger(SERVICE)

T = TypeVar("T")

#: How long the trainers' group's assignment, once asked for, is taken as
#: current: between two asks, reports teach the rebalances (dispatch.py).
OWNERS_TTL_S = 5.0


class Tuner:
    def __init__(
        self,
        settings: TunerSettings,
        engine: Engine,
        producer: BusProducer,
        metrics: TunerMetrics,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self._producer = producer
        self._metrics = metrics
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tuner-engine")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchers: dict[str, set[asyncio.Queue[str]]] = defaultdict(set)
        self._slots = PartitionSlots(partition_count(settings.kafka, settings.trials_topic))
        self._admin = AdminClient(settings.kafka.client_config())
        self._owners_asked_at = -OWNERS_TTL_S
        self._owners_unknown_logged = False

    # ---- for the gRPC layer ----

    async def call(self, work: Callable[..., T], *args: Any) -> T:
        """Run ``work(*args)`` in the engine's thread."""
        self._loop = asyncio.get_running_loop()
        return await self._loop.run_in_executor(self._executor, self._timed, work, *args)

    def _timed(self, work: Callable[..., T], *args: Any) -> T:
        with _Stopwatch(self._metrics.engine_seconds):
            return work(*args)

    def create_study(self, spec: tuning_pb2.StudySpec) -> tuple[str, bool]:
        study_id, created = self.engine.create_study(spec)
        if created:
            log.info("study.created", study=study_id, trials=spec.budget.max_trials)
        self._publish(self.engine.ask(study_id))
        return study_id, created

    def stop_study(self, study_id: str) -> None:
        self._publish(self.engine.stop(study_id))
        log.info("study.stopped", study=study_id)

    def study(self, study_id: str) -> api.Study:
        """Raises NotFound."""
        return views.study_message(self.engine, study_id)

    def trials(self, study_id: str, states: frozenset[int] = frozenset()) -> list[api.Trial]:
        """The study's trials in ``states`` (all for none). Raises NotFound."""
        return views.trial_messages(self.engine, study_id, states)

    def trial_and_state(self, trial_id: str) -> tuple[api.Trial, int]:
        """A trial as it is now, and its study's state. Raises NotFound."""
        study_id, number = parse_trial_id(trial_id)
        trial = views.trial_message(study_id, self.engine.trial(study_id, number))
        return trial, self.engine.state(study_id)

    def replay(self, study_id: str) -> api.ReplayStudyResponse:
        """Raises NotFound, FailedPrecondition (a study still running)."""
        replayed = self.engine.replay(study_id)
        mismatched = [t.number for t in replayed.trials if not t.matches]
        log.info(
            "study.replayed",
            study=study_id,
            trials=len(replayed.trials),
            identical=replayed.identical,
            mismatched=mismatched or None,
        )
        return replayed

    def watch(self, study_id: str) -> asyncio.Queue[str]:
        """A queue of the ids of the study's trials as they change."""
        queue: asyncio.Queue[str] = asyncio.Queue()
        self._watchers[study_id].add(queue)
        return queue

    def unwatch(self, study_id: str, queue: asyncio.Queue[str]) -> None:
        self._watchers[study_id].discard(queue)

    # ---- the loops ----

    async def run(self, stopping: asyncio.Event) -> None:
        """Consume reports and drift events and tick until ``stopping`` is set."""
        self._loop = asyncio.get_running_loop()
        finished = threading.Event()
        settings = self.settings
        consumers = [
            threading.Thread(
                target=self._consume,
                args=(
                    finished,
                    "reports",
                    settings.reports_topic,
                    settings.group_id,
                    tuning_pb2.TrialReport,
                    ReportHandler(self.engine, self._slots, self._publish),
                    self._metrics.reports,
                ),
                name="tuner-reports",
                daemon=True,
            ),
            threading.Thread(
                target=self._consume,
                args=(
                    finished,
                    "drift",
                    settings.drift_topic,
                    settings.drift_group_id,
                    monitoring_pb2.DriftDetected,
                    DriftHandler(self.engine, self._publish),
                    self._metrics.drifts,
                ),
                name="tuner-drift",
                daemon=True,
            ),
        ]
        for consumer in consumers:
            consumer.start()
        try:
            while not stopping.is_set():
                if not all(consumer.is_alive() for consumer in consumers):
                    # Fail loudly (and be restarted) rather than serve on
                    # without ever hearing from a trainer (or the monitor) again.
                    raise Unavailable("a tuner consumer stopped; see the error above")
                await self.call(self._tick)
                try:
                    await asyncio.wait_for(stopping.wait(), self.settings.tick_seconds)
                except TimeoutError:
                    pass
        finally:
            finished.set()
            for consumer in consumers:
                await asyncio.to_thread(consumer.join, 30)
            self._executor.shutdown(wait=True)

    def _consume(
        self,
        finished: threading.Event,
        what: str,
        topic: str,
        group_id: str,
        message_cls: type[Message],
        handler: Callable[[Batch[Any]], None],
        read: Any,
    ) -> None:
        settings = self.settings
        consumer: BusConsumer[Any] = BusConsumer(
            settings.kafka,
            group_id=group_id,
            topics=[topic],
            message_cls=message_cls,
            # A restarted tuner waits this long for its killed predecessor's
            # partitions (the broker's default is 45 s).
            config={"session.timeout.ms": 10_000, "heartbeat.interval.ms": 2_000},
        )

        def in_engine_thread(batch: Batch[Any]) -> None:
            self._executor.submit(self._timed, handler, batch).result()

        loop = ConsumeLoop(
            consumer,
            in_engine_thread,
            publisher=self._producer,
            dead_letters=DeadLetters(
                self._producer,
                topic=settings.dlq_topic,
                service=SERVICE,
                counter=self._metrics.dead_letters,
            ),
            max_records=500,
            poll_timeout=0.2,
            read=read,
        )
        try:
            loop.run(finished.is_set)
        except Exception:
            log.exception("consumer.failed", consumer=what, topic=topic)
            raise
        finally:
            consumer.close()

    def _tick(self) -> None:
        for study_id in self.engine.study_ids():
            try:
                if self.engine.state(study_id) != api.STUDY_STATE_RUNNING:
                    self._announce(study_id)
                    continue
            except NotFound:
                continue  # created by a tuner that died before writing its spec
            # In this order: a request made below is not "unsent" yet.
            outcome = self.engine.unsent(study_id)
            outcome.extend(self.engine.find_lost(study_id))
            outcome.extend(self.engine.ask(study_id))
            self._publish(outcome)

    # ---- out ----

    def _announce(self, study_id: str) -> None:
        result = self.engine.unannounced_result(study_id)
        if result is None:
            return
        self._producer.publish(self.settings.results_topic, result, key=study_id)
        self._producer.flush()
        self.engine.mark_announced(study_id)
        log.info(
            "study.ended",
            study=study_id,
            stopped=result.stopped,
            error=result.error,
            best_value=result.best_value if result.HasField("best_value") else None,
            best_trial=result.best_trial_id,
            trials=dict(result.trial_counts),
        )
        if result.HasField("retune"):
            decided = result.retune
            log.info(
                "study.retune_decided",
                study=study_id,
                model=decided.model_name,
                drift=decided.drift_id,
                previous=decided.previous_study_id,
                serving_version=decided.serving_version,
                serving_value=decided.serving_value if decided.HasField("serving_value") else None,
                best_value=result.best_value if result.HasField("best_value") else None,
                promoted=decided.promoted,
                shadowed=decided.shadowed,
                reason=decided.reason,
            )

    def _publish(self, outcome: Outcome) -> None:
        settings = self.settings
        if outcome.requests:
            self._learn_owners()
        for request in outcome.requests:
            # Keyed by trial id, but placed where a trainer has just become
            # free (svc_tuner.dispatch): Kafka gives each trainer partitions,
            # not records.
            partition = self._slots.place(request.trial_id)
            self._producer.publish(
                settings.trials_topic, request, key=request.trial_id, partition=partition
            )
            attempt = "first" if request.attempt == 1 else "again"
            self._metrics.trials_requested.labels(attempt).inc()
        for control in outcome.controls:
            self._producer.publish(settings.control_topic, control, key=control.trial_id)
            action = tuning_pb2.ControlAction.Name(control.action).removeprefix("CONTROL_ACTION_")
            self._metrics.controls.labels(action.lower()).inc()
        self._slots.forget_freed()
        if outcome.requests or outcome.controls:
            self._producer.flush()
        for request in outcome.requests:
            self.engine.mark_published(request)
        self._notify(outcome.changed)

    def _learn_owners(self) -> None:
        """Ask the trainers' group whose partition is whose, at most every
        ``OWNERS_TTL_S``; without an answer, placement goes on from reports."""
        now = time.monotonic()
        if now - self._owners_asked_at < OWNERS_TTL_S:
            return
        self._owners_asked_at = now
        settings = self.settings
        try:
            owners = partition_owners(self._admin, settings.trainer_group_id, settings.trials_topic)
        except Unavailable as exc:
            if not self._owners_unknown_logged:
                self._owners_unknown_logged = True
                log.warning("dispatch.owners_unknown", error=exc.message)
            return
        if owners:
            self._slots.assigned(owners)

    def _notify(self, changed: list[str]) -> None:
        loop = self._loop
        if loop is None or not changed:
            return
        for trial in changed:
            study_id = trial.rpartition("/")[0]
            for queue in list(self._watchers.get(study_id, ())):
                loop.call_soon_threadsafe(queue.put_nowait, trial)


class _Stopwatch:
    """Adds the time inside the block to a counter."""

    def __init__(self, counter: Any) -> None:
        self._counter = counter

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._counter.inc(time.perf_counter() - self._started)
