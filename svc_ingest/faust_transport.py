"""A faust-streaming transport that hands fetched records to streams per batch.

Stock Faust (0.15.3) pays for every record it delivers: ``Consumer._drain_messages``
races each delivery against ``suspend_flow`` with ``wait_first`` (two tasks and
their futures per record), and the conductor handler awaits flow control and
the producer buffer per record.  On a 2-core box that caps a worker at roughly
6-10k msgs/s while plain aiokafka does ~70k.  Here the same work is done once
per fetched (topic, partition) batch; per record only the cheap bookkeeping
remains (read offset, gap detection, decode, queue put).

Use it with ``broker="aistack-kafka://host:9092"`` (importing this module
registers the scheme).  Agents can then pull whole batches with :func:`take_batch` and ack
them with :func:`ack_batch`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, MutableMapping, MutableSet, Sequence
from time import monotonic
from typing import Any, TypeAlias, cast

from faust.exceptions import KeyDecodeError, ValueDecodeError
from faust.serializers.registry import Registry
from faust.serializers.schemas import Schema
from faust.topics import Topic
from faust.transport import conductor as _conductor
from faust.transport.consumer import CONSUMER_FETCHING, RecordMap
from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers import aiokafka as _aiokafka
from faust.types import TP, AppT, EventT, Message
from faust.types.topics import TopicT
from faust.types.transports import ConsumerCallback
from faust.types.tuples import ack_lock
from mode import Service, ServiceT
from mode.utils.queues import FlowControlQueue

__all__ = [
    "SCHEME",
    "BatchConductor",
    "BatchConsumer",
    "Transport",
    "ack_batch",
    "batch_gate",
    "take_batch",
]

_Event: TypeAlias = EventT[Any]

#: URL scheme registered with faust's transport registry.
SCHEME = "aistack-kafka"


class _BatchHandler:
    """Per-TP delivery: the stock handler for single messages, plus a batch path.

    The batch path does the flow-control/producer-ebb awaits once per batch and
    then decodes + enqueues each record without suspending, unless a channel
    queue is full (then it awaits ``chan.put`` like the stock handler).
    """

    __slots__ = (
        "acquire_flow_control",
        "app",
        "channels",
        "consumer",
        "event_cls",
        "flow_is_active",
        "on_pressure_drop",
        "on_pressure_high",
        "on_topic_buffer_full",
        "single",
        "tp",
        "wait_until_producer_ebb",
    )

    def __init__(
        self, conductor: BatchConductor, tp: TP, channels: MutableSet[TopicT], single: Any
    ) -> None:
        app = conductor.app
        self.tp = tp
        self.channels = channels
        # Stock (cython when built) handler: keeps ``__call__`` byte-for-byte faust.
        self.single = single
        self.app = app
        # Settings attribute access is slow; resolve the Event class once.
        self.event_cls: Any = app.conf.Event
        self.consumer = app.consumer
        self.acquire_flow_control = app.flow_control.acquire
        self.flow_is_active = app.flow_control.is_active
        self.wait_until_producer_ebb = app.producer.buffer.wait_until_ebb
        self.on_topic_buffer_full = app.sensors.on_topic_buffer_full
        consumer = app.consumer

        # Same pressure callbacks as faust's handler: pause fetching this TP
        # while a stream queue is nearly full, resume once it drains.
        def on_pressure_high() -> None:
            self.on_topic_buffer_full(tp)
            consumer.on_buffer_full(tp)

        def on_pressure_drop() -> None:
            consumer.on_buffer_drop(tp)

        self.on_pressure_high = on_pressure_high
        self.on_pressure_drop = on_pressure_drop

    async def __call__(self, message: Message) -> None:
        await self.single(message)

    async def deliver_batch(
        self, messages: Sequence[Message], read_offset: MutableMapping[TP, int | None]
    ) -> None:
        """Deliver ``messages`` (one TP, ascending offsets) to every subscribed channel.

        ``read_offset`` is updated per delivered record so that a cancellation
        (``suspend_flow``) mid-batch leaves it pointing at the last one delivered.
        """
        await self.acquire_flow_control()
        await self.wait_until_producer_ebb()
        channels = self.channels
        if len(channels) == 1:
            (chan,) = channels
            if _decodes_as_raw(chan, self.app):
                await self._deliver_raw(messages, chan, read_offset)
                return
        tp = self.tp
        flow_is_active = self.flow_is_active
        on_high = self.on_pressure_high
        on_drop = self.on_pressure_drop
        for message in messages:
            if not flow_is_active():
                # Flow was suspended by a slow path below; honour it like faust does.
                await self.acquire_flow_control()
            n = len(channels)
            if n:
                message.incref(n)
                slow = await self._deliver_one(message, channels, on_high, on_drop)
                if slow:
                    # We suspended on a full queue: the world may have changed.
                    await self.wait_until_producer_ebb()
            read_offset[tp] = message.offset

    async def _deliver_raw(
        self, messages: Sequence[Message], chan: TopicT, read_offset: MutableMapping[TP, int | None]
    ) -> None:
        # One raw-bytes topic (the common ingest case): faust's decode would be
        # an identity on key/value, so build the Events directly and enqueue
        # them in bulk.  Only what fits below the queue's maxsize goes in bulk;
        # the rest takes faust's path (await ``chan.put``), record by record.
        tp = self.tp
        app = self.app
        make_event = self.event_cls
        queue = chan.queue
        i = 0
        total = len(messages)
        while i < total:
            if not self.flow_is_active():
                await self.acquire_flow_control()
            room = total - i if queue.maxsize <= 0 else queue.maxsize - queue.qsize()
            if room > 0:
                chunk = messages[i : i + room]
                with ack_lock:  # one acquire for the chunk, not one incref each
                    for message in chunk:
                        message.refcount += 1
                _put_many(
                    queue,
                    [make_event(app, m.key, m.value, m.headers, m) for m in chunk],
                    self.on_pressure_high,
                    self.on_pressure_drop,
                )
                i += len(chunk)
                read_offset[tp] = chunk[-1].offset
            else:
                message = messages[i]
                message.incref(1)
                self.on_topic_buffer_full(tp)
                await chan.put(
                    make_event(app, message.key, message.value, message.headers, message)
                )
                await self.wait_until_producer_ebb()
                read_offset[tp] = message.offset
                i += 1

    async def _deliver_one(
        self, message: Message, channels: MutableSet[TopicT], on_high: Any, on_drop: Any
    ) -> bool:
        # Mirrors ConductorHandler.__call__ minus the per-message awaits;
        # returns True if it had to await a full queue.
        event: _Event | None = None
        event_keyid: tuple[Any, Any] | None = None
        delivered: set[TopicT] = set()
        full: list[tuple[_Event, TopicT]] = []
        try:
            for chan in channels:
                keyid = (chan.key_type, chan.value_type)
                if event is None:
                    dest = event = await chan.decode(message, propagate=True)
                    event_keyid = keyid
                elif keyid == event_keyid:
                    dest = event
                else:
                    dest = await chan.decode(message, propagate=True)
                queue = chan.queue
                if queue.full():
                    full.append((dest, chan))
                    continue
                queue.put_nowait_enhanced(dest, on_pressure_high=on_high, on_pressure_drop=on_drop)
                delivered.add(chan)
            for dest, chan in full:
                self.on_topic_buffer_full(self.tp)
                await chan.put(dest)
                delivered.add(chan)
        except KeyDecodeError as exc:
            remaining = set(channels) - delivered
            message.ack(self.consumer, n=len(remaining))
            for chan in remaining:
                await chan.on_key_decode_error(exc, message)
            return True
        except ValueDecodeError as exc:
            remaining = set(channels) - delivered
            message.ack(self.consumer, n=len(remaining))
            for chan in remaining:
                await chan.on_value_decode_error(exc, message)
            return True
        return bool(full)


def _put_many(queue: Any, events: list[_Event], on_high: Any, on_drop: Any) -> None:
    """``put_nowait_enhanced`` for each event, with the per-put bookkeeping done once.

    Caller guarantees the events fit below ``maxsize``.  Uses the same
    asyncio.Queue internals as mode's ``FlowControlQueue.force_put_nowait``.
    """
    last = events.pop()
    if events:
        queue._queue.extend(events)
        queue._unfinished_tasks += len(events)
        getters = queue._getters
        for _ in range(min(len(events), len(getters))):
            queue._wakeup_next(getters)
    # The last one goes through mode: pressure check (pauses the TP), counters, wakeup.
    queue.put_nowait_enhanced(last, on_pressure_high=on_high, on_pressure_drop=on_drop)


def _drain_nowait(queue: Any, items: list[Any], max_items: int) -> None:
    """Move up to ``max_items - len(items)`` queued items into ``items``.

    Same effect as that many ``get_nowait()`` calls on a mode FlowControlQueue,
    with its bookkeeping (wake putters, pressure-drop callbacks) done once.
    """
    take = min(max_items - len(items), queue.qsize())
    if take <= 0:
        return
    buf = queue._queue
    pop = buf.popleft
    items.extend([pop() for _ in range(take)])
    putters = queue._putters
    for _ in range(min(take, len(putters))):
        queue._wakeup_next(putters)
    pending = getattr(queue, "_pending_pressure_drop_callbacks", None)
    # get_nowait endorses at most one pressure drop per item; resumes the TPs
    # paused by _put_many once the queue has drained enough.
    for _ in range(min(take, len(pending or ()))):
        queue.maybe_endorse_pressure_drop()


def _decodes_as_raw(chan: TopicT, app: AppT) -> bool:
    """True if faust would decode ``chan``'s records to the Kafka bytes unchanged.

    Only stock faust classes qualify (a subclass could override decoding), with
    no key/value model type and the ``raw`` codec for both key and value.
    """
    schema = getattr(chan, "schema", None)
    registry = app.serializers
    if type(chan) is not Topic or type(schema) is not Schema or type(registry) is not Registry:
        return False
    assert schema is not None
    if schema.key_type not in (None, bytes) or schema.value_type not in (None, bytes):
        return False
    key_ser = schema.key_serializer or registry.key_serializer
    value_ser = schema.value_serializer or registry.value_serializer
    return key_ser == "raw" and value_ser == "raw"


class BatchConductor(_conductor.Conductor):
    """Conductor whose per-TP handlers can also take a whole batch."""

    def _build_handler(self, tp: TP, channels: MutableSet[Topic]) -> ConsumerCallback:
        single = super()._build_handler(tp, channels)
        return cast(
            ConsumerCallback,
            _BatchHandler(self, tp, cast(MutableSet[TopicT], channels), single),
        )

    async def batch_handler_for(self, tp: TP) -> _BatchHandler | None:
        """Return the handler for ``tp`` (under the index lock, as ``on_message`` does)."""
        async with self._tp_to_callback_lock:
            handler = self._tp_to_callback.get(tp)
        return handler if isinstance(handler, _BatchHandler) else None


class BatchConsumerThread(_aiokafka.AIOKafkaConsumerThread):
    """Consumer thread with a short broker long-poll.

    faust hard-codes ``fetch_max_wait_ms=1500``.  aiokafka keeps one fetch in
    flight per broker and only fetches partitions with nothing buffered, so
    once an idle partition (e.g. faust's ``__assignor-__leader``) is polled
    alone, the busy partitions wait out that long-poll after being drained:
    ~1 s stalls every few batches once delivery stops being the bottleneck.
    """

    #: Broker long-poll; bounds how long drained partitions can wait to be refetched.
    fetch_max_wait_ms: int = 100

    def _create_worker_consumer(self, transport: _aiokafka.Transport) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # Read by AIOKafkaConsumer.start() when it builds its Fetcher.
        consumer._fetch_max_wait_ms = self.fetch_max_wait_ms
        return consumer


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

    async def _admit(self, tp: TP, recs: Iterable[Any]) -> list[Message]:
        # Read-offset filter and gap tracking, exactly as the stock loop computes
        # them, but against a running local offset instead of the dict per record.
        to_message = self._to_message
        r_offset = self._read_offset[tp]
        acks_enabled = self.app.topics.acks_enabled_for(tp.topic)
        out: list[Message] = []
        for record in recs:
            offset = record.offset
            if r_offset is None or offset >= r_offset:
                gap = offset - (r_offset or 0)
                if gap > 1 and r_offset and acks_enabled:
                    await self._add_gap(tp, r_offset + 1, offset)
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


class Transport(_aiokafka.Transport):
    """aiokafka transport using :class:`BatchConsumer` and :class:`BatchConductor`."""

    Consumer = BatchConsumer
    Conductor = BatchConductor


def register_scheme() -> None:
    """Register ``aistack-kafka://`` in faust's transport registry (idempotent)."""
    TRANSPORTS.aliases.setdefault(SCHEME, f"{__name__}:Transport")


async def take_batch(
    queue: asyncio.Queue[Any],
    max_items: int,
    within_seconds: float,
    *,
    app: AppT | None = None,
) -> list[_Event]:
    """Return 1..``max_items`` events from a channel queue (``stream.channel.queue``).

    Awaits the first event, then drains with ``get_nowait``; only when the
    queue runs dry before ``max_items`` does it wait (one future per dry spell,
    never per event) until ``within_seconds`` after the first event.

    With ``app`` it also does what ``Stream`` does per event: events from a
    stale generation or fetched while flow control is suspended are acked and
    dropped, and the rest are tracked as unacked (so rebalance waits for them).
    """
    while True:
        items: list[_Event] = [await queue.get()]
        # A ThrowableQueue error must surface on the next call, not eat this batch.
        errors = getattr(queue, "_errors", None)
        bulk = isinstance(queue, FlowControlQueue)
        deadline = monotonic() + within_seconds
        while len(items) < max_items and not errors:
            if bulk:
                _drain_nowait(queue, items, max_items)
            else:
                try:
                    while len(items) < max_items:
                        items.append(queue.get_nowait())
                except asyncio.QueueEmpty:
                    pass
            if len(items) >= max_items:
                break
            remaining = deadline - monotonic()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    items.append(await queue.get())
            except TimeoutError:
                break
        if app is None:
            return items
        admitted = _admit_events(items, app)
        if admitted:
            return admitted


def _admit_events(events: list[_Event], app: AppT) -> list[_Event]:
    # Inline of Stream._py_aiter's per-event checks and Consumer.track_message.
    consumer = app.consumer
    generation_id = app.consumer_generation_id
    flow_active = app.flow_control.is_active()
    acking_topics = app.topics.acking_topics
    unacked = consumer.unacked
    on_message_in = app.sensors.on_message_in
    out: list[_Event] = []
    for event in events:
        message = event.message
        if not flow_active or message.generation_id != generation_id:
            message.ack(consumer)
            continue
        if not message.tracked and message.topic in acking_topics:
            message.tracked = True
            unacked.add(message)
            on_message_in(message.tp, message.offset, message)
        out.append(event)
    return out


def batch_gate(app: AppT) -> asyncio.Lock:
    """The lock that keeps ``app``'s offset commits out of a batch in progress."""
    consumer = app.consumer
    if not isinstance(consumer, BatchConsumer):
        raise RuntimeError(f"batch_gate needs the {SCHEME}:// transport")
    return consumer.batch_gate


def ack_batch(events: Iterable[_Event], app: AppT) -> int:
    """Ack every event once processed; returns how many became committable.

    Offsets then go through faust's normal commit machinery (commit interval,
    ``commit_every``, and the transaction manager under exactly_once).
    """
    consumer = app.consumer
    on_message_out = app.sensors.on_message_out
    n = 0
    for event in events:
        message = event.message
        if message.ack(consumer):
            n += 1
            on_message_out(message.tp, message.offset, message)
    return n


register_scheme()
