"""Redis clients built from RedisSettings (ACL user and password, TLS via rediss://)."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio

from shared.settings import RedisSettings


def _options(settings: RedisSettings) -> dict[str, Any]:
    options: dict[str, Any] = {"health_check_interval": 30}
    if settings.username is not None:
        options["username"] = settings.username
    if settings.password is not None:
        options["password"] = settings.password.get_secret_value()
    if settings.ssl_ca_certs is not None:
        options["ssl_ca_certs"] = str(settings.ssl_ca_certs)
    return options


def make_redis(settings: RedisSettings) -> redis.Redis:
    return redis.Redis.from_url(settings.url, **_options(settings))


def make_async_redis(settings: RedisSettings) -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(settings.url, **_options(settings))
