"""Where the tuner keeps its studies: Optuna's journal storage on Redis, with
our connection settings and fewer round trips.

The engine takes any Optuna ``BaseStorage``; this module is the one the
service runs on (the tests also run the engine on Optuna's in-memory and
journal-file storages).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Generator
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalRedisBackend

from shared.redis_client import REDIS_RIDE_OUT_SECONDS, make_redis
from shared.settings import RedisSettings


def redis_storage(settings: RedisSettings, prefix: str) -> JournalStorage:
    """Optuna's journal storage on Redis, with our connection settings (password, TLS)."""
    with warnings.catch_warnings():
        # "experimental" since Optuna 3.1; the interface is pinned with Optuna.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return JournalStorage(_RedisJournal(settings, prefix))


class _RedisJournal(JournalRedisBackend):
    """Optuna's Redis journal, same keys and records (optuna-dashboard reads it),
    with our connection settings and one round trip per read or write instead of
    one per record: every storage call of the engine syncs the journal first."""

    # Optuna's script for one record, for a list of them.
    _APPEND = """
    redis.call('setnx', KEYS[1], -1)
    for i, record in ipairs(ARGV) do
      local n = redis.call('incr', KEYS[1])
      redis.call('set', KEYS[2] .. n, record)
    end
    """

    # Optuna builds its client from the URL alone; ours adds the password and CA.
    def __init__(self, settings: RedisSettings, prefix: str) -> None:
        super().__init__(settings.url, prefix=prefix)
        self._settings = settings
        self._redis = make_redis(settings, ride_out_seconds=REDIS_RIDE_OUT_SECONDS)
        self._append = self._redis.register_script(self._APPEND)

    def __setstate__(self, state: dict[Any, Any]) -> None:
        self.__dict__.update(state)
        self._redis = make_redis(self._settings, ride_out_seconds=REDIS_RIDE_OUT_SECONDS)
        self._append = self._redis.register_script(self._APPEND)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        keys = [f"{self._prefix}:log_number", f"{self._prefix}:log:"]
        self._append(keys=keys, args=[json.dumps(log) for log in logs])

    def read_logs(self, log_number_from: int) -> Generator[dict[str, Any], None, None]:
        last = self._redis.get(f"{self._prefix}:log_number")
        if last is None or int(last) < log_number_from:
            return
        numbers = list(range(log_number_from, int(last) + 1))
        records = self._redis.mget([self._key_log_id(n) for n in numbers])
        for number, record in zip(numbers, records, strict=True):
            if record is None:  # appended by a writer on a cluster, not yet set
                yield from super().read_logs(number)
                return
            try:
                yield json.loads(record)
            except json.JSONDecodeError:
                if number != int(last):
                    raise
