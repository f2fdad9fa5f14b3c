"""The model registry is the log: ``aistack.models.ready``, replayed on start
and followed after.

One thread reads the topic (every partition, no consumer group: every
replica of the server sees every model) and hands events to the inference
core on the event loop, one at a time and in order. Start-up reads up to
where the topic ended when the server started, then the core loads what the
policy keeps and the server reports ready. A record that is not a
ModelReady, or an event whose artifact is refused, becomes a dead letter with
the original bytes and the reason; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import threading
import time

from shared.bus.consumer import BusTail, Record
from shared.bus.deadletter import from_record, from_undecodable
from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import events_pb2, models_pb2
from shared.errors import Unavailable, UndecodableRecord
from shared.log import get_logger
from svc_model.inference import InferenceCore
from svc_model.runners import ArtifactRejected
from svc_model.settings import ModelSettings

SERVICE = "svc_model"

log = get_logger(SERVICE)

_Key = tuple[str, str]


class RegistryFollower:
    def __init__(self, settings: ModelSettings, core: InferenceCore, producer: BusProducer) -> None:
        self._settings = settings
        self._core = core
        self._producer = producer
        self._records: dict[_Key, Record[models_pb2.ModelReady]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        core.on_rejected = self._rejected

    async def start(self) -> None:
        """Replay the topic into the core; returns once the server can be ready.
        Raises Unavailable when the replay does not finish in time."""
        loop = asyncio.get_running_loop()
        replayed = loop.create_future()
        self._thread = threading.Thread(
            target=self._run, args=(loop, replayed), name="model-registry", daemon=True
        )
        self._thread.start()
        try:
            await asyncio.wait_for(replayed, self._settings.replay_timeout_seconds)
        except TimeoutError as exc:
            self._stop.set()
            raise Unavailable(
                f"the models topic {self._settings.models_topic} was not replayed within "
                f"{self._settings.replay_timeout_seconds} s"
            ) from exc

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)

    @property
    def failure(self) -> BaseException | None:
        """What stopped the follower thread, if anything did."""
        return self._failure

    def _run(self, loop: asyncio.AbstractEventLoop, replayed: asyncio.Future[None]) -> None:
        try:
            tail: BusTail[models_pb2.ModelReady] = BusTail(
                self._settings.kafka,
                topics=[self._settings.models_topic],
                message_cls=models_pb2.ModelReady,
                from_beginning=True,
            )
        except Exception as exc:
            self._failure = exc
            loop.call_soon_threadsafe(_set_exception, replayed, exc)
            return
        try:
            self._replay(tail, loop)
            loop.call_soon_threadsafe(_set_result, replayed)
            self._follow(tail, loop)
        except Exception as exc:
            self._failure = exc
            log.exception("registry.failed")
            loop.call_soon_threadsafe(_set_exception, replayed, exc)
        finally:
            tail.close()

    def _replay(
        self, tail: BusTail[models_pb2.ModelReady], loop: asyncio.AbstractEventLoop
    ) -> None:
        started = time.monotonic()
        events: dict[_Key, models_pb2.ModelReady] = {}
        count = 0
        while not self._stop.is_set() and not tail.caught_up():
            for record in tail.poll_batch(500, timeout=0.2):
                count += 1
                event = self._decode(record)
                if event is not None:
                    events[(event.model_name, event.version)] = event
        log.info(
            "registry.read",
            records=count,
            versions=len(events),
            seconds=round(time.monotonic() - started, 2),
        )
        asyncio.run_coroutine_threadsafe(self._core.replay(events.values()), loop).result()
        self._producer.flush()  # dead letters of refused artifacts

    def _follow(
        self, tail: BusTail[models_pb2.ModelReady], loop: asyncio.AbstractEventLoop
    ) -> None:
        while not self._stop.is_set():
            for record in tail.poll_batch(100, timeout=0.2):
                event = self._decode(record)
                if event is None:
                    continue
                log.info("registry.event", model=event.model_name, version=event.version)
                asyncio.run_coroutine_threadsafe(self._core.offer(event), loop).result()
                self._producer.flush()

    def _decode(self, record: Record[models_pb2.ModelReady]) -> models_pb2.ModelReady | None:
        if record.value is None:
            return None  # a tombstone: the registry forgets nothing it has loaded
        try:
            event = record.decode()
        except UndecodableRecord as error:
            self._dead_letter(from_undecodable(error, service=SERVICE))
            return None
        self._records[(event.model_name, event.version)] = record
        return event

    def _rejected(self, event: models_pb2.ModelReady, error: ArtifactRejected) -> None:
        record = self._records.get((event.model_name, event.version))
        if record is None:
            return  # an explicit load of an event already dead-lettered
        self._dead_letter(
            from_record(record, reason=error.reason, message=str(error), service=SERVICE)
        )

    def _dead_letter(self, letter: events_pb2.DeadLetter) -> None:
        self._producer.publish_dead_letter(self._settings.dlq_topic, letter)
        log.warning("model.dead_lettered", reason=letter.reason, message=letter.message)


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _set_exception(future: asyncio.Future[None], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
