"""A torch.export program served as TorchScript traced from it
(``shared.model_loading.traced_program``): only where the trace computes what
the program computes, at every batch size; the program itself otherwise."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shared.contracts.aistack.v1 import models_pb2
from shared.model_loading import TensorSig, load, traced_program

BATCH = torch.export.Dim("batch", min=1)


class Flattening(torch.nn.Module):
    """What the project's own CNN does: flatten from the batch dimension on."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(x.flatten(1)), -1)


class SizedView(Flattening):
    """Reads the batch size off its input: the program takes it per call, a
    trace would keep the one it saw."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(x.view(x.shape[0], -1)), -1)


class Branching(torch.nn.Module):
    """Control flow in the graph: a trace would keep one branch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))


def program(module: torch.nn.Module, *shape: int) -> torch.nn.Module:
    exported = torch.export.export(module, (torch.randn(4, *shape),), dynamic_shapes=({0: BATCH},))
    return exported.module()


def signature(*shape: int) -> tuple[TensorSig, ...]:
    return (TensorSig("x", "FP32", (-1, *shape)),)


@pytest.mark.parametrize("rows", [1, 3, 64])
def test_a_traced_program_computes_what_the_program_computes_at_any_batch_size(rows: int) -> None:
    exported = program(Flattening(), 2, 3)
    traced = traced_program(exported, signature(2, 3))
    assert isinstance(traced, torch.jit.ScriptModule)
    x = torch.randn(rows, 2, 3)
    with torch.inference_mode():
        assert torch.equal(traced(x), exported(x))


@pytest.mark.parametrize(
    ("module", "shape"),
    [(SizedView(), (2, 3)), (Branching(), (3,))],
    ids=["batch-size-read-off-the-input", "torch-cond"],
)
def test_a_program_a_trace_would_compute_otherwise_is_not_traced(
    module: torch.nn.Module, shape: tuple[int, ...]
) -> None:
    assert traced_program(program(module, *shape), signature(*shape)) is None


def test_an_input_of_strings_is_not_traced() -> None:
    strings = (TensorSig("x", "BYTES", (-1, 6)),)
    assert traced_program(program(Flattening(), 2, 3), strings) is None


def _artifact(tmp_path: Path, module: torch.nn.Module) -> models_pb2.ModelReady:
    exported = torch.export.export(module, (torch.randn(4, 2, 3),), dynamic_shapes=({0: BATCH},))
    torch.export.save(exported, str(tmp_path / "model.pt2"))
    return models_pb2.ModelReady(
        model_name="m",
        version="1",
        format=models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT,
        inputs=[models_pb2.TensorSpec(name="x", datatype="FP32", shape=[-1, 2, 3])],
        outputs=[models_pb2.TensorSpec(name="p", datatype="FP32", shape=[-1, 3])],
    )


@pytest.mark.parametrize(
    ("module", "trace", "runtime"),
    [
        (Flattening(), True, "traced"),
        (Flattening(), False, ""),
        (SizedView(), True, ""),
    ],
    ids=["traced", "trace-off", "not-traceable"],
)
def test_load_serves_the_trace_only_when_asked_and_it_holds(
    tmp_path: Path, module: torch.nn.Module, trace: bool, runtime: str
) -> None:
    runner = load(_artifact(tmp_path, module), tmp_path, trace_exported=trace)
    assert (runner.platform, runner.runtime) == ("pytorch_export", runtime)
    x = np.random.default_rng(1).standard_normal((5, 2, 3)).astype(np.float32)
    with torch.inference_mode():
        expected = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(runner.run({"x": x})["p"], expected, rtol=1e-6, atol=1e-7)


def _served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> Any:
    """svc_model's Loader on the Flattening program, unbatched unless
    ``settings`` say otherwise; the artifact is read where it was written."""
    from prometheus_client import CollectorRegistry

    from shared import model_loading
    from svc_model.loading import Loader
    from svc_model.metrics import ModelMetrics
    from svc_model.settings import ModelSettings

    event = _artifact(tmp_path, Flattening())
    monkeypatch.setattr(model_loading, "fetch", lambda event, cache, object_store=None: tmp_path)
    model = ModelSettings(
        **{"batching": False, "artifact_cache_dir": tmp_path / "cache", **settings}
    )
    return Loader(model, ModelMetrics.create(CollectorRegistry())).load(event)


def test_svc_models_loader_loads_traces_checks_and_serves_a_version_on_its_own_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every thread that runs torch keeps a team of intra-op threads, and a
    second team slows every call (GNU OpenMP stops spinning): svc_model runs
    all of a version's torch work on the version's own thread."""
    from shared import model_loading

    ran_on: dict[str, set[str]] = {"load": set(), "smoke_test": set(), "run": set()}

    def recorded(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            ran_on[name].add(threading.current_thread().name)
            return real(*args, **kwargs)

        return call

    real_load = model_loading.load

    def load(*args: Any, **kwargs: Any) -> Any:
        runner = recorded("load", real_load)(*args, **kwargs)
        return replace(runner, run=recorded("run", runner.run))

    monkeypatch.setattr(model_loading, "load", load)
    monkeypatch.setattr(
        model_loading, "smoke_test", recorded("smoke_test", model_loading.smoke_test)
    )
    # The framework's own thread count: a version that runs on its threads,
    # not on the event loop.
    served = _served(tmp_path, monkeypatch, intra_op_threads=0)
    assert not served.executor.batcher.inline

    async def infer() -> None:
        x = np.ones((1, 2, 3), np.float32)
        await served.executor.batcher.submit({"x": x}, 1)

    asyncio.run(infer())
    assert ran_on["load"] == ran_on["smoke_test"] == ran_on["run"] == {"infer-m-1_0"}


@pytest.mark.parametrize(
    ("overrides", "inline", "lone_inline"),
    [
        ({}, True, False),
        ({"batching": True}, False, True),
        ({"batching": True, "instances": 2}, False, True),
        ({"instances": 2}, False, False),
        ({"intra_op_threads": 0}, False, False),
        ({"batching": True, "intra_op_threads": 0}, False, False),
        ({"inline_max_ms": 0.0}, False, False),
        ({"batching": True, "inline_max_ms": 0.0}, False, False),
    ],
    ids=[
        "unbatched-one-thread",
        "batching",
        "batching-two-instances",
        "two-instances",
        "framework-threads",
        "batching-framework-threads",
        "inline-off",
        "batching-inline-off",
    ],
)
def test_a_short_single_threaded_version_runs_on_the_event_loop(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    overrides: dict[str, Any],
    inline: bool,
    lone_inline: bool,
) -> None:
    """Unbatched on one instance: every request; batched: a request alone in
    the server (svc_model.inference decides which)."""
    batcher = _served(tmp_path, monkeypatch, **overrides).executor.batcher
    assert (batcher.inline, batcher.lone_inline) == (inline, lone_inline)

    async def infer() -> Any:
        return await batcher.submit({"x": np.ones((3, 2, 3), np.float32)}, 3, alone=True)

    assert asyncio.run(infer())["p"].shape == (3, 3)
