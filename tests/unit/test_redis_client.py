"""Redis clients: a background loop's rides out a restart, a request path's fails fast."""

from __future__ import annotations

from redis.retry import Retry

from shared.redis_client import make_redis, riding_out
from shared.settings import RedisSettings


def _patience(retry: Retry) -> float:
    # What redis-py sleeps in all before it gives up: after failures 1..n.
    return sum(retry._backoff.compute(n) for n in range(1, retry._retries + 1))


def test_riding_out_waits_at_least_as_long_as_asked_backing_off_to_a_second() -> None:
    retry = riding_out(30)
    assert 30 <= _patience(retry) <= 31
    assert retry._backoff.compute(1) <= 0.1 and retry._backoff.compute(50) == 1.0


def test_a_client_rides_out_a_restart_only_when_asked() -> None:
    settings = RedisSettings(url="redis://127.0.0.1:1/0")
    patient = make_redis(settings, ride_out_seconds=20).connection_pool.connection_kwargs["retry"]
    default = make_redis(settings).connection_pool.connection_kwargs.get("retry")
    assert _patience(patient) >= 20
    assert default is None or _patience(default) < 10
