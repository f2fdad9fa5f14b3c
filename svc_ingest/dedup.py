"""Duplicate detection by event id within a time window, kept in a key-value store.

The ids a batch accepts from one raw partition are stored together, as one
entry (``{partition}/{first offset}`` → packed ids and first-seen times): one
store write and one changelog record per batch and partition, not per event,
which is most of the cost of a table at tens of thousands of events a second.
Lookups go to an in-memory index of the same ids, rebuilt from the store
after a restore (``rebuild``). svc_ingest backs the store with a Faust table,
so it survives restarts through the table's changelog.

A new id is first *pending*: it reaches the store only once the outputs it
vouches for are sent (``take_sightings``). Marking it earlier would, after a
crash in between, turn the redelivered record into a "duplicate" of an output
that never left: a loss.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field

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
    # The packed entries, set when the group is taken for writing.
    value: bytes = b""


class DedupWindow:
    """Remembers event ids for ``window_ms`` after they are first seen."""

    def __init__(self, store: MutableMapping[bytes, bytes], window_ms: int) -> None:
        self._store = store
        self._window_ms = window_ms
        self._seen: dict[bytes, int] = {}  # id → first-seen ms
        self._pending: dict[int, Sightings] = {}  # by partition
        self._pending_ids: set[bytes] = set()
        self._expiry: deque[tuple[int, bytes]] = deque()  # (newest ms, store key)

    def first_sighting(self, event_id: bytes, now_ms: int, partition: int, offset: int) -> bool:
        """True if ``event_id`` was not seen within the window; it is then pending."""
        if event_id in self._pending_ids:
            return False
        seen = self._seen.get(event_id)
        if seen is not None and now_ms - seen <= self._window_ms:
            return False
        group = self._pending.get(partition)
        if group is None:
            group = self._pending[partition] = Sightings(group_key(partition, offset), partition)
        group.entries.append((event_id, now_ms))
        self._pending_ids.add(event_id)
        return True

    def take_sightings(self) -> list[Sightings]:
        """The pending groups, remembered from now on; the caller writes them to the
        store's changelog (this writes the local store)."""
        taken = list(self._pending.values())
        self._pending = {}
        self._pending_ids = set()
        for group in taken:
            group.value = pack(group.entries)
            newest = 0
            for event_id, ms in group.entries:
                self._seen[event_id] = ms
                newest = max(newest, ms)
            self._store[group.key] = group.value
            self._expiry.append((newest, group.key))
        return taken

    def discard_pending(self) -> None:
        """Forget the pending ids: their batch failed and will be redelivered."""
        self._pending = {}
        self._pending_ids = set()

    def expire(self, now_ms: int) -> list[tuple[bytes, int]]:
        """Forget groups whose newest id is more than a window old; returns the
        (store key, partition) of each, for the caller to write tombstones."""
        horizon = now_ms - self._window_ms
        expired: list[tuple[bytes, int]] = []
        while self._expiry and self._expiry[0][0] < horizon:
            _, key = self._expiry.popleft()
            raw = self._store.get(key)
            if raw is None:
                continue
            for event_id, ms in unpack(raw):
                if self._seen.get(event_id) == ms:
                    del self._seen[event_id]
            del self._store[key]
            expired.append((key, group_partition(key)))
        return expired

    def rebuild(self) -> int:
        """Reload the index from the store (after a restore or a rebalance);
        returns how many ids it holds."""
        self._seen = {}
        expiry: list[tuple[int, bytes]] = []
        for key, raw in self._store.items():
            newest = 0
            for event_id, ms in unpack(raw):
                if self._seen.get(event_id, -1) < ms:
                    self._seen[event_id] = ms
                newest = max(newest, ms)
            expiry.append((newest, key))
        self._expiry = deque(sorted(expiry))
        return len(self._seen)
