"""Whole batches in and out of a stream's channel queue.

``Stream`` iteration costs futures and tasks per event; here an agent takes
a batch off its channel with :func:`take_batch` and acks it with
:func:`ack_batch`. The bulk put and get reach into asyncio's ``Queue`` and
mode's ``FlowControlQueue`` internals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, MutableSet, Sequence
from time import monotonic
from typing import Any, NamedTuple, TypeAlias
from weakref import WeakSet, ref

from faust.types import AppT, EventT, Message
from faust.types.tuples import ConsumerMessage, ack_lock
from mode.utils.futures import notify
from mode.utils.queues import FlowControlQueue

__all__ = ["ack_batch", "is_stale", "put_many", "silence_message_hooks", "take_batch"]

Event: TypeAlias = EventT[Any]

#: A sensor's per-message hooks, called for every record in and out.
MESSAGE_HOOKS = ("on_message_in", "on_message_out")


def _silenced(*args: Any) -> None:
    return None


def silence_message_hooks(sensor: Any) -> None:
    """Turn ``sensor``'s per-message hooks off: :func:`take_batch` and
    :func:`ack_batch` then skip it, where Faust's sensor delegate calls every
    sensor's hook for every record (Faust's Monitor keeps statistics there
    that a service may not read)."""
    for name in MESSAGE_HOOKS:
        setattr(sensor, name, _silenced)


def _message_hooks(app: AppT, name: str) -> list[Any]:
    """The app's sensors' hooks ``name`` that are not silenced."""
    hooks = (getattr(sensor, name) for sensor in app.sensors)
    return [hook for hook in hooks if hook is not _silenced]


def put_many(queue: Any, events: list[Event], on_high: Any, on_drop: Any) -> None:
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
    # paused by put_many once the queue has drained enough.
    for _ in range(min(take, len(pending or ()))):
        queue.maybe_endorse_pressure_drop()


async def take_batch(
    queue: asyncio.Queue[Any],
    max_items: int,
    within_seconds: float,
    *,
    app: AppT | None = None,
) -> list[Event]:
    """Return 1..``max_items`` events from a channel queue (``stream.channel.queue``).

    Awaits the first event, then drains with ``get_nowait``; only when the
    queue runs dry before ``max_items`` does it wait (one future per dry spell,
    never per event) until ``within_seconds`` after the first event.

    With ``app`` it also does what ``Stream`` does per event: events from a
    stale generation or fetched while flow control is suspended are acked and
    dropped, and the rest are tracked as unacked (so rebalance waits for them).
    """
    while True:
        items: list[Event] = [await queue.get()]
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


def _admit_events(events: list[Event], app: AppT) -> list[Event]:
    # Inline of Stream._py_aiter's per-event checks and Consumer.track_message.
    consumer = app.consumer
    generation_id = app.consumer_generation_id
    flow_active = app.flow_control.is_active()
    acking_topics = app.topics.acking_topics
    unacked = consumer.unacked
    weak = _weak_data(unacked)
    hooks = _message_hooks(app, "on_message_in")
    out: list[Event] = []
    for event in events:
        message = event.message
        if not flow_active or message.generation_id != generation_id:
            message.ack(consumer)
            continue
        if not message.tracked and message.topic in acking_topics:
            message.tracked = True
            if weak is not None:
                weak.data.add(ref(message, weak.on_gone))
            else:
                unacked.add(message)
            for hook in hooks:
                hook(message.tp, message.offset, message)
        out.append(event)
    return out


def ack_batch(events: Iterable[Event], app: AppT) -> int:
    """Ack every event once processed; returns how many became committable.

    Offsets then go through faust's normal commit machinery (commit interval,
    ``commit_every``, and the transaction manager under exactly_once).

    What ``Message.ack`` and ``Consumer.ack`` do for each event, under one
    acquire of faust's ``ack_lock`` for the batch and one wake-up of a
    waiter for acks, where faust takes the lock three times an event and
    wakes once each: the same messages acked, the same offsets committable,
    in the same order. A message of a subclass that acks its own way goes
    through its own ``ack``.
    """
    consumer: Any = app.consumer
    hooks = _message_hooks(app, "on_message_out")
    acks_enabled_for = app.topics.acks_enabled_for
    committed_offsets = consumer._committed_offset
    acked_indexes = consumer._acked_index
    acked_lists = consumer._acked
    unacked = consumer._unacked_messages
    weak = _weak_data(unacked)
    n = own = 0
    with ack_lock:
        try:
            for event in events:
                message = event.message
                if type(message) is not ConsumerMessage:
                    if message.ack(consumer):  # counted in _n_acked by its consumer
                        own += 1
                        _message_out(hooks, message)
                    continue
                if message.acked:
                    continue
                # Message.decref; at no references left, on_final_ack is
                # Consumer.ack.
                refcount = message.refcount = max(message.refcount - 1, 0)
                if refcount:
                    continue
                message.acked = True
                if not acks_enabled_for(message.topic):
                    continue
                tp = message.tp
                offset = message.offset
                committed = committed_offsets[tp]
                if committed is not None and offset < committed:
                    continue
                acked_index = acked_indexes[tp]
                if offset in acked_index:
                    continue
                if weak is not None:
                    weak.data.discard(ref(message))
                else:
                    unacked.discard(message)
                acked_index.add(offset)
                acked_lists[tp].append(offset)
                n += 1
                if hooks:
                    _message_out(hooks, message)
        finally:
            consumer._n_acked += n
            if consumer._waiting_for_ack is not None:
                notify(consumer._waiting_for_ack)
    return n + own


class _WeakData(NamedTuple):
    """The insides of a ``WeakSet``: its set of weak references, and the
    callback each carries that removes it once its message is gone."""

    data: set[Any]
    on_gone: Any


def _weak_data(messages: MutableSet[Message]) -> _WeakData | None:
    """The insides of Faust's ``WeakSet`` of unacked messages, its pending
    removals committed, or None for another set.

    Per message, ``data.add(ref(message, on_gone))`` is what the WeakSet's
    ``add`` does and ``data.discard(ref(message))`` its ``discard``, each
    without the Python call around it (a fifth of a µs a message, both
    ways)."""
    if type(messages) is not WeakSet:
        return None
    weak: Any = messages
    if weak._pending_removals:
        weak._commit_removals()
    return _WeakData(weak.data, weak._remove)


def _message_out(hooks: list[Any], message: Message) -> None:
    for hook in hooks:
        hook(message.tp, message.offset, message)


def is_stale(events: Sequence[Event], app: AppT) -> bool:
    """Whether ``events`` (one ``take_batch``'s) were fetched in a consumer
    generation before the current one: a rebalance came since. A batch's
    events share the generation they were admitted in, so the first's is
    every one's."""
    return bool(events) and events[0].message.generation_id != app.consumer_generation_id
