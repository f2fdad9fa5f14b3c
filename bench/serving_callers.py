"""The callers in bench.serving: client processes with tritonclient's gRPC
client, and the in-process floor, each a spawned process that takes commands
from a queue.

Only the standard library and numpy at module level: the client processes
are spawned, so they import this module (and bench.serving) again, and there
tritonclient must be the one owner of the protobuf package ``inference``
(kserve and aistack's own contracts register it too). Everything else is
imported where used.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

MODEL = "digits"
"""The name every server serves the model under."""
CHECK_IMAGES = 8
"""Images whose answers each server must match the in-process module on."""


def closed_loop(
    call: Callable[[int], object], warm_at: float, end_at: float
) -> tuple[list[float], int, str]:
    """Call in a closed loop until ``end_at``: the latencies of the calls that
    succeeded and ended inside [warm_at, end_at], the failures and the first
    one's text."""
    latencies: list[float] = []
    failures, first = 0, ""
    index = 0
    while True:
        started = time.monotonic()
        if started >= end_at:
            break
        index += 1
        try:
            call(index)
        except Exception as exc:  # counted, never retried: a failure is a result
            failures += 1
            first = first or f"{type(exc).__name__}: {exc}"
            continue
        ended = time.monotonic()
        if warm_at <= ended <= end_at:
            latencies.append(ended - started)
    return latencies, failures, first


def in_threads(
    count: int, make_call: Callable[[], Callable[[int], object]], warm_at: float, end_at: float
) -> tuple[list[float], int, str]:
    results: list[tuple[list[float], int, str]] = []
    lock = threading.Lock()

    def caller() -> None:
        try:
            result = closed_loop(make_call(), warm_at, end_at)
        except Exception as exc:  # the caller could not even be set up
            result = ([], 1, f"{type(exc).__name__}: {exc}")
        with lock:
            results.append(result)

    threads = [threading.Thread(target=caller) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    latencies = [value for result in results for value in result[0]]
    failures = sum(result[1] for result in results)
    first = next((result[2] for result in results if result[2]), "")
    return latencies, failures, first


def client_main(commands: Any, results: Any) -> None:
    """A client process: tritonclient only, commands from the orchestrator."""
    import tritonclient.grpc as triton_grpc

    def make_call(address: str, images: np.ndarray) -> Callable[[int], object]:
        client = triton_grpc.InferenceServerClient(address)
        inputs = []
        for image in images:
            tensor = triton_grpc.InferInput("input", [1, 8, 8], "FP32")
            tensor.set_data_from_numpy(image[None])
            inputs.append(tensor)
        wanted = [triton_grpc.InferRequestedOutput("probabilities")]

        def call(index: int) -> object:
            return client.infer(MODEL, [inputs[index % len(inputs)]], outputs=wanted)

        return call

    while (command := commands.get()) is not None:
        kind, address, *rest = command
        try:
            if kind == "ping":
                results.put(("ok", None))
            elif kind == "ready":
                (timeout,) = rest
                client = triton_grpc.InferenceServerClient(address)
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        if client.is_model_ready(MODEL):
                            break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{MODEL} not ready at {address} after {timeout} s")
                    time.sleep(0.2)
                results.put(("ok", None))
            elif kind == "check":
                (images,) = rest
                call = make_call(address, images)
                rows = [call(i).as_numpy("probabilities") for i in range(CHECK_IMAGES)]  # type: ignore[attr-defined]
                results.put(("ok", np.concatenate(rows)))
            else:
                threads, warm_at, end_at, images = rest
                per_thread = functools.partial(make_call, address, images)
                results.put(("ok", in_threads(threads, per_thread, warm_at, end_at)))
        except Exception as exc:
            results.put(("error", f"{type(exc).__name__}: {exc}"))


def floor_main(threads: int, commands: Any, results: Any) -> None:
    """The in-process floor: the exported module (``load`` names it), called
    from threads of this process."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    module: Any = None

    def make_call(images: np.ndarray) -> Callable[[int], object]:
        def call(index: int) -> object:
            with torch.inference_mode():
                return module(torch.from_numpy(images[index % len(images)][None])).numpy()

        return call

    while (command := commands.get()) is not None:
        kind, path, *rest = command
        try:
            if kind == "ping":
                results.put(("ok", None))
            elif kind == "load":
                module = torch.export.load(path).module()
                results.put(("ok", None))
            else:
                callers, warm_at, end_at, images = rest
                per_thread = functools.partial(make_call, images)
                results.put(("ok", in_threads(callers, per_thread, warm_at, end_at)))
        except Exception as exc:
            results.put(("error", f"{type(exc).__name__}: {exc}"))


class Worker:
    """A spawned process that takes commands from a queue and answers on another."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        context = mp.get_context("spawn")
        self.commands: Any = context.Queue()
        self.results: Any = context.Queue()
        self.process = context.Process(
            target=target, args=(*args, self.commands, self.results), daemon=True
        )
        self.process.start()

    def send(self, *command: Any) -> None:
        self.commands.put(command)

    def answer(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                status, value = self.results.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise RuntimeError(
                        f"a worker exited ({self.process.exitcode}) without answering"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no answer from a worker in {timeout} s") from None
        if status != "ok":
            raise RuntimeError(value)
        return value

    def ask_to_stop(self) -> None:
        if self.process.is_alive():
            self.commands.put(None)

    def wait(self, timeout: float) -> None:
        self.process.join(timeout)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
