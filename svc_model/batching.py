"""Dynamic batching with Triton's semantics, per loaded model version.

Requests queue per version. When an instance is free, the queue's head and
the requests behind it that fit (same trailing shapes, at most
``max_batch_size`` rows in all) run as one batch; a request that arrives
while the model computes waits for the next batch, so merging happens under
load without delaying a lone caller. ``max_queue_delay`` lets the first
request wait that long for company when the batch is not full yet. Each
caller gets back its own rows. Inference runs in a thread pool, never on the
event loop. ``max_batch_size=1`` is the plain scheduler (no merging).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

Arrays = Mapping[str, NDArray[Any]]
# (rows in the execution, how long each of its requests waited)
Observe = Callable[[int, list[float]], None]


@dataclass
class _Request:
    inputs: Arrays
    rows: int
    future: asyncio.Future[dict[str, NDArray[Any]]]
    queued_at: float = field(default_factory=time.perf_counter)

    def fits_with(self, other: _Request) -> bool:
        return all(
            self.inputs[name].shape[1:] == array.shape[1:]
            and self.inputs[name].dtype == array.dtype
            for name, array in other.inputs.items()
        )


class Batcher:
    def __init__(
        self,
        run: Callable[[Arrays], dict[str, NDArray[Any]]],
        executor: Executor,
        *,
        max_batch_size: int,
        max_queue_delay_s: float = 0.0,
        instances: int = 1,
        observe: Observe = lambda rows, waits: None,
    ) -> None:
        self._run = run
        self._executor = executor
        self.max_batch_size = max_batch_size
        self._delay = max_queue_delay_s
        self._instances = instances
        self._observe = observe
        self._queue: deque[_Request] = deque()
        self._running = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def merging(self) -> bool:
        return self.max_batch_size > 1

    async def submit(self, inputs: Arrays, rows: int) -> dict[str, NDArray[Any]]:
        """The model's outputs for ``inputs`` (``rows`` rows on the batch dim)."""
        loop = asyncio.get_running_loop()
        request = _Request(inputs, rows, loop.create_future())
        self._queue.append(request)
        self._dispatch()
        return await request.future

    def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue and self._running < self._instances:
            head = self._queue[0]
            if head.future.cancelled():
                self._queue.popleft()
                continue
            if self._delay > 0 and self.merging:
                waited = time.perf_counter() - head.queued_at
                if waited < self._delay and self._queued_rows() < self.max_batch_size:
                    if self._timer is None:
                        self._timer = loop.call_later(self._delay - waited, self._on_timer)
                    return
            batch = self._take()
            self._running += 1
            # The loop keeps only weak references to tasks: hold them here.
            task = loop.create_task(self._execute(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    def _queued_rows(self) -> int:
        return sum(r.rows for r in self._queue)

    def _take(self) -> list[_Request]:
        head = self._queue.popleft()
        batch, rows = [head], head.rows
        if not self.merging:
            return batch
        kept: deque[_Request] = deque()
        while self._queue:
            candidate = self._queue.popleft()
            if candidate.future.cancelled():
                continue
            if rows + candidate.rows <= self.max_batch_size and head.fits_with(candidate):
                batch.append(candidate)
                rows += candidate.rows
            else:
                kept.append(candidate)
            if rows >= self.max_batch_size:
                break
        self._queue.extendleft(reversed(kept))
        return batch

    async def _execute(self, batch: list[_Request]) -> None:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            self._observe(sum(r.rows for r in batch), [started - r.queued_at for r in batch])
            try:
                outputs = await loop.run_in_executor(self._executor, self._run_batch, batch)
            except Exception as exc:
                if len(batch) == 1:
                    _fail(batch[0], exc)
                    return
                # One caller's rows must not fail the others: run each alone.
                for request in batch:
                    try:
                        alone = await loop.run_in_executor(
                            self._executor, self._run, request.inputs
                        )
                        _succeed(request, alone)
                    except Exception as single:
                        _fail(request, single)
                return
            for request, result in zip(batch, outputs, strict=True):
                _succeed(request, result)
        finally:
            self._running -= 1
            self._dispatch()

    def _run_batch(self, batch: list[_Request]) -> list[dict[str, NDArray[Any]]]:
        if len(batch) == 1:
            return [self._run(batch[0].inputs)]
        names = list(batch[0].inputs)
        merged = {n: np.concatenate([r.inputs[n] for r in batch], axis=0) for n in names}
        outputs = self._run(merged)
        bounds = np.cumsum([r.rows for r in batch])[:-1]
        split = {name: np.split(array, bounds, axis=0) for name, array in outputs.items()}
        return [{name: parts[i] for name, parts in split.items()} for i in range(len(batch))]


def _succeed(request: _Request, outputs: dict[str, NDArray[Any]]) -> None:
    if not request.future.done():
        request.future.set_result(outputs)


def _fail(request: _Request, error: BaseException) -> None:
    if not request.future.done():
        request.future.set_exception(error)
