"""Features by entity: a request names an entity instead of sending a tensor.

svc_transform keeps each entity's latest closed window per (metric,
dimensions, window kind) in one Redis hash, ``<prefix><entity id>``, field
``<metric>[|path=<path>]@<window>``, value a JSON object of the window's
statistics. A model trained on the offline store's windows (svc_trainer's
"features" dataset) takes those statistics in ``FEATURE_STATS`` order, oldest
window first; the online store holds the latest window only, so it can feed
models trained with one lag.

Request parameters (Open Inference Protocol ``parameters``, strings):

- ``entity_id`` — whose features;
- ``feature`` — the online-store field, e.g. ``temperature@tumbling-60s``
  (defaults to the model's ``feature`` label when svc_trainer set one).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import redis.asyncio
from numpy.typing import NDArray

from shared.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable

#: The window statistics a feature model reads, in svc_trainer's order.
FEATURE_STATS = ("mean", "stddev", "min", "max", "count", "p50", "p95")
ENTITY_PARAMETER = "entity_id"
FEATURE_PARAMETER = "feature"
FEATURE_LABEL = "feature"


def feature_row(window: dict[str, Any], width: int, field: str) -> NDArray[np.float32]:
    """One model input row from a window's JSON object."""
    if width != len(FEATURE_STATS):
        raise FailedPrecondition(
            f"the model takes {width} features; the online store gives one window's "
            f"{len(FEATURE_STATS)} statistics ({', '.join(FEATURE_STATS)}): only models "
            "trained with one lag can be fed by entity"
        )
    values = []
    for stat in FEATURE_STATS:
        value = window.get(stat)
        values.append(np.nan if value is None else float(value))
    row = np.asarray(values, dtype=np.float32)
    if np.isnan(row).any():
        missing = [s for s, v in zip(FEATURE_STATS, row, strict=True) if np.isnan(v)]
        raise FailedPrecondition(f"window {field} lacks the statistics {missing}")
    return row


class OnlineFeatures:
    def __init__(self, client: redis.asyncio.Redis, key_prefix: str) -> None:
        self._client = client
        self._prefix = key_prefix

    async def row(self, entity_id: str, field: str, width: int) -> NDArray[np.float32]:
        """The entity's latest window of ``field`` as one row of ``width`` features.

        Raises InvalidArgument (empty ids), NotFound (no such entity or window),
        FailedPrecondition (a model the store cannot feed), Unavailable (Redis)."""
        if not entity_id:
            raise InvalidArgument(f"parameter {ENTITY_PARAMETER!r} is empty")
        if not field:
            raise InvalidArgument(
                f"parameter {FEATURE_PARAMETER!r} is needed: which online-store field "
                "(e.g. temperature@tumbling-60s) to read"
            )
        key = f"{self._prefix}{entity_id}"
        try:
            raw = await self._client.hget(key, field)
        except redis.RedisError as exc:
            raise Unavailable(f"online store: {exc}") from exc
        if raw is None:
            raise NotFound(f"no window {field!r} for entity {entity_id!r} in the online store")
        try:
            window = json.loads(raw)
        except ValueError as exc:
            raise FailedPrecondition(f"window {field!r} of {entity_id!r} is not JSON") from exc
        return feature_row(window, width, field)

    async def close(self) -> None:
        await self._client.aclose()
