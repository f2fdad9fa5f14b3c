"""Counting what reaches some topics, as a client would see it."""

from __future__ import annotations

import contextlib
from collections import Counter

from shared.errors import AistackError
from shared.settings import KafkaSettings


class NewRecords:
    """Counts the records committed to some topics from now on.

    A consumer reading committed records only (librdkafka's default
    isolation): a transaction's marker takes an offset but is no record, and
    an aborted transaction's records never count, so the sums of end offsets
    would overstate a transactional topic. ``reasons_of`` names a dead-letter
    topic whose records are also counted by reason."""

    def __init__(
        self, kafka: KafkaSettings, topics: tuple[str, ...], *, reasons_of: str = ""
    ) -> None:
        from shared.bus.consumer import BusTail
        from shared.contracts.aistack.v1 import events_pb2

        self._tail = BusTail(kafka, topics=topics, message_cls=events_pb2.DeadLetter)
        self._reasons_of = reasons_of
        self.counts: dict[str, int] = dict.fromkeys(topics, 0)
        self.reasons: Counter[str] = Counter()

    def update(self) -> dict[str, int]:
        """Read what arrived since the last call; the counts so far."""
        while records := self._tail.poll_batch(5000, timeout=0.2):
            for record in records:
                self.counts[record.topic] += 1
                if record.topic == self._reasons_of:
                    with contextlib.suppress(AistackError):
                        self.reasons[record.decode().reason] += 1
        return self.counts

    def close(self) -> None:
        self._tail.close()


__all__ = ["NewRecords"]
