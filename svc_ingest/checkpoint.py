"""One batch's way out of svc_ingest, in order, in one place.

The model is Quix Streams' ``Checkpoint.commit``: the steps that make a batch
exactly-once are one method with numbered steps, not a choreography spread
over modules. The offsets themselves are committed by Faust's periodic
commit (``broker_commit_interval``), which takes the same batch gate: from
a batch's first send to its ack, no commit can read the acked offsets.
Where the outputs go and why is ``svc_ingest.output``'s docstring; how
Faust's insides are reached is ``svc_ingest.faust_compat``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import faust
from faust.types import EventT, Message, TableT

from shared.log import get_logger
from svc_ingest.dedup import DedupWindow, Sightings
from svc_ingest.faust_compat.batches import ack_batch
from svc_ingest.faust_compat.consumer import batch_gate
from svc_ingest.faust_compat.tables import persist_changelog_offsets
from svc_ingest.handlers import Outcome
from svc_ingest.output import OutputWriter

log = get_logger("svc_ingest")


class BatchCheckpoint:
    """Decides, sends, records and acks each batch of raw records (:meth:`commit`).

    One per worker: it keeps when the dedup ids last expired and whether a
    rebalance asks for the dedup index to be rebuilt.
    """

    def __init__(
        self,
        app: faust.App,
        writer: OutputWriter,
        dedup: DedupWindow,
        table: TableT[Any, Any],
        *,
        source_topic: str,
        output_topics: Iterable[str],
        exactly_once: bool,
        expire_every_ms: int,
    ) -> None:
        self._app = app
        self._writer = writer
        self._dedup = dedup
        self._table = table
        self._source_topic = source_topic
        self._changelog = table.changelog_topic.get_topic_name()
        self._topics = (*output_topics, self._changelog)
        self._exactly_once = exactly_once
        self._expire_every_ms = expire_every_ms
        self._rebuild = True
        self._expired_at_ms = 0

    def rebalanced(self) -> None:
        """A rebalance ended: the next batch first rebuilds the dedup index."""
        self._rebuild = True

    async def commit(
        self,
        events: Sequence[EventT[Any]],
        decide: Callable[[Message], Outcome],
        now_ms: int,
    ) -> list[Outcome]:
        """Take one batch from its records to its ack; the outcomes, in order.

        1. Take the batch gate: Faust's periodic commit takes it before it
           reads the acked offsets, so it runs wholly before or after us.
        2. After a rebalance, rebuild the dedup index from the table (Faust
           resumes streams only after the table's recovery).
        3. Bind each source partition to its producer: its transaction under
           exactly_once. ``PartitionRevoked`` if it is no longer ours.
        4. Decide every record (``decide``) and queue its output with the
           producer of its source partition.
        5. Send. exactly_once: outputs and the new dedup entries together,
           as they share each source partition's transaction. at_least_once:
           the outputs, then the dedup entries that vouch for them.
        6. Record the changelog offsets table recovery starts from (under
           exactly_once, stored when Faust commits the transaction).
        7. Ack: the offsets become committable. Faust's next commit sends
           them into each source partition's transaction and commits it.
        8. Expire dedup ids older than the window (tombstones).
        9. Release the gate.

        If 3-6 fail, the batch's new dedup ids are forgotten (the batch comes
        again) and the error propagates: it stops the worker.
        """
        async with batch_gate(self._app):  # 1 (and 9, on leaving)
            self._rebuild_after_rebalance()  # 2
            try:
                partitions = {event.message.partition for event in events}
                await self._writer.use_partitions(partitions, self._topics)  # 3
                outcomes = [self._queue(event.message, decide) for event in events]  # 4
                written = await self._send()  # 5
                persist_changelog_offsets(  # 6
                    self._app, self._table, written, exactly_once=self._exactly_once
                )
            except BaseException:
                self._dedup.discard_pending()
                raise
            ack_batch(events, self._app)  # 7
            await self._expire(now_ms)  # 8
        return outcomes

    def _rebuild_after_rebalance(self) -> None:
        if self._rebuild:
            self._rebuild = False
            log.info("dedup.rebuilt", ids=self._dedup.rebuild())

    def _queue(self, message: Message, decide: Callable[[Message], Outcome]) -> Outcome:
        outcome = decide(message)
        if outcome.topic:
            self._writer.add(
                message.partition, outcome.topic, outcome.key, outcome.value, outcome.headers
            )
            for key, value, headers in outcome.more:
                self._writer.add(message.partition, outcome.topic, key, value, headers)
        return outcome

    async def _send(self) -> list[Any]:
        if self._exactly_once:
            # Neither commits without the other, so one round trip sends both.
            self._add_sightings(self._dedup.take_sightings())
            return await self._writer.flush()
        # Outputs first, then the ids that vouch for them (see dedup.py).
        await self._writer.flush()
        self._add_sightings(self._dedup.take_sightings())
        return await self._writer.flush()

    def _add_sightings(self, groups: list[Sightings]) -> None:
        for group in groups:
            self._writer.add(
                group.partition,
                self._changelog,
                group.key,
                group.value,
                [],
                partition=group.partition,
            )

    async def _expire(self, now_ms: int) -> None:
        if now_ms - self._expired_at_ms < self._expire_every_ms:
            return
        self._expired_at_ms = now_ms
        owned = {
            tp.partition for tp in self._app.consumer.assignment() if tp.topic == self._source_topic
        }
        # Groups of partitions we no longer own are the new owner's to expire.
        forgotten = [(key, p) for key, p in self._dedup.expire(now_ms) if p in owned]
        if forgotten:
            await self._writer.use_partitions({p for _, p in forgotten}, (self._changelog,))
            for key, p in forgotten:
                self._writer.add(p, self._changelog, key, None, [], partition=p)
            await self._writer.flush()
