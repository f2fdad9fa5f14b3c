"""Redis clients built from RedisSettings (ACL user and password, TLS via rediss://)."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from shared.settings import RedisSettings

#: How long a background loop (svc_tuner's engine, svc_transform's sinks)
#: waits for a restarting Redis before it fails.
REDIS_RIDE_OUT_SECONDS = 30.0


def _options(settings: RedisSettings) -> dict[str, Any]:
    options: dict[str, Any] = {"health_check_interval": 30}
    if settings.username is not None:
        options["username"] = settings.username
    if settings.password is not None:
        options["password"] = settings.password.get_secret_value()
    if settings.ssl_ca_certs is not None:
        options["ssl_ca_certs"] = str(settings.ssl_ca_certs)
    return options


def make_redis(settings: RedisSettings, *, ride_out_seconds: float = 0.0) -> redis.Redis:
    """A client; with ``ride_out_seconds``, a command that finds Redis away
    (restarting) is retried for about that long before it raises, for the
    background loops that must outlive a restart rather than die of it.
    Without, redis-py's own few retries (a request path fails fast)."""
    options = _options(settings)
    if ride_out_seconds > 0:
        options["retry"] = riding_out(ride_out_seconds)
    return redis.Redis.from_url(settings.url, **options)


def riding_out(seconds: float) -> Retry:
    """Retries on connection errors and timeouts, backing off from 50 ms to
    1 s, for at least ``seconds`` in all."""
    backoff = ExponentialBackoff(cap=1.0, base=0.05)
    retries, waited = 0, 0.0
    while waited < seconds:
        retries += 1
        waited += backoff.compute(retries)  # as Retry calls it: after failure n, n >= 1
    return Retry(backoff, retries)


def make_async_redis(settings: RedisSettings) -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(settings.url, **_options(settings))
