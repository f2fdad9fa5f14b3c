"""Duplicate detection by event id within a time window, kept in a key-value store.

The ids a batch accepts from one raw partition are stored together, as one
entry (``{partition}/{first offset}`` → packed ids and first-seen times): one
store write and one changelog record per batch and partition, not per event,
which is most of the cost of a table at tens of thousands of events a second.
Lookups go to an in-memory index of the same ids (``IdIndex``: hashes in
flat arrays, not a dict), rebuilt from the store after a restore
(``rebuild``). Each stored group's keys in that index are kept beside it, so
that expiring a group reads nothing back from the store: in steady state the
store is only written (RocksDB's block cache would otherwise fill with every
group read back a window later). svc_ingest backs the store with a Faust table,
so it survives restarts through the table's changelog.

A new id is first *pending*: it reaches the store only once the outputs it
vouches for are sent (``take_sightings``). Marking it earlier would, after a
crash in between, turn the redelivered record into a "duplicate" of an output
that never left: a loss.
"""

from __future__ import annotations

import struct
from array import array
from collections import deque
from collections.abc import Iterator, MutableMapping
from contextlib import suppress
from dataclasses import dataclass, field

import numpy as np

from svc_ingest.id_index import IdIndex, Index, id_key

_ENTRY = struct.Struct(">QH")  # first-seen ms, id length; the id follows


def pack(entries: list[tuple[bytes, int]]) -> bytes:
    return b"".join(_ENTRY.pack(ms, len(event_id)) + event_id for event_id, ms in entries)


def unpack(raw: bytes) -> Iterator[tuple[bytes, int]]:
    at = 0
    while at < len(raw):
        ms, size = _ENTRY.unpack_from(raw, at)
        at += _ENTRY.size
        yield raw[at : at + size], ms
        at += size


def group_key(partition: int, first_offset: int) -> bytes:
    return f"{partition}/{first_offset}".encode()


def group_partition(key: bytes) -> int:
    return int(key.split(b"/", 1)[0])


@dataclass(slots=True)
class Sightings:
    """The new ids of one batch on one partition: one store entry."""

    key: bytes
    partition: int
    entries: list[tuple[bytes, int]] = field(default_factory=list)
    # Each entry's key in the index, in the same order.
    id_keys: list[int] = field(default_factory=list)
    # The packed entries, set when the group is taken for writing.
    value: bytes = b""


#: One batch's pending ids, by source partition.
PendingIds = dict[int, Sightings]


class DedupWindow:
    """Remembers event ids for ``window_ms`` after they are first seen."""

    def __init__(self, store: MutableMapping[bytes, bytes], window_ms: int) -> None:
        self._store = store
        self._window_ms = window_ms
        # id → first-seen ms, the pending ids too: one probe an event decides
        # and holds it, and a repeat within the batch finds it there.
        self._seen: Index = IdIndex()
        self._pending: PendingIds = {}
        self._expiry: deque[_StoredGroup] = deque()  # oldest first

    def first_sighting(self, event_id: bytes, now_ms: int, partition: int, offset: int) -> bool:
        """True if ``event_id`` was not seen within the window; it is then pending."""
        key = self._seen.claim(event_id, now_ms, self._window_ms)
        if not key:
            return False
        group = self._pending.get(partition)
        if group is None:
            group = self._pending[partition] = Sightings(group_key(partition, offset), partition)
        group.entries.append((event_id, now_ms))
        group.id_keys.append(key)
        return True

    def detach_pending(self) -> PendingIds:
        """The ids pending so far, as one batch's, for ``take_sightings`` or
        ``discard_pending`` later: the ids a later batch adds meanwhile are not
        among them."""
        detached, self._pending = self._pending, {}
        return detached

    def take_sightings(self, pending: PendingIds | None = None) -> list[Sightings]:
        """The pending groups (``pending``, else all not detached), remembered
        from now on; the caller writes them to the store's changelog (this
        writes the local store)."""
        if pending is None:
            pending = self.detach_pending()
        taken = list(pending.values())
        pending.clear()  # taken: nothing of it is left to discard
        for group in taken:
            group.value = pack(group.entries)
            self._store[group.key] = group.value
            times = array("q", [ms for _, ms in group.entries])
            self._expiry.append(
                _StoredGroup(max(times), group.key, array("Q", group.id_keys), times)
            )
        return taken

    def discard_pending(self, pending: PendingIds | None = None) -> None:
        """Forget the pending ids (``pending``, else all not detached): their
        batch failed and will be redelivered."""
        if pending is None:
            pending = self.detach_pending()
        forget = self._seen.remove_if_seen_at
        for group in pending.values():
            for key, (_, ms) in zip(group.id_keys, group.entries, strict=True):
                forget(key, ms)

    def expire(self, now_ms: int) -> list[tuple[bytes, int]]:
        """Forget groups whose newest id is more than a window old; returns the
        (store key, partition) of each, for the caller to write tombstones."""
        horizon = now_ms - self._window_ms
        expired: list[tuple[bytes, int]] = []
        forget = self._seen.remove_if_seen_at
        while self._expiry and self._expiry[0].newest_ms < horizon:
            group = self._expiry.popleft()
            for key, ms in zip(group.id_keys, group.times, strict=True):
                forget(key, ms)
            # A delete, not a pop: a pop reads the value back first.
            with suppress(KeyError):
                del self._store[group.key]
            expired.append((group.key, group_partition(group.key)))
        return expired

    def rebuild(self) -> int:
        """Reload the index from the store (after a restore or a rebalance);
        returns how many ids it holds. An id in several groups is held at
        its latest time; each group keeps all of its own, for its expiry."""
        groups = []
        all_keys = array("Q")
        all_times = array("q")
        for store_key, raw in self._store.items():
            entries = list(unpack(raw))
            id_keys = array("Q", [id_key(event_id) for event_id, _ in entries])
            times = array("q", [ms for _, ms in entries])
            groups.append(_StoredGroup(max(times, default=0), store_key, id_keys, times))
            all_keys.extend(id_keys)
            all_times.extend(times)
        self._seen = IdIndex.of(
            np.array(all_keys, dtype=np.uint64), np.array(all_times, dtype=np.int64)
        )
        self._expiry = deque(sorted(groups, key=lambda group: group.newest_ms))
        return len(self._seen)


@dataclass(slots=True, frozen=True)
class _StoredGroup:
    """A group in the store, as the index holds it: what expiring it forgets."""

    newest_ms: int
    key: bytes
    id_keys: array[int]
    times: array[int]
