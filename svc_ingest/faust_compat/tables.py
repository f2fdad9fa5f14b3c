"""A Faust table's local store as a plain mapping, and its changelog offsets.

svc_ingest writes the dedup table's changelog itself (in the batch's
transaction), so it also does what Faust's changelog callback would: record
the offsets that table recovery starts reading from.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from faust.streams import _current_event
from faust.types import TP, AppT, TableT

__all__ = ["TableStore", "persist_changelog_offsets"]


def persist_changelog_offsets(
    app: AppT,
    table: TableT[Any, Any],
    written: Iterable[Any],
    *,
    exactly_once: bool,
) -> None:
    """What Faust's own changelog callback does: RocksDB recovery starts after these.

    ``written`` is the RecordMetadata of what was sent; only the table's
    changelog counts. Under exactly_once the offsets are stored when Faust
    commits the transaction, not now: an aborted one must not move them.
    """
    changelog = table.changelog_topic.get_topic_name()
    newest: dict[TP, int] = {}
    for metadata in written:
        if metadata.topic != changelog:
            continue
        tp = TP(metadata.topic, metadata.partition)
        newest[tp] = max(newest.get(tp, -1), metadata.offset)
    store: Any = table.data  # a faust StoreT; TableT types it as a MutableMapping
    for tp, offset in newest.items():
        if exactly_once:
            app.tables.persist_offset_on_commit(store, tp, offset)
        else:
            store.set_persisted_offset(tp, offset)


class TableStore(MutableMapping[bytes, bytes]):
    """A Faust table's local store as the dedup store; the changelog is written apart.

    Keys name their partition (``partition_of(key)``): a RocksDB store keeps
    one database per partition and finds it through Faust's current event.
    """

    def __init__(self, table: TableT[Any, Any], partition_of: Callable[[bytes], int]) -> None:
        self._data = table.data
        self._partition_of = partition_of

    def __getitem__(self, key: bytes) -> bytes:
        with _in_partition(self._partition_of(key)):
            value = self._data.get(key)
        if value is None:
            raise KeyError(key)
        return value  # type: ignore[no-any-return]

    def __setitem__(self, key: bytes, value: bytes) -> None:
        with _in_partition(self._partition_of(key)):
            self._data[key] = value

    def __delitem__(self, key: bytes) -> None:
        with _in_partition(self._partition_of(key)):
            del self._data[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(list(self._data.keys()))

    def __len__(self) -> int:
        return len(self._data)


@dataclass(frozen=True)
class _PartitionMessage:
    partition: int


@dataclass(frozen=True)
class _PartitionEvent:
    """Just enough of a Faust event for a store to pick the partition's database."""

    message: _PartitionMessage


@contextmanager
def _in_partition(partition: int) -> Iterator[None]:
    event = _PartitionEvent(_PartitionMessage(partition))
    token = _current_event.set(weakref.ref(event))  # type: ignore[arg-type]
    try:
        yield
    finally:
        _current_event.reset(token)
