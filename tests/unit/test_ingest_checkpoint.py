"""BatchCheckpoint.commit's steps, in order, against fakes of Faust and the producers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from svc_ingest import checkpoint as checkpoint_module
from svc_ingest.checkpoint import BatchCheckpoint
from svc_ingest.dedup import DedupWindow
from svc_ingest.handlers import Outcome
from svc_ingest.output import PartitionRevoked

CHANGELOG = "ingest-dedup-changelog"


@dataclass
class FakeMessage:
    partition: int
    offset: int
    key: bytes


@dataclass
class FakeEvent:
    message: FakeMessage


@dataclass
class FakeWriter:
    """Records what the checkpoint asks of an OutputWriter, and when."""

    gate: asyncio.Lock
    journal: list[str] = field(default_factory=list)
    queued: list[tuple[int, str]] = field(default_factory=list)
    flushes: list[list[tuple[int, str]]] = field(default_factory=list)
    fail_flush: bool = False

    async def use_partitions(self, partitions: Any, topics: Any) -> None:
        self.journal.append(f"use_partitions {sorted(partitions)}")

    def add(self, source_partition: int, topic: str, *args: Any, **kwargs: Any) -> None:
        self.queued.append((source_partition, topic))

    async def flush(self) -> list[Any]:
        assert self.gate.locked(), "sent outside the batch gate"
        if self.fail_flush:
            raise PartitionRevoked(0)
        self.flushes.append(self.queued)
        self.journal.append("flush")
        self.queued = []
        return []


class FakeTable:
    class changelog_topic:  # Faust names the attribute
        @staticmethod
        def get_topic_name() -> str:
            return CHANGELOG


def clean(message: FakeMessage) -> Outcome:
    return Outcome("clean", "clean", message.key, b"v", [], event_id=message.key.decode())


def make(
    monkeypatch: pytest.MonkeyPatch, *, exactly_once: bool
) -> tuple[BatchCheckpoint, FakeWriter, DedupWindow]:
    gate = asyncio.Lock()
    writer = FakeWriter(gate)
    monkeypatch.setattr(checkpoint_module, "batch_gate", lambda app: gate)
    monkeypatch.setattr(
        checkpoint_module,
        "ack_batch",
        lambda events, app: writer.journal.append(f"ack {len(list(events))}"),
    )
    monkeypatch.setattr(
        checkpoint_module,
        "persist_changelog_offsets",
        lambda app, table, written, exactly_once: writer.journal.append("persist"),
    )
    dedup = DedupWindow({}, window_ms=60_000)
    app: Any = None  # only the patched helpers would read it
    checkpoint = BatchCheckpoint(
        app,
        writer,  # type: ignore[arg-type]
        dedup,
        FakeTable(),  # type: ignore[arg-type]
        source_topic="raw",
        output_topics=("clean", "dlq"),
        exactly_once=exactly_once,
        # Longer than any test's clock: no expiry pass (it reads the assignment).
        expire_every_ms=10**15,
    )
    return checkpoint, writer, dedup


def events(*keys: str, partition: int = 0) -> list[FakeEvent]:
    return [FakeEvent(FakeMessage(partition, i, k.encode())) for i, k in enumerate(keys)]


def decide_with(dedup: DedupWindow) -> Any:
    def decide(message: FakeMessage) -> Outcome:
        if not dedup.first_sighting(message.key, 1_000, message.partition, message.offset):
            return Outcome("duplicate", "", None, None, [])
        return clean(message)

    return decide


def run(checkpoint: BatchCheckpoint, batch: list[FakeEvent], decide: Any) -> list[Outcome]:
    return asyncio.run(checkpoint.commit(batch, decide, now_ms=1_000))  # type: ignore[arg-type]


def test_exactly_once_sends_outputs_and_dedup_entries_in_one_flush_then_acks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checkpoint, writer, dedup = make(monkeypatch, exactly_once=True)

    outcomes = run(checkpoint, events("a", "b", "a"), decide_with(dedup))

    assert [o.kind for o in outcomes] == ["clean", "clean", "duplicate"]
    assert writer.journal == ["use_partitions [0]", "flush", "persist", "ack 3"]
    (sent,) = writer.flushes
    assert sorted(topic for _, topic in sent) == ["clean", "clean", CHANGELOG]


def test_at_least_once_sends_the_outputs_before_the_ids_that_vouch_for_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checkpoint, writer, dedup = make(monkeypatch, exactly_once=False)

    run(checkpoint, events("a", "b"), decide_with(dedup))

    assert writer.flushes == [[(0, "clean"), (0, "clean")], [(0, CHANGELOG)]]
    assert writer.journal[-2:] == ["persist", "ack 2"]


def test_a_failed_send_forgets_the_batch_ids_and_acks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # at_least_once: the outputs' flush fails before the ids are taken for writing.
    checkpoint, writer, dedup = make(monkeypatch, exactly_once=False)
    writer.fail_flush = True

    with pytest.raises(PartitionRevoked):
        run(checkpoint, events("a"), decide_with(dedup))

    assert not any(entry.startswith("ack") for entry in writer.journal)
    # Redelivered, the same record is new again, not a duplicate of itself.
    writer.fail_flush = False
    outcomes = run(checkpoint, events("a"), decide_with(dedup))
    assert [o.kind for o in outcomes] == ["clean"]


def test_every_clean_event_of_a_record_goes_out_in_its_partition_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checkpoint, writer, _ = make(monkeypatch, exactly_once=True)

    def several(message: FakeMessage) -> Outcome:
        extra = [(message.key, b"v2", []), (message.key, b"v3", [])]
        return Outcome("clean", "clean", message.key, b"v1", [], event_id="x", more=extra)

    outcomes = run(checkpoint, events("a", partition=2), several)

    assert [o.kind for o in outcomes] == ["clean"]
    (sent,) = writer.flushes
    assert sent == [(2, "clean")] * 3
