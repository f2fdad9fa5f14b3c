"""svc_model's model-ready handlers fed by the registry's follower on the
in-memory bus, over a stand-in core: refused artifacts are dead-lettered
with the record that carried them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, cast

from shared.bus.consumer import Record
from shared.bus.loop import DeadLetters
from shared.bus.testing import MemoryPublisher, MemorySource, record
from shared.contracts.aistack.v1 import models_pb2
from shared.model_loading import ArtifactRejected
from shared.model_registry import Follower
from svc_model.handlers import ModelReadyHandler
from svc_model.inference import InferenceCore

DLQ = "dlq"
Ready = models_pb2.ModelReady


class Core:
    """Refuses every event whose sha256 is "bad", as the real core would
    through ``on_rejected``."""

    def __init__(self) -> None:
        self.on_rejected: Any = None
        self.replayed: list[tuple[str, str, str]] = []
        self.offered: list[str] = []

    async def replay(self, events: Iterable[Ready]) -> None:
        for event in events:
            self.replayed.append((event.model_name, event.version, event.sha256))
            self._check(event)

    async def offer(self, event: Ready) -> None:
        self.offered.append(event.version)
        self._check(event)

    def _check(self, event: Ready) -> None:
        if event.sha256 == "bad":
            self.on_rejected(
                event, ArtifactRejected("checksum differs", reason="checksum_mismatch")
            )


def ready(version: str, sha: str = "good") -> Ready:
    return Ready(model_name="digits", version=version, sha256=sha)


Fed = tuple[Core, ModelReadyHandler, MemoryPublisher, Follower]


def follow(records: list[Record[Ready]]) -> Fed:
    """The handler fed as svc_model.registry feeds it: from the shared follower."""
    core = Core()
    publisher = MemoryPublisher()
    dead_letters = DeadLetters(publisher, topic=DLQ, service="svc_model")
    handler = ModelReadyHandler(cast(InferenceCore, core), dead_letters)
    follower = Follower(
        MemorySource(records), topic="models", publisher=publisher, dead_letters=dead_letters
    )
    return core, handler, publisher, follower


def test_the_replay_keeps_the_last_event_per_version_and_dead_letters_refusals() -> None:
    records = [
        record(Ready, ready("1", "old"), offset=0),
        record(Ready, ready("2", "bad"), offset=1, key="digits/2"),
        record(Ready, ready("1", "new"), offset=2),
        record(Ready, None, offset=3),
    ]
    core, handler, publisher, follower = follow(records)

    asyncio.run(handler.replay(follower.replay(timeout=5)))
    publisher.flush()

    assert sorted(core.replayed) == [("digits", "1", "new"), ("digits", "2", "bad")]
    [letter] = publisher.dead_letters(DLQ)
    assert letter.reason == "checksum_mismatch" and letter.original_key == b"digits/2"
    assert (letter.source.offset, Ready.FromString(letter.original_value).version) == (1, "2")


def test_events_the_registry_skips_reach_the_core_once_per_record_kept() -> None:
    """The core refuses them (and so they are dead-lettered); two of one key
    are one event, as they are one remembered record."""
    records = [
        record(Ready, ready("v1"), offset=0),
        record(Ready, ready("v1", "again"), offset=1),
        record(Ready, ready("1"), offset=2),
    ]
    core, handler, _, follower = follow(records)
    asyncio.run(handler.replay(follower.replay(timeout=5)))
    assert sorted(core.replayed) == [("digits", "1", "good"), ("digits", "v1", "again")]


def test_a_followed_event_is_offered_and_a_refused_one_dead_lettered() -> None:
    records = [record(Ready, ready("3"), offset=5), record(Ready, ready("4", "bad"), offset=6)]
    core, handler, publisher, follower = follow(records)

    for update in follower.step():
        asyncio.run(handler.offer(update))
    publisher.flush()

    assert core.offered == ["3", "4"]
    [letter] = publisher.dead_letters(DLQ)
    assert letter.source.offset == 6 and letter.reason == "checksum_mismatch"
