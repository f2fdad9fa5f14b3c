"""The model registry is the log: ``aistack.models.ready``, replayed on start
and followed after.

One thread runs ``shared.model_registry.Follower`` over the topic (every
partition, no consumer group: every replica of the server sees every model)
and hands its updates to the inference core on the event loop, one at a
time and in order (``svc_model.handlers``). Start-up reads up to where the
topic ended when the server started, then the core loads what the policy
keeps and the server reports ready. A record that is not a ModelReady, or
an event whose artifact is refused, becomes a dead letter with the original
bytes and the reason; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from shared.bus.loop import DeadLetters, LabelledCounter, Publisher
from shared.errors import Unavailable
from shared.log import get_logger
from shared.model_registry import Follower
from svc_model.handlers import ModelReadyHandler
from svc_model.inference import InferenceCore
from svc_model.settings import ModelSettings

SERVICE = "svc_model"

log = get_logger(SERVICE)

T = TypeVar("T")


class RegistryFollower:
    def __init__(
        self,
        settings: ModelSettings,
        core: InferenceCore,
        producer: Publisher,
        dead_letters: LabelledCounter | None = None,
    ) -> None:
        """``dead_letters`` counts the records dead-lettered, by reason."""
        self._settings = settings
        self._producer = producer
        self._dead_letters = DeadLetters(
            producer, topic=settings.dlq_topic, service=SERVICE, counter=dead_letters
        )
        self._handler = ModelReadyHandler(core, self._dead_letters)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

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
        s = self._settings
        try:
            follower = Follower.open(
                s.kafka,
                s.models_topic,
                reader=f"{SERVICE}.registry",
                publisher=self._producer,
                dead_letters=self._dead_letters,
            )
        except Exception as exc:
            self._failure = exc
            loop.call_soon_threadsafe(_set_exception, replayed, exc)
            return
        try:
            updates = follower.replay(s.replay_timeout_seconds, self._stop.is_set)
            _on(loop, self._handler.replay(updates))
            self._producer.flush()  # dead letters of refused artifacts
            loop.call_soon_threadsafe(_set_result, replayed)
            while not self._stop.is_set():
                updates = follower.step()
                for update in updates:
                    _on(loop, self._handler.offer(update))
                if updates:
                    self._producer.flush()
        except Exception as exc:
            self._failure = exc
            log.exception("registry.failed")
            loop.call_soon_threadsafe(_set_exception, replayed, exc)
        finally:
            follower.close()


def _on(loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` on the core's event loop and wait for it."""
    return asyncio.run_coroutine_threadsafe(work, loop).result()


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _set_exception(future: asyncio.Future[None], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
