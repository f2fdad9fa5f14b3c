"""svc_ingest started together with a broker that has just come up.

A cold broker loads its logs before it can say where a changelog ends; a
worker that asked it then used to die with Faust's ConsistencyError
("persisted offset … is higher than … highwater (1176 > -1)"). Here the
worker's RocksDB store holds a persisted changelog offset, then the broker
and the worker stop, and start again at the same moment.

Under at_least_once the store persists each changelog offset as it is
written. Under exactly_once Faust 0.15.3 queues them by changelog partition
but flushes them on commit by source partition, so none reaches RocksDB and
recovery reads each changelog from its start: that case runs too.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from loadgen.plan import generate
from tests.infra import Infra, wait_until
from tests.integration.ingest_worker import Topics, Worker, prepare, publish, read_outputs

pytestmark = pytest.mark.timeout(300)


def has_taken_in(worker: Worker, count: int) -> bool:
    return worker.counter("ingest_records_in_total") == count


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.close()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_worker_and_broker_restarted_together_recover_the_dedup_table(
    infra: Infra, unique: str, workers: list[Worker], tmp_path: Path, guarantee: str
) -> None:
    stack = infra.local_stack
    if infra.kind != "local" or stack is None:
        pytest.skip(f"restarting the broker needs the local launcher; infra is {infra.kind}")
    env = {"AISTACK_INGEST_STORE": "rocksdb", "AISTACK_INGEST_PROCESSING_GUARANTEE": guarantee}
    topics = Topics.unique(unique)
    prepare(infra, topics)
    first = generate("sensors", 300, fmt="json", seed=41)
    later = generate("sensors", 100, fmt="json", seed=42)
    worker = Worker(infra, topics, tmp_path / "w", extra_env=env)
    workers.append(worker)
    worker.wait_ready()
    # In three batches: each writes a changelog entry per partition, and Faust
    # checks only a persisted offset above 0.
    for start in range(0, len(first), 100):
        publish(infra, topics.raw, first[start : start + 100])
        wait_until(partial(has_taken_in, worker, start + 100), 60, "not processed")
    # A clean shutdown keeps the RocksDB store and the changelog offset it persisted.
    assert worker.terminate() == 0

    stack.down()
    broker = threading.Thread(target=stack.up)
    broker.start()
    restarted = Worker(infra, topics, tmp_path / "w", extra_env=env)
    workers.append(restarted)
    broker.join(timeout=180)
    assert not broker.is_alive(), "the local broker did not come back"
    restarted.wait_ready(timeout=150)

    assert "ConsistencyError" not in restarted.log_text()
    assert restarted.process.poll() is None
    # New events are cleaned; a repeat of one from before the restart is known.
    publish(infra, topics.raw, [*later, first[0]])
    written = read_outputs(infra.kafka, topics, expected_total=len(first) + len(later))
    assert written.clean_ids == Counter(r.event_id for r in [*first, *later])
    wait_until(
        lambda: restarted.counter("ingest_records_total", '{outcome="duplicate"}') == 1,
        30,
        "the repeat was not recognised: the dedup table was not recovered",
    )
