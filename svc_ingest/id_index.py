"""Event ids and when each was first seen, in two flat arrays instead of a dict.

At 2,000 events a second a 600 s dedup window holds 1.2 million ids. Kept as a
dict of ``bytes`` → ``int`` that is about 130 MB of small objects, and a dict
that churns (ids in, ids out) resizes once more after the window first fills:
svc_ingest's memory grew 1.24 to 1.30 times after the warm-up of a 30-minute
soak (``bench.soak``; its goal is 1.2). Here an id is held as its 64-bit hash in an
open-addressing table with linear probing, its first-seen time beside it: 16
bytes a slot, 64 MB for 1.2 million ids. Removing an id shifts the rest of its
run back (no tombstones), so the table's size follows the most ids ever held
at once and stays put once the window is full.

The hash is Python's own of ``bytes`` (SipHash, keyed afresh in every
process), so nobody can choose ids that collide; the table is rebuilt from the
dedup store's full ids after every restart. Two ids that do share a hash look
like one: with a million ids held, about one event in 10^13 would be taken for
a duplicate of another.

``IdIndex`` is the compiled table (``_id_table.c``, built by ``make setup``
with the cleaner's compiled path): the same table, field for field, where a
claim costs 0.14 µs against the Python class's 0.55, on the worker's path for
every event. ``PythonIdIndex`` is what serves where it is not built, and the
reference the tests hold the compiled table to.
"""

from __future__ import annotations

from array import array
from typing import Any, Protocol

import numpy as np

_MASK64 = (1 << 64) - 1
_EMPTY = 0
# 1 MiB: a second of a busy stream without a resize.
_MIN_SLOTS = 1 << 16
# Linear probing slows sharply as the table fills (an absent id, the common
# case, probes (1 + 1/(1-a)^2) / 2 slots on average: 2.5 at a half, 6 at 0.7),
# and each probe is a turn of a Python loop.
_MAX_LOAD_TENTHS = 5


def id_key(event_id: bytes) -> int:
    """The table's key of ``event_id``: its hash, never the empty marker."""
    return (hash(event_id) & _MASK64) or 1


class PythonIdIndex:
    """Event id → first-seen milliseconds, for up to half as many ids as slots before
    the table doubles; it never shrinks."""

    __slots__ = ("_count", "_keys", "_limit", "_mask", "_times")

    def __init__(self, slots: int = _MIN_SLOTS) -> None:
        if slots < 1 or slots & (slots - 1):
            raise ValueError(f"slots must be a power of two, got {slots}")
        self._count = 0
        self._allocate(slots)

    def __len__(self) -> int:
        return self._count

    @property
    def slots(self) -> int:
        return self._mask + 1

    def get(self, event_id: bytes) -> int | None:
        """When ``event_id`` was first seen, or None if it is not held."""
        key = id_key(event_id)
        slot = self._slot(key)
        return self._times[slot] if self._keys[slot] == key else None

    def claim(self, event_id: bytes, ms: int, within_ms: int) -> int:
        """Hold ``event_id`` as first seen at ``ms`` unless it is held as seen
        at most ``within_ms`` before; its key if it was claimed, else 0."""
        # Once per event: id_key and _slot written out, two calls fewer.
        key = (hash(event_id) & _MASK64) or 1
        keys = self._keys
        mask = self._mask
        slot = key & mask
        held = keys[slot]
        while held != key and held != _EMPTY:
            slot = (slot + 1) & mask
            held = keys[slot]
        if held == key:
            if ms - self._times[slot] <= within_ms:
                return 0
            self._times[slot] = ms
            return key
        keys[slot] = key
        self._times[slot] = ms
        self._count += 1
        if self._count > self._limit:
            self._resize(self.slots * 2)
        return key

    def remove_if_seen_at(self, key: int, ms: int) -> bool:
        """Forget the id of ``key`` (as ``claim`` returned it) if it is held as
        first seen at ``ms`` (a later sighting has a newer group of its own,
        which forgets it in turn)."""
        slot = self._slot(key)
        if self._keys[slot] != key or self._times[slot] != ms:
            return False
        self._remove_at(slot)
        return True

    def _slot(self, key: int) -> int:
        """Where ``key`` is held, or else the empty slot that ends its probe."""
        keys = self._keys
        mask = self._mask
        slot = key & mask
        held = keys[slot]
        while held != key and held != _EMPTY:
            slot = (slot + 1) & mask
            held = keys[slot]
        return slot

    def _remove_at(self, slot: int) -> None:
        # Backward-shift deletion: each later key of the run that may sit in
        # the hole (its home slot is not between the hole and where it is)
        # moves into it, so every probe still finds its key before an empty slot.
        keys = self._keys
        times = self._times
        mask = self._mask
        hole = slot
        at = slot
        while True:
            at = (at + 1) & mask
            held = keys[at]
            if held == _EMPTY:
                break
            if (at - (held & mask)) & mask >= (at - hole) & mask:
                keys[hole] = held
                times[hole] = times[at]
                hole = at
        keys[hole] = _EMPTY
        times[hole] = 0
        self._count -= 1

    def _allocate(self, slots: int) -> None:
        self._keys = array("Q", [_EMPTY]) * slots
        self._times = array("q", [0]) * slots
        self._mask = slots - 1
        self._limit = slots * _MAX_LOAD_TENTHS // 10

    @classmethod
    def of(cls, keys: np.ndarray[Any, Any], times: np.ndarray[Any, Any]) -> PythonIdIndex:
        """An index of ``keys`` (``id_key``'s, as uint64) each held at its
        latest time in ``times`` (int64): a rebuild's million ids at once."""
        order = np.lexsort((times, keys))
        keys, times = keys[order], times[order]
        latest = np.ones(len(keys), dtype=bool)
        latest[:-1] = keys[1:] != keys[:-1]
        slots = _MIN_SLOTS
        while int(latest.sum()) > slots * _MAX_LOAD_TENTHS // 10:
            slots *= 2
        index = cls(slots)
        index._place(keys[latest], times[latest])
        return index

    def _resize(self, slots: int) -> None:
        held = np.frombuffer(self._keys, dtype=np.uint64)
        live = held != _EMPTY
        keys = held[live]
        times = np.frombuffer(self._times, dtype=np.int64)[live]
        del held  # a view holds the array's buffer
        self._allocate(slots)
        self._place(keys, times)

    def _place(self, keys: np.ndarray[Any, Any], times: np.ndarray[Any, Any]) -> None:
        """Hold distinct ``keys`` in the table, empty before.

        Vectorised: a Python loop over a million keys stalls the worker for
        a fifth of a second. In order of home slot, each key goes to the
        first free slot at or after its home: with ranks i, that is
        i + max over j <= i of (home_j - j). Keys pushed past the end wrap
        round: they are placed one by one, as ``claim`` would.
        """
        slots = self.slots
        home = (keys & np.uint64(slots - 1)).astype(np.int64)
        order = np.argsort(home)
        keys, times, home = keys[order], times[order], home[order]
        rank = np.arange(len(home), dtype=np.int64)
        at = rank + np.maximum.accumulate(home - rank)
        inside = at < slots
        new_keys = np.frombuffer(self._keys, dtype=np.uint64)
        new_keys[at[inside]] = keys[inside]
        np.frombuffer(self._times, dtype=np.int64)[at[inside]] = times[inside]
        del new_keys
        for key, ms in zip(keys[~inside].tolist(), times[~inside].tolist(), strict=True):
            slot = self._slot(key)
            self._keys[slot] = key
            self._times[slot] = ms
        self._count = len(keys)


class Index(Protocol):
    """What ``IdIndex`` is, compiled or not."""

    def __len__(self) -> int: ...
    @property
    def slots(self) -> int: ...
    def get(self, event_id: bytes) -> int | None: ...
    def claim(self, event_id: bytes, ms: int, within_ms: int) -> int: ...
    def remove_if_seen_at(self, key: int, ms: int) -> bool: ...


try:
    from svc_ingest import _id_table  # type: ignore[attr-defined]
except ImportError:  # not built: the Python table serves
    _id_table = None

#: Whether the compiled table is built (``make setup``).
BUILT = _id_table is not None
#: ``IdIndex(slots=…)``, ``IdIndex.of(keys, times)``: the compiled table where built.
IdIndex: Any = PythonIdIndex if _id_table is None else _id_table.IdTable
