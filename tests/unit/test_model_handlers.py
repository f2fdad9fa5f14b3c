"""svc_model's model-ready handlers on the in-memory bus, over a stand-in
core: refused artifacts are dead-lettered with the record that carried them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, cast

from shared.bus.consumer import Record
from shared.bus.loop import ConsumeLoop, DeadLetters, each
from shared.bus.testing import MemoryPublisher, MemorySource, record
from shared.contracts.aistack.v1 import models_pb2
from shared.model_loading import ArtifactRejected
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


def setup(records: list[Record[Ready]]) -> tuple[Core, ModelReadyHandler, MemoryPublisher, Any]:
    core = Core()
    publisher = MemoryPublisher()
    dead_letters = DeadLetters(publisher, topic=DLQ, service="svc_model")
    handler = ModelReadyHandler(cast(InferenceCore, core), dead_letters)
    source: MemorySource[Ready] = MemorySource(records)
    return core, handler, publisher, (source, dead_letters)


def test_the_replay_keeps_the_last_event_per_version_and_dead_letters_refusals() -> None:
    records = [
        record(Ready, ready("1", "old"), offset=0),
        record(Ready, ready("2", "bad"), offset=1, key="digits/2"),
        record(Ready, ready("1", "new"), offset=2),
        record(Ready, None, offset=3),
    ]
    core, handler, publisher, (source, dead_letters) = setup(records)
    loop = ConsumeLoop(
        source, handler.collect, publisher=publisher, dead_letters=dead_letters,
        skip_tombstones=True,
    )  # fmt: skip

    loop.step()
    assert handler.collected == 2
    asyncio.run(handler.replay())
    publisher.flush()

    assert sorted(core.replayed) == [("digits", "1", "new"), ("digits", "2", "bad")]
    [letter] = publisher.dead_letters(DLQ)
    assert letter.reason == "checksum_mismatch" and letter.original_key == b"digits/2"
    assert (letter.source.offset, Ready.FromString(letter.original_value).version) == (1, "2")


def test_a_followed_event_is_offered_and_a_refused_one_dead_lettered() -> None:
    records = [record(Ready, ready("3"), offset=5), record(Ready, ready("4", "bad"), offset=6)]
    core, handler, publisher, (source, dead_letters) = setup(records)

    def offer(event: Ready, rec: Record[Ready]) -> None:
        asyncio.run(handler.offer(event, rec))

    ConsumeLoop(source, each(offer), publisher=publisher, dead_letters=dead_letters).step()

    assert core.offered == ["3", "4"]
    [letter] = publisher.dead_letters(DLQ)
    assert letter.source.offset == 6 and letter.reason == "checksum_mismatch"
