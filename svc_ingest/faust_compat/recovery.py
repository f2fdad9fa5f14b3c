"""Highwaters for table recovery that wait for a broker that has just come up.

Faust's recovery reads the changelog partitions' highwaters once and raises
``ConsistencyError`` when a partition's persisted offset (the last changelog
offset the local RocksDB store holds) is past the highwater. Under
exactly_once stock Faust takes the highwater from the last fetch response,
which does not exist yet on a cold start: it reads as -1 ("1176 > -1"), and
the worker dies. A broker that is still loading its logs answers with errors
instead of offsets. Neither says the data is gone; both pass.

:func:`settled_highwaters` therefore reads again, with backoff and a log line
per try, until every partition has a highwater that covers its persisted
offset, or the deadline passes. Then it hands over what it has and Faust's
check judges: a changelog that really lost data still stops the worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from time import monotonic

from aiokafka.errors import KafkaError
from faust.types import TP

from shared.log import get_logger

log = get_logger("svc_ingest")

#: Reads the next offset of each partition (its highwater); None: not known.
HighwaterSource = Callable[[Collection[TP]], Awaitable[Mapping[TP, int | None]]]


@dataclass(frozen=True)
class HighwaterWait:
    """How long and how often to read again."""

    deadline_seconds: float
    first_backoff_seconds: float = 0.25
    max_backoff_seconds: float = 2.0


def unsettled(
    highwaters: Mapping[TP, int | None],
    partitions: Collection[TP],
    persisted: Mapping[TP, int | None],
) -> list[TP]:
    """Partitions whose highwater is unknown or does not cover the persisted offset.

    A highwater is the *next* offset, so it covers a persisted (last written)
    offset ``p`` when it is at least ``p + 1``: Faust's check, with its -1.
    """
    behind = []
    for tp in partitions:
        highwater = highwaters.get(tp)
        offset = persisted.get(tp)
        if highwater is None or highwater < 0 or (offset is not None and highwater <= offset):
            behind.append(tp)
    return sorted(behind)


async def settled_highwaters(
    read: HighwaterSource,
    partitions: Collection[TP],
    persisted: Mapping[TP, int | None],
    wait: HighwaterWait,
    *,
    clock: Callable[[], float] = monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> Mapping[TP, int | None]:
    """``read(partitions)`` until :func:`unsettled` finds none, or ``wait`` runs out.

    A read that fails with a Kafka error or times out counts as unsettled.
    At the deadline it returns the last answer as it is (Faust's consistency
    check decides), or re-raises the last error when no read ever answered.
    """
    deadline = clock() + wait.deadline_seconds
    backoff = wait.first_backoff_seconds
    attempt = 0
    answer: Mapping[TP, int | None] | None = None
    while True:
        attempt += 1
        error: BaseException | None = None
        try:
            answer = await read(partitions)
            behind = unsettled(answer, partitions, persisted)
        except (KafkaError, TimeoutError) as exc:
            error, behind = exc, sorted(partitions)
        if not behind:
            if attempt > 1:
                log.info("recovery.highwaters_settled", attempts=attempt)
            return answer or {}
        if clock() >= deadline:
            log.warning(
                "recovery.highwaters_unsettled",
                attempts=attempt,
                partitions=_names(behind),
                why="deadline passed: Faust's consistency check decides",
            )
            if answer is None and error is not None:
                raise error
            return answer or {}
        log.warning(
            "recovery.highwaters_retry",
            attempt=attempt,
            partitions=_names(behind),
            highwaters={str(tp): (answer or {}).get(tp) for tp in behind[:8]},
            persisted={str(tp): persisted.get(tp) for tp in behind[:8]},
            error=repr(error) if error is not None else None,
            retry_in=backoff,
        )
        await sleep(min(backoff, max(deadline - clock(), 0.0)))
        backoff = min(backoff * 2, wait.max_backoff_seconds)


def _names(partitions: list[TP]) -> list[str]:
    return [f"{tp.topic}[{tp.partition}]" for tp in partitions[:8]]
