"""Model-ready events in, the inference core's repository out: svc_model's
handlers for ``aistack.models.ready``, run by ``shared.bus.loop.ConsumeLoop``
(``svc_model.registry`` runs the loop: replay, then follow).

Thin: which versions are kept and served is the core's. This module only
remembers which record carried each event, so that an event whose artifact
the core refuses (now, or on a later explicit load) is dead-lettered with
the original bytes and the reason.
"""

from __future__ import annotations

from shared.bus.consumer import Record
from shared.bus.loop import Batch, DeadLetters
from shared.contracts.aistack.v1 import models_pb2
from shared.log import get_logger
from shared.model_loading import ArtifactRejected
from svc_model.inference import InferenceCore

log = get_logger("svc_model")

_Key = tuple[str, str]


class ModelReadyHandler:
    """``collect`` (a batch handler) and ``replay`` rebuild the repository
    from the topic as it was at start; ``offer`` (per record) takes each
    event after that. Call ``collect`` from one thread at a time; ``replay``
    and ``offer`` on the core's event loop."""

    def __init__(self, core: InferenceCore, dead_letters: DeadLetters) -> None:
        self._core = core
        self._dead_letters = dead_letters
        self._records: dict[_Key, Record[models_pb2.ModelReady]] = {}
        self._replaying: dict[_Key, models_pb2.ModelReady] = {}
        core.on_rejected = self._rejected

    def collect(self, batch: Batch[models_pb2.ModelReady]) -> None:
        """During the replay: the last event of each version wins."""
        for event, record in batch:
            self._records[_key(event)] = record
            self._replaying[_key(event)] = event

    @property
    def collected(self) -> int:
        """Versions collected for the replay."""
        return len(self._replaying)

    async def replay(self) -> None:
        """Hand the collected events to the core at once: it loads only what
        the policy keeps, and then the server is ready."""
        events, self._replaying = self._replaying, {}
        await self._core.replay(events.values())

    async def offer(
        self, event: models_pb2.ModelReady, record: Record[models_pb2.ModelReady]
    ) -> None:
        self._records[_key(event)] = record
        log.info(
            "registry.event",
            model=event.model_name,
            version=event.version,
            partition=record.partition,
            offset=record.offset,
        )
        await self._core.offer(event)

    def _rejected(self, event: models_pb2.ModelReady, error: ArtifactRejected) -> None:
        record = self._records.get(_key(event))
        if record is None:
            return  # an explicit load of an event already dead-lettered
        self._dead_letters.refuse(record, error.reason, str(error))


def _key(event: models_pb2.ModelReady) -> _Key:
    return (event.model_name, event.version)
