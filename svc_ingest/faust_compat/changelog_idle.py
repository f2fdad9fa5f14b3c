"""How long table recovery waits on a quiet changelog before it asks where the read is.

Under exactly_once every changelog ends in a transaction marker (and, after a
kill -9, in the records of the transaction the restarted worker's producer
fenced and aborted): offsets for which no record is ever delivered. Faust's
recovery counts a partition as read once it has delivered the record just
before the highwater, which a transactional changelog never does; so it falls
back on waiting for two 5 s spells of an empty changelog queue, then asks the
consumer's position. That was 10 s of every exactly_once start and restart
(measured: "Restoring state" to "Done reading" 10.1 s for 42 records a
partition).

:func:`shorten` caps each spell at :data:`IDLE_WAIT_SECONDS`. The position
still decides; the two spells stay, as Faust's guard against a record fetched
but not yet queued.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from faust.tables import recovery as _recovery

__all__ = ["IDLE_WAIT_SECONDS", "shorten"]

#: Longest wait on an empty changelog queue before recovery asks the position.
IDLE_WAIT_SECONDS = 1.0

T = TypeVar("T")


class _CappedWaits:
    """``asyncio`` as Faust's recovery module sees it, with ``wait_for`` capped."""

    def __init__(self, cap: float) -> None:
        self.cap = cap

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    def wait_for(self, awaitable: Awaitable[T], timeout: float | None = None) -> Awaitable[T]:
        if timeout is not None:
            timeout = min(timeout, self.cap)
        return asyncio.wait_for(awaitable, timeout)


def shorten(cap: float = IDLE_WAIT_SECONDS) -> None:
    """Cap recovery's idle waits at ``cap`` seconds (idempotent, process-wide)."""
    module: Any = _recovery
    module.asyncio = _CappedWaits(cap)
