from __future__ import annotations

import asyncio

import pytest

from shared.redis_client import make_async_redis, make_redis
from tests.infra import Infra

pytestmark = pytest.mark.integration


def test_redis_round_trip(infra: Infra, unique: str) -> None:
    client = make_redis(infra.redis)
    key = f"test:{unique}"
    client.hset(key, mapping={"mean": "21.5", "count": "12"})
    client.expire(key, 60)
    assert client.hgetall(key) == {b"mean": b"21.5", b"count": b"12"}
    assert 0 < client.ttl(key) <= 60
    client.delete(key)
    assert client.exists(key) == 0


def test_async_redis_round_trip(infra: Infra, unique: str) -> None:
    async def run() -> bytes | None:
        client = make_async_redis(infra.redis)
        try:
            await client.set(f"test:{unique}", b"\x00bytes", ex=60)
            return await client.get(f"test:{unique}")
        finally:
            await client.aclose()

    assert asyncio.run(run()) == b"\x00bytes"
