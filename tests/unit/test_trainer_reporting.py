"""The trainer's endings on the in-memory bus: a request's offset is
committed only after what ends it is delivered, in the order taken."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from shared.artifacts import ArtifactStore
from shared.bus.consumer import Record
from shared.bus.loop import DeadLetters
from shared.bus.testing import MemoryPublisher, record
from shared.contracts.aistack.v1 import tuning_pb2
from shared.errors import UndecodableRecord
from svc_trainer.metrics import TrainerMetrics
from svc_trainer.reporting import Reporter
from svc_trainer.settings import TrainerSettings

Request = tuning_pb2.TrialRequested


def test_a_refused_and_an_undecodable_request_end_in_order_and_commit_after_delivery(
    tmp_path: Path,
) -> None:
    settings = TrainerSettings()
    publisher = MemoryPublisher()
    registry = CollectorRegistry()
    metrics = TrainerMetrics.create(registry)
    dead_letters = DeadLetters(
        publisher, topic=settings.dlq_topic, service="svc_trainer", counter=metrics.dead_letters
    )
    reporter = Reporter(
        settings, publisher, metrics, ArtifactStore(str(tmp_path)), "trainer-1", dead_letters
    )
    committed: list[tuple[int, int]] = []

    def commit(records: list[Record[Request]]) -> None:
        # What was delivered when the commit came.
        committed.extend((r.offset, len(publisher.delivered)) for r in records)

    refused = record(Request, Request(trial_id="s/0", study_id="s", attempt=1), offset=10)
    junk = record(Request, b"\xff junk", offset=11)
    try:
        reporter.refuse(commit, refused, pruned=tuning_pb2.TrialPruned(step=0))
        try:
            junk.decode()
        except UndecodableRecord as error:
            reporter.dead_letter(commit, junk, error)
        assert reporter.drain(30)
    finally:
        reporter.close()

    assert committed == [(10, 1), (11, 2)]
    [final] = publisher.messages(settings.reports_topic)
    assert isinstance(final, tuning_pb2.TrialReport)
    assert final.trial_id == "s/0" and final.WhichOneof("event") == "pruned"
    [letter] = publisher.dead_letters(settings.dlq_topic)
    assert letter.original_value == b"\xff junk" and letter.source.offset == 11
    assert (
        registry.get_sample_value("aistack_trainer_dead_letters_total", {"reason": letter.reason})
        == 1
    )
