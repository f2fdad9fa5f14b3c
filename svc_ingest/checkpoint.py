"""One batch's way out of svc_ingest, in order, in one place.

The model is Quix Streams' ``Checkpoint.commit``: the steps that make a batch
exactly-once are numbered, in two methods (``prepare`` decides, ``finish``
sends and acks), not a choreography spread over modules. The offsets
themselves are committed by Faust's periodic commit
(``broker_commit_interval``), which takes the same batch gate: from a
batch's first send to its ack, no commit can read the acked offsets.
``BatchPipeline`` decides the next batch meanwhile (``prepare`` sends
nothing and takes no lock); batches are sent and acked one at a time.
Where the outputs go and why is ``svc_ingest.output``'s docstring; how
Faust's insides are reached is ``svc_ingest.faust_compat``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import faust
from faust.types import EventT, Message, TableT

from shared.log import get_logger
from svc_ingest.dedup import DedupWindow, PendingIds, Sightings
from svc_ingest.faust_compat.batches import ack_batch, is_stale
from svc_ingest.faust_compat.consumer import batch_gate
from svc_ingest.faust_compat.tables import persist_changelog_offsets
from svc_ingest.handlers import Outcome, Publish
from svc_ingest.output import OutputWriter

log = get_logger("svc_ingest")

#: Records decided between two turns of the event loop in ``prepare``.
YIELD_EVERY = 500

#: ``decide(messages, publish)``: the outcome of each message, in order, each
#: record to send handed to ``publish`` (``OutputWriter.add``'s first five
#: parameters) as it is decided (``RecordHandler.handle_batch``).
Decide = Callable[[Sequence[Message], Publish], list[Outcome]]


class BatchCheckpoint:
    """Decides, sends, records and acks each batch of raw records, in two
    halves: :meth:`prepare` (deciding) and :meth:`finish` (the rest), which
    ``BatchPipeline`` overlaps for consecutive batches.

    One per worker: it keeps when the dedup ids last expired and whether a
    rebalance asks for the dedup index to be rebuilt.
    """

    def __init__(
        self,
        app: faust.App,
        writers: Callable[[], OutputWriter],
        dedup: DedupWindow,
        table: TableT[Any, Any],
        *,
        source_topic: str,
        output_topics: Iterable[str],
        exactly_once: bool,
        expire_every_ms: int,
    ) -> None:
        self._app = app
        # A writer per batch between prepare and finish: two at most, one
        # batch being decided while the one before it is sent.
        self._new_writer = writers
        self._idle_writers: list[OutputWriter] = []
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

    @property
    def rebuild_due(self) -> bool:
        """Whether the next ``prepare`` rebuilds the dedup index from the
        store: the batch before it must be finished first, so that its ids
        are in the store."""
        return self._rebuild

    async def prepare(self, events: Sequence[EventT[Any]], decide: Decide) -> PreparedBatch:
        """Decide a batch and queue its outputs, sending nothing (steps 1-3).

        1. After a rebalance, rebuild the dedup index from the table (Faust
           resumes streams only after the table's recovery).
        2. Bind each source partition to its producer: its transaction under
           exactly_once. ``PartitionRevoked`` if it is no longer ours.
        3. Decide every record (``decide``, a chunk of records at a time)
           and queue its output with the producer of its source partition;
           the batch's new dedup ids stay pending, apart from any later
           batch's.

        If 2-3 fail, the batch's new dedup ids are forgotten and the error
        propagates: it stops the worker."""
        self._rebuild_after_rebalance()  # 1
        writer = self._idle_writers.pop() if self._idle_writers else self._new_writer()
        try:
            partitions = {event.message.partition for event in events}
            await writer.use_partitions(partitions, self._topics)  # 2
            outcomes: list[Outcome] = []
            for start in range(0, len(events), YIELD_EVERY):  # 3
                if start:
                    # The event loop's turn: the batch before this one goes
                    # out and its answer comes in while this one is decided.
                    await asyncio.sleep(0)
                chunk = [event.message for event in events[start : start + YIELD_EVERY]]
                outcomes.extend(decide(chunk, writer.add))
        except BaseException:
            self._dedup.discard_pending()
            self._idle_writers.append(writer)
            raise
        return PreparedBatch(events, outcomes, writer, self._dedup.detach_pending())

    async def finish(self, batch: PreparedBatch, now_ms: int) -> list[Outcome]:
        """Send a prepared batch and ack it (steps 4-9); its outcomes, in order.

        4. Take the batch gate: Faust's periodic commit takes it before it
           reads the acked offsets, so it runs wholly before or after us.
           ``StaleBatch`` if a rebalance came between the batch's fetch and
           now (it cannot while Faust waits for every fetched record to be
           acked before it gives partitions up; if it did, the records are
           fetched again from the committed offsets).
        5. Send. exactly_once: outputs and the batch's new dedup entries
           together, as they share each source partition's transaction.
           at_least_once: the outputs, then the dedup entries that vouch for
           them.
        6. Record the changelog offsets table recovery starts from (under
           exactly_once, stored when Faust commits the transaction).
        7. Ack: the offsets become committable. Faust's next commit sends
           them into each source partition's transaction and commits it.
        8. Expire dedup ids older than the window (tombstones).
        9. Release the gate.

        If 4-6 fail, the batch's new dedup ids are forgotten (the batch comes
        again) and the error propagates: it stops the worker.
        """
        writer = batch.writer
        try:
            async with batch_gate(self._app):  # 4 (and 9, on leaving)
                try:
                    if is_stale(batch.events, self._app):
                        raise StaleBatch(len(batch.events))
                    written = await self._send(writer, batch.pending)  # 5
                    persist_changelog_offsets(  # 6
                        self._app, self._table, written, exactly_once=self._exactly_once
                    )
                except BaseException:
                    self._dedup.discard_pending(batch.pending)
                    raise
                ack_batch(batch.events, self._app)  # 7
                await self._expire(writer, now_ms)  # 8
        finally:
            self._idle_writers.append(writer)
        return batch.outcomes

    def discard(self, batch: PreparedBatch) -> None:
        """A prepared batch that will not be finished: its new dedup ids are
        forgotten (it comes again)."""
        self._dedup.discard_pending(batch.pending)
        self._idle_writers.append(batch.writer)

    def _rebuild_after_rebalance(self) -> None:
        if self._rebuild:
            self._rebuild = False
            log.info("dedup.rebuilt", ids=self._dedup.rebuild())

    async def _send(self, writer: OutputWriter, pending: PendingIds) -> list[Any]:
        if self._exactly_once:
            # Neither commits without the other, so one round trip sends both.
            self._add_sightings(writer, self._dedup.take_sightings(pending))
            return await writer.flush()
        # Outputs first, then the ids that vouch for them (see dedup.py).
        await writer.flush()
        self._add_sightings(writer, self._dedup.take_sightings(pending))
        return await writer.flush()

    def _add_sightings(self, writer: OutputWriter, groups: list[Sightings]) -> None:
        for group in groups:
            writer.add(
                group.partition,
                self._changelog,
                group.key,
                group.value,
                [],
                partition=group.partition,
            )

    async def _expire(self, writer: OutputWriter, now_ms: int) -> None:
        if now_ms - self._expired_at_ms < self._expire_every_ms:
            return
        self._expired_at_ms = now_ms
        owned = {
            tp.partition for tp in self._app.consumer.assignment() if tp.topic == self._source_topic
        }
        # Groups of partitions we no longer own are the new owner's to expire.
        forgotten = [(key, p) for key, p in self._dedup.expire(now_ms) if p in owned]
        if forgotten:
            await writer.use_partitions({p for _, p in forgotten}, (self._changelog,))
            for key, p in forgotten:
                writer.add(p, self._changelog, key, None, [], partition=p)
            await writer.flush()


@dataclass(slots=True)
class PreparedBatch:
    """A decided batch, its outputs queued on ``writer``, not sent."""

    events: Sequence[EventT[Any]]
    outcomes: list[Outcome]
    writer: OutputWriter
    pending: PendingIds


class StaleBatch(Exception):
    """A batch fetched before a rebalance reached the gate after it."""

    def __init__(self, records: int) -> None:
        super().__init__(f"a batch of {records} records was fetched before the last rebalance")


class BatchPipeline:
    """One batch sent while the next is decided.

    ``put`` decides a batch (``BatchCheckpoint.prepare``), waits for the batch
    before it to finish, then starts finishing this one in the background
    and returns: the worker fetches and decides the next batch while the
    broker takes this one and Faust's commit holds the gate. Batches finish
    one at a time, in order; ``observe`` gets each batch's outcomes as soon
    as it is acked. A batch whose finish fails wakes the task that made the
    pipeline (the worker's agent) even while it waits for records; its
    ``drain`` raises the error.
    """

    def __init__(
        self,
        checkpoint: BatchCheckpoint,
        observe: Callable[[Sequence[EventT[Any]], Sequence[Outcome]], None],
    ) -> None:
        self._checkpoint = checkpoint
        self._observe = observe
        self._owner = asyncio.current_task()
        self._in_flight: asyncio.Task[None] | None = None

    async def put(
        self,
        events: Sequence[EventT[Any]],
        decide: Decide,
        now_ms: int,
    ) -> None:
        checkpoint = self._checkpoint
        if checkpoint.rebuild_due:  # the index is rebuilt from what the store holds
            await self.drain()
        batch = await checkpoint.prepare(events, decide)
        try:
            await self.drain()
        except BaseException:
            checkpoint.discard(batch)
            raise
        finishing = asyncio.ensure_future(self._finish(batch, now_ms))
        finishing.add_done_callback(self._on_finished)
        self._in_flight = finishing
        # Its send starts now, not once the next batch waits on something: a
        # full queue hands the next batch over without a pause.
        await asyncio.sleep(0)

    async def drain(self) -> None:
        """Wait for the batch in flight, if any, to finish; raises its error."""
        finishing, self._in_flight = self._in_flight, None
        if finishing is not None:
            await finishing

    async def _finish(self, batch: PreparedBatch, now_ms: int) -> None:
        outcomes = await self._checkpoint.finish(batch, now_ms)
        self._observe(batch.events, outcomes)

    def _on_finished(self, finishing: asyncio.Task[None]) -> None:
        if finishing.cancelled() or finishing.exception() is None:
            return
        # Not yet drained: the owner is elsewhere, perhaps waiting for records
        # that never come. Woken, it drains (its agent's finally) and raises.
        if finishing is self._in_flight and self._owner is not None:
            self._owner.cancel()
