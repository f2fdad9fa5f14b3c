"""svc_model's dynamic batcher: merges what queues, returns each caller's rows."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from svc_model.batching import Batcher


class Model:
    """Doubles its input; records the batch sizes it saw; can be held busy."""

    def __init__(self, fail_on: float | None = None) -> None:
        self.batches: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_on = fail_on

    def __call__(self, inputs: Any) -> dict[str, Any]:
        self.gate.wait(10)
        x = inputs["x"]
        self.batches.append(len(x))
        if self.fail_on is not None and (x == self.fail_on).any():
            raise ValueError("poisoned row")
        return {"y": x * 2}


def rows(value: float, count: int, width: int = 3) -> dict[str, Any]:
    return {"x": np.full((count, width), value, dtype=np.float32)}


async def submit_all(batcher: Batcher, requests: list[dict[str, Any]]) -> list[Any]:
    tasks = [asyncio.ensure_future(batcher.submit(r, len(r["x"]))) for r in requests]
    return await asyncio.gather(*tasks, return_exceptions=True)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_requests_queued_while_the_model_is_busy_run_as_one_batch() -> None:
    model = Model()
    pool = ThreadPoolExecutor(2)

    async def scenario() -> list[Any]:
        batcher = Batcher(model, pool, max_batch_size=16)
        model.gate.clear()
        first = asyncio.ensure_future(batcher.submit(rows(0, 1), 1))
        await asyncio.sleep(0.05)  # the first is running, held at the gate
        rest = [asyncio.ensure_future(batcher.submit(rows(i, i), i)) for i in range(1, 5)]
        await asyncio.sleep(0.05)
        model.gate.set()
        return [await first, *[await task for task in rest]]

    results = run(scenario())
    assert model.batches == [1, 1 + 2 + 3 + 4]
    for i, result in enumerate(results):
        expected = np.full((max(i, 1), 3), 2 * i, dtype=np.float32)
        np.testing.assert_array_equal(result["y"], expected)


def test_max_batch_size_and_trailing_shapes_bound_a_batch() -> None:
    model = Model()
    pool = ThreadPoolExecutor(2)

    async def scenario() -> list[Any]:
        batcher = Batcher(model, pool, max_batch_size=4)
        model.gate.clear()
        blocker = asyncio.ensure_future(batcher.submit(rows(9, 1), 1))
        await asyncio.sleep(0.05)
        requests = [rows(1, 2), rows(2, 2), rows(3, 1, width=5), rows(4, 2)]
        pending = asyncio.ensure_future(submit_all(batcher, requests))
        await asyncio.sleep(0.05)
        model.gate.set()
        await blocker
        return list(await pending)

    results = run(scenario())
    # [1, 2] fill a batch of 4; the width-5 request cannot join [4].
    assert model.batches == [1, 4, 1, 2]
    assert [r["y"].shape for r in results] == [(2, 3), (2, 3), (1, 5), (2, 3)]


def test_one_bad_request_does_not_fail_the_others_in_its_batch() -> None:
    model = Model(fail_on=7)
    pool = ThreadPoolExecutor(2)

    async def scenario() -> list[Any]:
        batcher = Batcher(model, pool, max_batch_size=16)
        model.gate.clear()
        blocker = asyncio.ensure_future(batcher.submit(rows(0, 1), 1))
        await asyncio.sleep(0.05)
        pending = asyncio.ensure_future(submit_all(batcher, [rows(1, 1), rows(7, 1), rows(2, 1)]))
        await asyncio.sleep(0.05)
        model.gate.set()
        await blocker
        return list(await pending)

    ok, bad, also_ok = run(scenario())
    assert isinstance(bad, ValueError)
    np.testing.assert_array_equal(ok["y"], [[2, 2, 2]])
    np.testing.assert_array_equal(also_ok["y"], [[4, 4, 4]])


def test_a_queue_delay_lets_a_lone_request_wait_for_company() -> None:
    model = Model()
    pool = ThreadPoolExecutor(2)

    async def scenario() -> None:
        batcher = Batcher(model, pool, max_batch_size=8, max_queue_delay_s=0.2)
        first = asyncio.ensure_future(batcher.submit(rows(1, 1), 1))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(batcher.submit(rows(2, 1), 1))
        await asyncio.gather(first, second)

    run(scenario())
    assert model.batches == [2]


@pytest.mark.parametrize("max_batch_size", [1])
def test_without_merging_each_request_runs_alone(max_batch_size: int) -> None:
    model = Model()
    pool = ThreadPoolExecutor(2)

    async def scenario() -> None:
        batcher = Batcher(model, pool, max_batch_size=max_batch_size)
        await submit_all(batcher, [rows(1, 2), rows(2, 3), rows(3, 1)])

    run(scenario())
    assert model.batches == [2, 3, 1]


def test_the_model_runs_on_the_instance_threads_and_each_caller_resumes_on_the_loop() -> None:
    ran_on: list[str] = []

    def model(inputs: Any) -> dict[str, Any]:
        ran_on.append(threading.current_thread().name)
        return {"y": inputs["x"] * 2}

    pool = ThreadPoolExecutor(1, thread_name_prefix="instance")

    async def scenario() -> list[str]:
        batcher = Batcher(model, pool, max_batch_size=1)
        resumed_on = []
        for i in range(3):
            result = await batcher.submit(rows(i, 1), 1)
            np.testing.assert_array_equal(result["y"], rows(2 * i, 1)["x"])
            resumed_on.append(threading.current_thread().name)
        return resumed_on

    assert run(scenario()) == ["MainThread"] * 3
    assert ran_on == ["instance_0"] * 3


def test_a_dropped_versions_queued_requests_fail_rather_than_wait() -> None:
    model = Model()
    pool = ThreadPoolExecutor(1)

    async def scenario() -> list[Any]:
        batcher = Batcher(model, pool, max_batch_size=1)
        model.gate.clear()
        running = asyncio.ensure_future(batcher.submit(rows(1, 1), 1))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(batcher.submit(rows(2, 1), 1))
        await asyncio.sleep(0.05)
        pool.shutdown(wait=False)  # the process is exiting: the threads take no more
        model.gate.set()
        return list(
            await asyncio.wait_for(asyncio.gather(running, queued, return_exceptions=True), 5)
        )

    done, refused = run(scenario())
    np.testing.assert_array_equal(done["y"], [[2, 2, 2]])
    assert isinstance(refused, RuntimeError)


def test_inline_calls_the_model_on_the_event_loop_and_raises_its_error() -> None:
    ran_on: list[str] = []
    observed: list[tuple[int, list[float]]] = []

    def model(inputs: Any) -> dict[str, Any]:
        ran_on.append(threading.current_thread().name)
        if (inputs["x"] == 7).any():
            raise ValueError("poisoned row")
        return {"y": inputs["x"] * 2}

    async def scenario() -> tuple[Any, Any]:
        batcher = Batcher(
            model,
            ThreadPoolExecutor(1, thread_name_prefix="instance"),
            max_batch_size=1,
            inline=True,
            observe=lambda rows, waits: observed.append((rows, waits)),
        )
        good = await batcher.submit(rows(1, 2), 2)
        with pytest.raises(ValueError, match="poisoned"):
            await batcher.submit(rows(7, 1), 1)
        return good, threading.current_thread().name

    good, loop_thread = run(scenario())
    np.testing.assert_array_equal(good["y"], rows(2, 2)["x"])
    assert ran_on == [loop_thread, loop_thread]
    assert observed == [(2, [0.0]), (1, [0.0])]


def test_a_merging_batcher_never_runs_inline() -> None:
    model = Model()
    assert not Batcher(model, ThreadPoolExecutor(1), max_batch_size=8, inline=True).inline


def test_a_lone_request_runs_on_the_loop_only_while_nothing_is_queued_or_running() -> None:
    ran_on: list[str] = []
    gate = threading.Event()

    def model(inputs: Any) -> dict[str, Any]:
        ran_on.append(threading.current_thread().name)
        gate.wait(10)
        return {"y": inputs["x"] * 2}

    async def scenario() -> str:
        batcher = Batcher(
            model,
            ThreadPoolExecutor(1, thread_name_prefix="instance"),
            max_batch_size=8,
            lone_inline=True,
        )
        gate.set()
        await batcher.submit(rows(1, 1), 1, alone=True)  # on the loop
        await batcher.submit(rows(1, 1), 1)  # not alone: to the instance
        gate.clear()
        running = asyncio.ensure_future(batcher.submit(rows(1, 1), 1))
        await asyncio.sleep(0.05)  # held at the gate on the instance
        behind = asyncio.ensure_future(batcher.submit(rows(2, 1), 1, alone=True))
        await asyncio.sleep(0.05)
        gate.set()
        np.testing.assert_array_equal((await behind)["y"], rows(4, 1)["x"])
        await running
        return threading.current_thread().name

    loop_thread = run(scenario())
    assert ran_on[0] == loop_thread
    assert ran_on[1:] == ["instance_0"] * 3


def test_only_a_merging_batcher_runs_lone_requests_on_the_loop() -> None:
    model = Model()
    assert not Batcher(model, ThreadPoolExecutor(1), max_batch_size=1, lone_inline=True).lone_inline
    assert Batcher(model, ThreadPoolExecutor(1), max_batch_size=8, lone_inline=True).lone_inline
