"""Dynamic batching with Triton's semantics, per loaded model version.

Requests queue per version. When an instance is free, the queue's head and
the requests behind it that fit (same trailing shapes, at most
``max_batch_size`` rows in all) run as one batch; a request that arrives
while the model computes waits for the next batch, so merging happens under
load without delaying a lone caller. ``max_queue_delay`` lets the first
request wait that long for company when the batch is not full yet. Each
caller gets back its own rows. Inference runs on the version's own threads,
not on the event loop: a batch goes to a free instance thread and its
results come back in one call on the loop, with no asyncio task or
executor future per request. ``max_batch_size=1`` is the plain scheduler
(no merging); with ``inline`` it calls the model on the event loop instead,
for a model whose call is shorter than a hand-over to a thread and back.
A merging batcher with ``lone_inline`` does the same for a request its
caller says is ``alone`` (the only one in the server, none other lately:
nothing to merge it with), while nothing is queued or running.
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
# A request's outputs, or why it has none.
Outcome = dict[str, NDArray[Any]] | Exception
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
        inline: bool = False,
        lone_inline: bool = False,
    ) -> None:
        self._run = run
        self._executor = executor
        self.max_batch_size = max_batch_size
        self._delay = max_queue_delay_s
        self._instances = instances
        self._observe = observe
        self.inline = inline and max_batch_size == 1
        self.lone_inline = lone_inline and max_batch_size > 1
        self._queue: deque[_Request] = deque()
        self._running = 0
        self._timer: asyncio.TimerHandle | None = None

    @property
    def merging(self) -> bool:
        return self.max_batch_size > 1

    async def submit(
        self, inputs: Arrays, rows: int, *, alone: bool = False
    ) -> dict[str, NDArray[Any]]:
        """The model's outputs for ``inputs`` (``rows`` rows on the batch dim)."""
        if self.inline or (alone and self.lone_inline and not self._queue and not self._running):
            self._observe(rows, [0.0])
            return self._run(inputs)
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
            self._observe(
                sum(r.rows for r in batch), [time.perf_counter() - r.queued_at for r in batch]
            )
            try:
                self._executor.submit(self._execute, batch, loop)
            except RuntimeError as exc:  # its threads are shut down: the process is exiting
                self._running -= 1
                for request in batch:
                    _fail(request, exc)

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

    def _execute(self, batch: list[_Request], loop: asyncio.AbstractEventLoop) -> None:
        """On an instance thread: run ``batch``, hand every result to the loop."""
        results = self._results(batch)
        try:
            loop.call_soon_threadsafe(self._finish, batch, results)
        except RuntimeError:  # the loop closed under us: nobody waits any more
            pass

    def _results(self, batch: list[_Request]) -> list[Outcome]:
        try:
            return [*self._run_batch(batch)]
        except Exception as exc:
            if len(batch) == 1:
                return [exc]
        # One caller's rows must not fail the others: run each alone.
        results: list[Outcome] = []
        for request in batch:
            try:
                results.append(self._run(request.inputs))
            except Exception as single:
                results.append(single)
        return results

    def _finish(self, batch: list[_Request], results: list[Outcome]) -> None:
        self._running -= 1
        for request, result in zip(batch, results, strict=True):
            if isinstance(result, Exception):
                _fail(request, result)
            else:
                _succeed(request, result)
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
