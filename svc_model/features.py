"""Features by entity: a request names an entity instead of sending a tensor.

svc_transform keeps each entity's latest closed window per (metric,
dimensions, window kind) in the online store (``shared.feature_store``: one
Redis hash per entity, a field per window kind, FeatureWindow bytes). A model
trained on the offline store's windows (svc_trainer's "features" dataset)
takes their statistics in ``FEATURE_STATS`` order, oldest window first; the
online store holds the latest window only, so it can feed models trained with
one lag.

Request parameters (Open Inference Protocol ``parameters``, strings):

- ``entity_id`` — whose features;
- ``feature`` — the online-store field, e.g. ``temperature@tumbling-60s``
  (defaults to the model's ``feature`` label when svc_trainer set one);
- ``window`` — ``closed`` (the default: the latest closed window, what the
  model was trained on) or ``open``: the running aggregate of the window that
  counts the entity's latest reading (``shared.feature_store.open_field``),
  for a model that should see the last second's data.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import redis.asyncio
from numpy.typing import NDArray

from shared.contracts.aistack.v1.features_pb2 import FeatureWindow
from shared.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from shared.feature_store import (
    FEATURE_STATS,
    decode_window,
    online_key,
    open_field,
    window_stats,
)

ENTITY_PARAMETER = "entity_id"
FEATURE_PARAMETER = "feature"
WINDOW_PARAMETER = "window"
WINDOWS = ("closed", "open")


def window_field(field: str, window: str) -> str:
    """The online-store field to read for ``field`` and the ``window`` parameter."""
    if window not in WINDOWS:
        raise InvalidArgument(
            f"parameter {WINDOW_PARAMETER!r} is {window!r}: one of {', '.join(WINDOWS)}"
        )
    return open_field(field) if window == "open" and field else field


def feature_row(window: FeatureWindow, width: int, field: str) -> NDArray[np.float32]:
    """One model input row from a window."""
    if width != len(FEATURE_STATS):
        raise FailedPrecondition(
            f"the model takes {width} features; the online store gives one window's "
            f"{len(FEATURE_STATS)} statistics ({', '.join(FEATURE_STATS)}): only models "
            "trained with one lag can be fed by entity"
        )
    row = np.asarray(window_stats(window), dtype=np.float32)
    if np.isnan(row).any():
        missing = [s for s, v in zip(FEATURE_STATS, row, strict=True) if np.isnan(v)]
        raise FailedPrecondition(f"window {field} lacks the statistics {missing}")
    return row


class OnlineFeatures:
    def __init__(self, client: redis.asyncio.Redis, key_prefix: str) -> None:
        self._client = client
        self._prefix = key_prefix

    async def window(self, entity_id: str, field: str) -> FeatureWindow:
        """The entity's latest window of ``field`` (``feature_row`` makes it a
        model's input row; its key and sources go to the prediction log).

        Raises InvalidArgument (empty ids), NotFound (no such entity or window),
        FailedPrecondition (bytes that are not a window), Unavailable (Redis)."""
        if not entity_id:
            raise InvalidArgument(f"parameter {ENTITY_PARAMETER!r} is empty")
        if not field:
            raise InvalidArgument(
                f"parameter {FEATURE_PARAMETER!r} is needed: which online-store field "
                "(e.g. temperature@tumbling-60s) to read"
            )
        key = online_key(self._prefix, entity_id)
        try:
            raw = await self._client.hget(key, field)
        except redis.RedisError as exc:
            raise Unavailable(f"online store: {exc}") from exc
        if raw is None:
            raise NotFound(f"no window {field!r} for entity {entity_id!r} in the online store")
        try:
            # shared.redis_client's clients return bytes (responses are not decoded).
            window = decode_window(cast(bytes, raw))
        except FailedPrecondition as exc:
            raise FailedPrecondition(f"window {field!r} of {entity_id!r}: {exc}") from exc
        return window

    async def close(self) -> None:
        await self._client.aclose()
