"""BatchCheckpoint's steps, in order, and BatchPipeline's overlap of one batch's
send with the next one's decisions, against fakes of Faust and the producers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from svc_ingest import checkpoint as checkpoint_module
from svc_ingest.checkpoint import BatchCheckpoint, BatchPipeline, StaleBatch
from svc_ingest.dedup import DedupWindow, unpack
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
    # The dedup ids each changelog record carries, in the order added.
    logged_ids: list[list[bytes]] = field(default_factory=list)
    # When set, a flush waits for it: the broker's answer.
    answer: asyncio.Event | None = None

    async def use_partitions(self, partitions: Any, topics: Any) -> None:
        self.journal.append(f"use_partitions {sorted(partitions)}")

    def add(
        self, source_partition: int, topic: str, key: Any, value: Any, *args: Any, **kwargs: Any
    ) -> None:
        self.queued.append((source_partition, topic))
        if topic == CHANGELOG and value:
            self.logged_ids.append([event_id for event_id, _ in unpack(value)])

    async def flush(self) -> list[Any]:
        assert self.gate.locked(), "sent outside the batch gate"
        if self.fail_flush:
            raise PartitionRevoked(0)
        self.flushes.append(self.queued)
        self.journal.append("flush")
        self.queued = []
        if self.answer is not None:
            await self.answer.wait()
            self.journal.append("answered")
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
    monkeypatch.setattr(checkpoint_module, "is_stale", lambda events, app: False)
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
        lambda: writer,  # type: ignore[arg-type,return-value]
        dedup,
        FakeTable(),  # type: ignore[arg-type]
        source_topic="raw",
        output_topics=("clean", "dlq"),
        exactly_once=exactly_once,
        # Longer than any test's clock: no expiry pass (it reads the assignment).
        expire_every_ms=10**15,
    )
    return checkpoint, writer, dedup


def events(*keys: str, partition: int = 0, first_offset: int = 0) -> list[FakeEvent]:
    return [
        FakeEvent(FakeMessage(partition, first_offset + i, k.encode())) for i, k in enumerate(keys)
    ]


def one_by_one(decide_one: Callable[[FakeMessage], Outcome]) -> Any:
    """A batch's ``decide`` of ``decide_one`` a message, each outcome with a
    topic published from the message's partition, as ``RecordHandler.handle_batch``
    publishes."""

    def decide(messages: list[FakeMessage], publish: Any) -> list[Outcome]:
        outcomes = []
        for message in messages:
            outcome = decide_one(message)
            if outcome.topic:
                publish(message.partition, outcome.topic, outcome.key, outcome.value, [])
            outcomes.append(outcome)
        return outcomes

    return decide


def decide_with(dedup: DedupWindow) -> Any:
    def decide(message: FakeMessage) -> Outcome:
        if not dedup.first_sighting(message.key, 1_000, message.partition, message.offset):
            return Outcome("duplicate", "", None, None, [])
        return clean(message)

    return one_by_one(decide)


def run(checkpoint: BatchCheckpoint, batch: list[FakeEvent], decide: Any) -> list[Outcome]:
    async def commit() -> list[Outcome]:
        prepared = await checkpoint.prepare(batch, decide)  # type: ignore[arg-type]
        return await checkpoint.finish(prepared, now_ms=1_000)

    return asyncio.run(commit())


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

    def several(messages: list[FakeMessage], publish: Any) -> list[Outcome]:
        (message,) = messages
        for value in (b"v1", b"v2", b"v3"):
            publish(message.partition, "clean", message.key, value, [])
        return [Outcome("clean", "clean", message.key, b"v1", [], event_id="x")]

    outcomes = run(checkpoint, events("a", partition=2), several)

    assert [o.kind for o in outcomes] == ["clean"]
    (sent,) = writer.flushes
    assert sent == [(2, "clean")] * 3


def pipelined(
    monkeypatch: pytest.MonkeyPatch, *, exactly_once: bool, **writer_fields: Any
) -> tuple[BatchCheckpoint, list[FakeWriter], list[str], DedupWindow]:
    """A checkpoint whose writers share one journal, each new one a FakeWriter
    with ``writer_fields`` (the pipeline holds two at most), deciding one
    record between turns of the loop."""
    checkpoint, first, dedup = make(monkeypatch, exactly_once=exactly_once)
    monkeypatch.setattr(checkpoint_module, "YIELD_EVERY", 1)
    writers: list[FakeWriter] = []

    def new_writer() -> FakeWriter:
        writer = FakeWriter(first.gate, first.journal, **writer_fields)
        writers.append(writer)
        return writer

    checkpoint._new_writer = new_writer  # type: ignore[assignment]
    return checkpoint, writers, first.journal, dedup


def journaled(journal: list[str], dedup: DedupWindow, answer: dict[bytes, asyncio.Event]) -> Any:
    """``decide_with(dedup)`` that notes each decision and, on a key in
    ``answer``, sets its event: the broker answers only then."""
    decide = decide_with(dedup)

    def note(messages: list[FakeMessage], publish: Any) -> list[Outcome]:
        for message in messages:
            journal.append(f"decide {message.key.decode()}")
            if message.key in answer:
                answer[message.key].set()
        outcomes: list[Outcome] = decide(messages, publish)
        return outcomes

    return note


@pytest.mark.parametrize("exactly_once", [True, False])
def test_the_next_batch_is_decided_while_the_broker_takes_the_last(
    monkeypatch: pytest.MonkeyPatch, exactly_once: bool
) -> None:
    # The first batch's send is answered only once the second batch is being
    # decided: without the overlap, this waits forever.
    answered = asyncio.Event()
    checkpoint, writers, journal, dedup = pipelined(
        monkeypatch, exactly_once=exactly_once, answer=answered
    )
    observed: list[list[str]] = []

    async def main() -> None:
        decide = journaled(journal, dedup, {b"c": answered})
        pipeline = BatchPipeline(
            checkpoint, lambda events, outcomes: observed.append([o.kind for o in outcomes])
        )
        async with asyncio.timeout(5):
            await pipeline.put(events("a", "b"), decide, now_ms=1_000)
            await pipeline.put(events("c", "d", "a", first_offset=2), decide, now_ms=1_000)
            await pipeline.drain()

    asyncio.run(main())

    assert observed == [["clean", "clean"], ["clean", "clean", "duplicate"]]
    first_sent = journal.index("flush")
    assert journal.index("decide c") > first_sent  # sent before the next was decided
    assert journal.index("answered") > journal.index("decide c")  # answered meanwhile
    acks = [i for i, entry in enumerate(journal) if entry.startswith("ack")]
    assert len(acks) == 2
    # The second batch is sent only after the first is acked.
    assert journal.index("flush", acks[0]) > acks[0]
    assert journal[acks[1]] == "ack 3"
    # Each batch's changelog record holds its own new ids, not the next one's.
    assert writers[0].logged_ids == [[b"a", b"b"]]
    assert writers[1].logged_ids == [[b"c", b"d"]]


def test_a_failed_send_wakes_a_worker_that_waits_for_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The send of the batch in flight fails (at_least_once: its outputs', before
    # its ids are taken for writing).
    checkpoint, _, journal, dedup = pipelined(monkeypatch, exactly_once=False, fail_flush=True)

    async def agent() -> None:
        pipeline = BatchPipeline(checkpoint, lambda events, outcomes: None)
        try:
            await pipeline.put(events("a"), decide_with(dedup), now_ms=1_000)
            await asyncio.Event().wait()  # no more records come
        finally:
            await pipeline.drain()

    with pytest.raises(PartitionRevoked):
        asyncio.run(asyncio.wait_for(agent(), 5))

    assert not any(entry.startswith("ack") for entry in journal)
    # Redelivered, the record is new again: the failed batch's id was forgotten.
    assert dedup.first_sighting(b"a", 2_000, 0, 0)


def test_a_batch_fetched_before_a_rebalance_is_not_sent_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checkpoint, writer, dedup = make(monkeypatch, exactly_once=True)
    monkeypatch.setattr(checkpoint_module, "is_stale", lambda events, app: True)

    with pytest.raises(StaleBatch):
        run(checkpoint, events("a"), decide_with(dedup))

    assert writer.flushes == []
    assert not any(entry.startswith("ack") for entry in writer.journal)
    assert dedup.first_sighting(b"a", 2_000, 0, 0)
