"""Model-ready events in, the inference core's repository out: what
svc_model does with the updates ``shared.model_registry.Follower`` reads
from ``aistack.models.ready`` (``svc_model.registry`` runs the follower:
replay, then follow).

Thin: which versions are kept and served is the core's. This module only
remembers which record carried each event, so that an event whose artifact
the core refuses (now, or on a later explicit load) is dead-lettered with
the original bytes and the reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.bus.consumer import Record
from shared.bus.loop import DeadLetters
from shared.contracts.aistack.v1 import models_pb2
from shared.log import get_logger
from shared.model_loading import ArtifactRejected
from shared.model_registry import Update
from svc_model.inference import InferenceCore

log = get_logger("svc_model")

_Key = tuple[str, str]


class ModelReadyHandler:
    """``replay`` rebuilds the repository from the topic as it was at start;
    ``offer`` takes each event after that. Both on the core's event loop;
    the caller flushes the dead letters."""

    def __init__(self, core: InferenceCore, dead_letters: DeadLetters) -> None:
        self._core = core
        self._dead_letters = dead_letters
        self._records: dict[_Key, Record[models_pb2.ModelReady]] = {}
        core.on_rejected = self._rejected

    async def replay(self, updates: Sequence[Update]) -> None:
        """Hand the replayed events to the core at once: it loads only what
        the policy keeps, and then the server is ready. The events the
        registry skipped go too: the core refuses them, so they are
        dead-lettered."""
        events: dict[_Key, models_pb2.ModelReady] = {}
        for update in updates:
            # One event per key, as records are remembered: two skipped
            # events of one key must not dead-letter the last one twice.
            self._records[_key(update.event)] = update.record
            events[_key(update.event)] = update.event
        await self._core.replay(events.values())

    async def offer(self, update: Update) -> None:
        event, record = update.event, update.record
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
