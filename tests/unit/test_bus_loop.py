"""The one consume loop, on the in-memory bus: decode, dead-letter, handle,
flush, commit — and what it does when a step fails."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter

from shared.bus import envelope
from shared.bus.consumer import Record
from shared.bus.loop import Batch, ConsumeLoop, DeadLetters, RecordRefused, each
from shared.bus.testing import MemoryPublisher, MemorySource, record
from shared.contracts.aistack.v1 import tuning_pb2
from shared.errors import Unavailable

DLQ = "dlq"
OUT = "out"
Heartbeat = tuning_pb2.TrialReport


def report(trial: str) -> tuning_pb2.TrialReport:
    return tuning_pb2.TrialReport(
        trial_id=trial, study_id="s", heartbeat=tuning_pb2.TrialHeartbeat(step=1)
    )


class Harness:
    def __init__(self, records: list[Record[Heartbeat]]) -> None:
        self.publisher = MemoryPublisher(source="svc_test")
        self.source: MemorySource[Heartbeat] = MemorySource(records)
        registry = CollectorRegistry()
        self.dead_counter = Counter("dead", "d", ("reason",), registry=registry)
        self.read_counter = Counter("read", "r", registry=registry)
        self.registry = registry
        self.handled: list[str] = []

    def loop(
        self, handler: object, *, skip_tombstones: bool = False, max_records: int = 500
    ) -> ConsumeLoop[Heartbeat]:
        return ConsumeLoop(
            self.source,
            handler,  # type: ignore[arg-type]
            publisher=self.publisher,
            dead_letters=DeadLetters(
                self.publisher, topic=DLQ, service="svc_test", counter=self.dead_counter
            ),
            max_records=max_records,
            skip_tombstones=skip_tombstones,
            read=self.read_counter,
        )

    def echo(self, message: Heartbeat, rec: Record[Heartbeat]) -> None:
        if message.trial_id.startswith("unknown"):
            raise RecordRefused(f"no trial {message.trial_id}", reason="unknown_trial")
        self.handled.append(message.trial_id)
        self.publisher.publish(OUT, message, key=message.study_id)

    def count(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def test_good_records_are_handled_in_order_delivered_then_committed() -> None:
    records = [record(Heartbeat, report(f"t{i}"), offset=i) for i in range(3)]
    bus = Harness(records)

    assert bus.loop(each(bus.echo)).step() == 3

    assert bus.handled == ["t0", "t1", "t2"]
    assert [m.trial_id for m in bus.publisher.messages(OUT)] == ["t0", "t1", "t2"]  # type: ignore[attr-defined]
    assert bus.publisher.queued == []
    assert [r.offset for r in bus.source.committed] == [0, 1, 2]
    assert bus.count("read_total") == 3


def test_an_undecodable_record_is_dead_lettered_with_its_bytes_and_never_handled() -> None:
    headers = [("x-custom", b"kept")]
    bad = record(Heartbeat, b"\xff\x00 junk", topic="reports", partition=2, offset=7, key="k",
                 headers=headers)  # fmt: skip
    good = record(Heartbeat, report("t1"), topic="reports", partition=2, offset=8)
    bus = Harness([bad, good])

    bus.loop(each(bus.echo)).step()

    [letter] = bus.publisher.dead_letters(DLQ)
    assert letter.original_value == b"\xff\x00 junk" and letter.original_key == b"k"
    assert [(h.key, h.value) for h in letter.original_headers] == headers
    assert (letter.source.topic, letter.source.partition, letter.source.offset) == ("reports", 2, 7)
    assert letter.reason == "invalid_protobuf" and letter.service == "svc_test"
    [published] = [p for p in bus.publisher.delivered if p.topic == DLQ]
    assert ("error", b"invalid_protobuf") in published.headers
    assert ("source", b"reports/2/7") in published.headers
    assert published.key == b"k"
    assert bus.handled == ["t1"]
    assert [r.offset for r in bus.source.committed] == [7, 8]
    assert bus.count("dead_total", reason="invalid_protobuf") == 1


def test_a_refused_record_is_dead_lettered_with_the_handlers_reason_and_the_batch_goes_on() -> None:
    records = [
        record(Heartbeat, report("t0"), offset=0),
        record(Heartbeat, report("unknown-1"), offset=1, event_id="ev-1"),
        record(Heartbeat, report("t2"), offset=2),
    ]
    bus = Harness(records)

    bus.loop(each(bus.echo)).step()

    [letter] = bus.publisher.dead_letters(DLQ)
    assert letter.reason == "unknown_trial" and "unknown-1" in letter.message
    assert Heartbeat.FromString(letter.original_value).trial_id == "unknown-1"
    headers = [(h.key, h.value) for h in letter.original_headers]
    assert envelope.parse_headers(headers).event_id == "ev-1"
    assert bus.handled == ["t0", "t2"]
    assert [r.offset for r in bus.source.committed] == [0, 1, 2]
    assert bus.count("dead_total", reason="unknown_trial") == 1


def test_a_batch_handler_refuses_through_the_batch() -> None:
    seen: list[str] = []

    def handler(batch: Batch[Heartbeat]) -> None:
        for message, rec in batch:
            if message.trial_id == "t1":
                batch.refuse(rec, RecordRefused("nope", reason="refused_here"))
            else:
                seen.append(message.trial_id)

    bus = Harness([record(Heartbeat, report(f"t{i}"), offset=i) for i in range(3)])
    bus.loop(handler).step()

    assert seen == ["t0", "t2"]
    assert [letter.reason for letter in bus.publisher.dead_letters(DLQ)] == ["refused_here"]


def test_a_retryable_error_is_never_dead_lettered_and_nothing_is_committed() -> None:
    def down(message: Heartbeat, rec: Record[Heartbeat]) -> None:
        raise Unavailable("redis is down")

    bus = Harness([record(Heartbeat, report("t0"))])
    with pytest.raises(Unavailable):
        bus.loop(each(down)).step()

    assert bus.publisher.queued == [] and bus.publisher.delivered == []
    assert bus.source.committed == []


def test_an_undelivered_outcome_leaves_the_batch_uncommitted() -> None:
    bus = Harness([record(Heartbeat, b"junk"), record(Heartbeat, report("t1"), offset=1)])
    bus.publisher.down = True

    with pytest.raises(Unavailable):
        bus.loop(each(bus.echo)).step()

    assert bus.source.committed == []
    assert bus.publisher.delivered == []


def test_tombstones_are_skipped_only_where_asked() -> None:
    skipping = Harness([record(Heartbeat, None), record(Heartbeat, report("t1"), offset=1)])
    skipping.loop(each(skipping.echo), skip_tombstones=True).step()
    assert skipping.publisher.dead_letters(DLQ) == [] and skipping.handled == ["t1"]

    strict = Harness([record(Heartbeat, None)])
    strict.loop(each(strict.echo)).step()
    assert [letter.reason for letter in strict.publisher.dead_letters(DLQ)] == ["no_value"]


def test_a_source_outside_a_group_is_never_committed() -> None:
    class Tail:
        def __init__(self) -> None:
            self.records = [record(Heartbeat, report("t0"))]

        def poll_batch(
            self, max_records: int = 500, timeout: float = 1.0
        ) -> list[Record[Heartbeat]]:
            batch, self.records = self.records, []
            return batch

    publisher = MemoryPublisher()
    handled: list[str] = []
    loop = ConsumeLoop(
        Tail(),
        each(lambda message, rec: handled.append(message.trial_id)),
        publisher=publisher,
        dead_letters=DeadLetters(publisher, topic=DLQ, service="svc_test"),
    )
    assert loop.step() == 1 and loop.step() == 0
    assert handled == ["t0"] and publisher.flushes == 1


def test_run_polls_until_told_to_stop() -> None:
    bus = Harness([record(Heartbeat, report(f"t{i}"), offset=i) for i in range(5)])
    loop = bus.loop(each(bus.echo), max_records=2)

    loop.run(lambda: bus.source.caught_up())

    assert bus.handled == [f"t{i}" for i in range(5)]
    assert len(bus.source.committed) == 5
