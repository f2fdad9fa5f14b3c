"""Faust's aiokafka consumer, reworked where svc_ingest needs it.

* The drain loop works per fetched batch, not per record (the throughput:
  see ``svc_ingest.faust_compat.delivery``).
* The batch gate keeps Faust's offset commit out of a batch in progress.
* The stream hold keeps stream partitions unfetched from a rebalance until
  flow resumes after the seek to the committed offsets.
* Table recovery's highwaters come from the broker and wait for it to have
  them (``svc_ingest.faust_compat.recovery``).
* Each fetched record becomes Faust's message in one step, not through
  aiokafka's ``ConsumerRecord`` (``fetched_message``).

Each overrides private methods of ``faust.transport.drivers.aiokafka``.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from typing import Any, cast

from aiokafka.consumer.fetcher import FetchResult
from faust.transport.consumer import CONSUMER_FETCHING, RecordMap
from faust.transport.drivers import aiokafka as _aiokafka
from faust.types import TP, AppT, Message
from faust.types.tuples import ConsumerMessage
from mode import Service, ServiceT

from svc_ingest.faust_compat import SCHEME
from svc_ingest.faust_compat.delivery import BatchConductor
from svc_ingest.faust_compat.recovery import HighwaterWait, settled_highwaters

__all__ = ["BatchConsumer", "BatchConsumerThread", "batch_gate", "fetched_message"]


def fetched_message(tp: TP, record: Any) -> ConsumerMessage:
    """Faust's message for one record of a fetch response: what aiokafka's
    ``PartitionRecords._consumer_record`` (without deserializers) and then
    Faust's ``Consumer._to_message`` make of it, in one object instead of
    two (0.6 against 1.0 µs a record in process). The generation id is set
    where Faust's ``_to_message`` would have been called (``BatchConsumer``);
    the headers stay the record's list (aiokafka copied them into a tuple,
    which the record handler then copied back into a list)."""
    key = record.key
    value = record.value
    timestamp = record.timestamp
    return ConsumerMessage(
        tp.topic,
        tp.partition,
        record.offset,
        cast(float, None) if timestamp is None else timestamp / 1000.0,
        record.timestamp_type,
        record.headers,
        key,
        value,
        record.checksum,
        -1 if key is None else len(key),
        -1 if value is None else len(value),
        tp,
    )


class _MessageFetches(OrderedDict[Any, Any]):
    """aiokafka's ``Fetcher._records`` (each partition's fetched records, or
    its error), whose record iterators yield ``fetched_message``'s messages:
    each ``PartitionRecords`` looks ``_consumer_record`` up on itself per
    record, so the instance's own attribute takes its place."""

    def __setitem__(self, tp: Any, result: Any) -> None:
        if type(result) is FetchResult:
            records: Any = result._partition_records
            if records is not None:
                records._consumer_record = fetched_message
        super().__setitem__(tp, result)


def _fetch_messages(fetcher: Any) -> None:
    """Have ``fetcher`` (aiokafka's, of one consumer) yield Faust's messages
    from here on, where it has no deserializers (Faust gives it none)."""
    if type(fetcher._records) is _MessageFetches:
        return
    if fetcher._key_deserializer is not None or fetcher._value_deserializer is not None:
        return
    fetcher._records = _MessageFetches(fetcher._records.items())


class BatchConsumerThread(_aiokafka.AIOKafkaConsumerThread):
    """Consumer thread with a short broker long-poll and highwaters from the broker.

    faust hard-codes ``fetch_max_wait_ms=1500``.  aiokafka keeps one fetch in
    flight per broker and only fetches partitions with nothing buffered, so
    once an idle partition (e.g. faust's ``__assignor-__leader``) is polled
    alone, the busy partitions wait out that long-poll after being drained:
    ~1 s stalls every few batches once delivery stops being the bottleneck.
    """

    #: Broker long-poll; bounds how long drained partitions can wait to be refetched.
    fetch_max_wait_ms: int = 100
    #: One broker read of the highwaters; recovery reads again while it has time.
    highwater_read_timeout: float = 5.0

    def _create_worker_consumer(self, transport: _aiokafka.Transport) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # Read by AIOKafkaConsumer.start() when it builds its Fetcher.
        consumer._fetch_max_wait_ms = self.fetch_max_wait_ms
        return consumer

    async def _fetch_records(
        self,
        consumer: Any,
        active_partitions: set[TP],
        timeout: float | None = None,
        max_records: int | None = None,
    ) -> RecordMap:
        # On the consumer's own thread, as everything else of its fetcher is.
        if consumer._fetcher is not None:
            _fetch_messages(consumer._fetcher)
        return await super()._fetch_records(
            consumer, active_partitions, timeout=timeout, max_records=max_records
        )

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        # Stock Faust, under exactly_once, returns the last stable offset of
        # the last fetch response: None (recovery's -1) for a partition not
        # fetched yet, as on a cold start. Under read_committed the broker's
        # answer to a ListOffsets request is that same offset, and always there.
        consumer: Any = self._ensure_consumer()
        offsets = consumer.end_offsets(list(partitions))
        return cast(Mapping[TP, int], await asyncio.wait_for(offsets, self.highwater_read_timeout))


class BatchConsumer(_aiokafka.Consumer):
    """aiokafka consumer whose drain loop works per fetched batch.

    Kept from ``Consumer._drain_messages``/``getmany``: generation-id and
    ``flow_active`` checks, seek-back when fetched while flow is stopped, active/
    buffered partition filter, end-offset tracking, read offsets and drop of
    already-read offsets, gap tracking for acking topics, ``commit_every``.
    Changed: ``suspend_flow`` is raced against each TP batch (2 tasks per batch,
    not per record) and records are delivered TP by TP, not round-robin.

    Added: the batch gate. Faust's commit reads the acked offsets and only
    then takes the transactions' locks, so a batch sent in between would be
    committed with the offsets from before it. A commit here holds the gate
    from before it reads the offsets; an agent holds it (``batch_gate``) from
    a batch's first send to its ack.

    Added: the stream hold. When a rebalance's recovery ends, Faust resumes
    the stream partitions, *then* seeks them to the committed offsets, and
    only then resumes flow control, which empties the stream queues and
    cancels any put blocked on a full one (``FlowControlEvent.resume``).
    Records fetched in between were processed and then fetched again after
    the seek (dead letters written twice), or dropped from the queue with
    their read offsets already advanced, and the cancelled put ended the
    fetch loop for good. Here, from a rebalance until flow resumes after that
    seek, only changelog partitions are fetched; the stream partitions' records
    wait, unread, in the client.
    """

    _batch_gate: asyncio.Lock | None = None
    #: Stream partitions are held from a rebalance until ...
    _streams_held: bool = True
    #: ... flow resumes after the seek to the committed offsets.
    _seeked_while_held: bool = False

    @property
    def batch_gate(self) -> asyncio.Lock:
        if self._batch_gate is None:
            self._batch_gate = asyncio.Lock()
        return self._batch_gate

    async def force_commit(self, topics: Any = None, start_new_transaction: bool = True) -> bool:
        async with self.batch_gate:
            committed: bool = await super().force_commit(
                topics, start_new_transaction=start_new_transaction
            )
            return committed

    async def highwaters(self, *partitions: TP) -> Mapping[TP, int]:
        """The changelog highwaters table recovery checks persisted offsets against.

        Waits (``settled_highwaters``) for the broker to report highwaters
        that cover what the local store persisted, for two thirds of
        ``broker_request_timeout``: recovery gives this call that long, and
        past it would go on with no highwaters at all.
        """
        wait = HighwaterWait(deadline_seconds=self.app.conf.broker_request_timeout * 2 / 3)
        settled = await settled_highwaters(
            self._read_highwaters, partitions, self._persisted_offsets(partitions), wait
        )
        # Faust maps a missing highwater to -1 itself.
        return cast(Mapping[TP, int], settled)

    async def _read_highwaters(self, partitions: Collection[TP]) -> Mapping[TP, int | None]:
        return await super().highwaters(*partitions)

    def _persisted_offsets(self, partitions: Iterable[TP]) -> dict[TP, int | None]:
        # What recovery will compare: set from the stores when it assigned them.
        tables: Any = self.app.tables  # TableManagerT does not declare ``recovery``
        recovery = tables.recovery
        found: dict[TP, int | None] = {}
        for tp in partitions:
            for offsets in (recovery.active_offsets, recovery.standby_offsets):
                if tp in offsets:
                    found[tp] = offsets[tp]
                    break
        return found

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        self._hold_streams()
        await super().on_partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        self._hold_streams()
        await super().on_partitions_assigned(assigned, generation_id)

    async def perform_seek(self) -> None:
        await super().perform_seek()
        if self._streams_held:
            self._seeked_while_held = True

    def resume_flow(self) -> None:
        super().resume_flow()
        if self._seeked_while_held:
            self._streams_held = self._seeked_while_held = False

    def _hold_streams(self) -> None:
        self._streams_held = True
        self._seeked_while_held = False

    def _fetchable(self, active: set[TP]) -> set[TP]:
        if not self._streams_held:
            return active
        return {tp for tp in active if self._is_changelog_tp(tp)}

    async def _wait_next_records(self, timeout: float) -> tuple[RecordMap | None, set[TP] | None]:
        # Faust's version, except the idle sleep (every partition paused)
        # is ``timeout`` instead of a fixed second, and held stream
        # partitions are not fetched.
        if not self.flow_active:
            await self.wait(self.can_resume_flow)  # type: ignore[arg-type]
        try:
            self.not_waiting_next_records.set()
            active_partitions: set[TP] | None
            if self.app.client_only:
                active_partitions = None
            else:
                active_partitions = self._fetchable(self._get_active_partitions())
            records: RecordMap = {}
            if active_partitions is None or active_partitions:
                records = await self._getmany(active_partitions=active_partitions, timeout=timeout)
            else:
                await self.sleep(timeout)
            return records, active_partitions
        finally:
            self.not_waiting_next_records.set()

    def _new_consumer_thread(self) -> _aiokafka.AIOKafkaConsumerThread:
        return BatchConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _drain_messages(self, fetcher: ServiceT) -> None:  # pragma: no cover
        consumer_should_stop = cast(Service, self)._stopped.is_set
        fetcher_should_stop = cast(Service, fetcher)._stopped.is_set
        set_flag = self.diag.set_flag
        unset_flag = self.diag.unset_flag
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                set_flag(CONSUMER_FETCHING)
                try:
                    await self._drain_one_fetch()
                finally:
                    unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise

    #: Fetch timeout while some partitions are paused for stream-buffer pressure.
    #: Faust's 1 s would leave them idle that long after the stream catches up
    #: (the fetch only watches the still-active, possibly empty, partitions).
    paused_fetch_timeout: float = 0.05

    async def _drain_one_fetch(self) -> None:
        timeout = self.paused_fetch_timeout if self._buffered_partitions else 1.0
        records, active_partitions = await self._wait_next_records(timeout)
        app = self.app
        generation_id = app.consumer_generation_id
        # Same release-to-loop the stock loop does between fetches.
        await self.sleep(0)
        if not records or self.should_stop:
            return
        if not self.flow_active:
            # As in faust's getmany: records fetched while stopped are dropped
            # and we seek back so they are fetched again after the rebalance.
            try:
                # Faust's seek, not ours: this one must not release a hold.
                await _aiokafka.Consumer.perform_seek(self)
            except Exception as ex:
                self.log.warning(f"exception performing seek when flow not active {ex}")
            return
        for tp, recs in records.items():
            if not recs:
                continue
            # Once per batch what faust checks once per record.
            if not self.flow_active or self.suspend_flow.is_set():
                break
            if app.consumer_generation_id != generation_id:
                self.log.dev("Generation id changed; dropping rest of fetch.")
                break
            if not (
                active_partitions is None
                or tp in active_partitions
                or tp in self._buffered_partitions
            ):
                continue
            app.monitor.track_tp_end_offset(tp, self.highwater(tp))
            if self._commit_every is not None and self._n_acked >= self._commit_every:
                self._n_acked = 0
                await self.commit()
            messages = await self._admit(tp, recs)
            if messages:
                await self._deliver(tp, messages)

    def _to_message(self, tp: TP, record: Any) -> ConsumerMessage:
        # Faust's own reads (``getmany``) of records the fetcher made messages.
        if type(record) is ConsumerMessage:
            record.generation_id = self.app.consumer_generation_id
            return record
        return super()._to_message(tp, record)

    async def _admit(self, tp: TP, recs: Iterable[Any]) -> list[Message]:
        # Read-offset filter and gap tracking, exactly as the stock loop computes
        # them, but against a running local offset instead of the dict per record.
        # A record is a message already (``fetched_message``) unless it was
        # fetched before the fetcher was switched over.
        app = self.app
        to_message = self._to_message
        r_offset = self._read_offset[tp]
        acks_enabled = app.topics.acks_enabled_for(tp.topic)
        generation_id = app.consumer_generation_id
        out: list[Message] = []
        for record in recs:
            offset = record.offset
            if r_offset is None or offset >= r_offset:
                gap = offset - (r_offset or 0)
                if gap > 1 and r_offset and acks_enabled:
                    await self._add_gap(tp, r_offset + 1, offset)
                    generation_id = app.consumer_generation_id
                if type(record) is ConsumerMessage:
                    record.generation_id = generation_id
                    out.append(record)
                else:
                    out.append(to_message(tp, record))
                r_offset = offset
            else:
                self.log.dev("DROPPED MESSAGE ROFF %r", offset)
        return out

    async def _deliver(self, tp: TP, messages: list[Message]) -> None:
        conductor = self.app.topics
        handler = (
            await conductor.batch_handler_for(tp) if isinstance(conductor, BatchConductor) else None
        )
        if handler is not None:
            work = handler.deliver_batch(messages, self._read_offset)
        else:
            work = self._deliver_singly(tp, messages)
        # One race per batch: stop delivering as soon as a rebalance suspends flow.
        try:
            await self.wait_first(work, self.suspend_flow.wait())
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self.should_stop or (task is not None and task.cancelling()):
                raise
            # Not us: flow control emptied the queue under a blocked put
            # (a rebalance). The seek that comes with it refetches the rest.
            self.log.info("Delivery to %r cut short by a flow-control reset", tp)

    async def _deliver_singly(self, tp: TP, messages: list[Message]) -> None:
        # Fallback for a foreign conductor: faust's per-message callback.
        callback = self.callback
        read_offset = self._read_offset
        for message in messages:
            await callback(message)
            read_offset[tp] = message.offset


def batch_gate(app: AppT) -> asyncio.Lock:
    """The lock that keeps ``app``'s offset commits out of a batch in progress."""
    consumer = app.consumer
    if not isinstance(consumer, BatchConsumer):
        raise RuntimeError(f"batch_gate needs the {SCHEME}:// transport")
    return consumer.batch_gate
