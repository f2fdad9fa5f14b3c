"""Shared pieces of the model-server tests: real artifacts exported by
svc_trainer's own code (torch.export and a TensorFlow SavedModel of the digits
CNN), model-ready events for them, and the server run in this process on an
event loop of its own."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
from prometheus_client import CollectorRegistry

from shared.artifacts import TORCH_EXPORT_FILE, digest
from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import common_pb2, models_pb2
from shared.contracts.inference import grpc_predict_v2_pb2 as pb
from shared.contracts.inference import grpc_predict_v2_pb2_grpc as pb_grpc
from svc_model.app import ModelServer
from svc_model.settings import ModelSettings
from tests.infra import Infra
from tests.integration.trainer_support import SMALL, digits_splits, run_spec

T = TypeVar("T")

TORCH = "torch"
TF = "tensorflow"


@dataclass(frozen=True)
class Artifact:
    """One exported model directory and what a model-ready event says of it."""

    framework: str
    directory: Path
    sha256: str
    size: int

    def copy_to(self, directory: Path) -> Artifact:
        shutil.copytree(self.directory, directory)
        return Artifact(self.framework, directory, self.sha256, self.size)


def export_torch(directory: Path) -> Artifact:
    import torch

    from svc_trainer.backends.torch import models as torch_models
    from svc_trainer.backends.torch import runner as torch_runner

    data = digits_splits(limit=200)
    torch.manual_seed(3)
    model = torch_models.build("cnn", SMALL, data)
    torch_runner.export(model, data, directory)
    sha, size = digest(directory)
    return Artifact(TORCH, directory, sha, size)


def export_tf(directory: Path) -> Artifact:
    import tensorflow as tf

    from svc_trainer.backends.tensorflow import models as tf_models
    from svc_trainer.backends.tensorflow import runner as tf_runner

    data = digits_splits(limit=200)
    tf.keras.utils.set_random_seed(3)
    model = tf_models.build_model("cnn", SMALL, data)
    tf_runner.export(model, run_spec(directory.parent, export_dir=str(directory)), data)
    sha, size = digest(directory)
    return Artifact(TF, directory, sha, size)


def export_regressor(directory: Path, width: int) -> Artifact:
    """A linear model over one row of ``width`` features (a forecaster's shape)."""
    import torch

    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(width, 1)).eval()
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    program = torch.export.export(model, (torch.zeros(2, width),), dynamic_shapes=({0: batch},))
    directory.mkdir(parents=True)
    torch.export.save(program, str(directory / TORCH_EXPORT_FILE))
    sha, size = digest(directory)
    return Artifact(TORCH, directory, sha, size)


def regressor_event(
    name: str, version: int, artifact: Artifact, *, width: int, feature: str
) -> models_pb2.ModelReady:
    ready = event(name, version, artifact, labels={"feature": feature})
    del ready.inputs[:]
    del ready.outputs[:]
    ready.inputs.add(name="input", datatype="FP32", shape=[-1, width])
    ready.outputs.add(name="prediction", datatype="FP32", shape=[-1, 1])
    return ready


def event(
    name: str,
    version: int,
    artifact: Artifact,
    *,
    val_error: float | None = 0.1,
    sha256: str | None = None,
    labels: dict[str, str] | None = None,
) -> models_pb2.ModelReady:
    torch = artifact.framework == TORCH
    ready = models_pb2.ModelReady(
        model_name=name,
        version=str(version),
        framework=common_pb2.FRAMEWORK_TORCH if torch else common_pb2.FRAMEWORK_TENSORFLOW,
        format=(
            models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT
            if torch
            else models_pb2.ARTIFACT_FORMAT_TF_SAVED_MODEL
        ),
        artifact_uri=artifact.directory.as_uri(),
        sha256=sha256 or artifact.sha256,
        size_bytes=artifact.size,
        inputs=[models_pb2.TensorSpec(name="input", datatype="FP32", shape=[-1, 8, 8])],
        outputs=[models_pb2.TensorSpec(name="probabilities", datatype="FP32", shape=[-1, 10])],
        objective=common_pb2.Objective(metric="val_error", direction=common_pb2.DIRECTION_MINIMIZE),
        labels=labels or {},
    )
    if val_error is not None:
        ready.metrics["val_error"] = val_error
    return ready


def publish(infra: Infra, topic: str, *events: models_pb2.ModelReady) -> None:
    with BusProducer(infra.kafka, source="tests") as producer:
        for ready in events:
            producer.publish(topic, ready, key=f"{ready.model_name}/{ready.version}")
        producer.flush()


def digits(count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.random((count, 8, 8), dtype=np.float32)


def settings(infra: Infra, tmp: Path, unique: str, **overrides: Any) -> ModelSettings:
    values: dict[str, Any] = {
        "grpc_address": "127.0.0.1:0",
        "models_topic": f"models-{unique}",
        "dlq_topic": f"dlq-{unique}",
        "prediction_log_topic": f"predictions-{unique}",
        "artifact_cache_dir": tmp / f"cache-{unique}",
        "metrics_port": 0,
        "kafka": infra.kafka,
        "redis": infra.redis,
        "replay_timeout_seconds": 60,
    }
    values.update(overrides)
    return ModelSettings(**values)


class ServerThread:
    """A ModelServer on an event loop in a thread of this process."""

    def __init__(self, settings: ModelSettings, **start: Any) -> None:
        """``start``: ModelServer.start's keyword options."""
        self.settings = settings
        self.registry = CollectorRegistry()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.server: ModelServer = self.call(ModelServer.start(settings, self.registry, **start))
        self.address = f"127.0.0.1:{self.server.port}"

    def call(self, coroutine: Any, timeout: float = 120) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout)

    def on_loop(self, function: Callable[[], T]) -> T:
        async def run() -> T:
            return function()

        result: T = self.call(run())
        return result

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self.call(self.server.stop(grace=2))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def stub(address: str) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def infer_request(
    name: str, x: np.ndarray, *, version: str = "", raw: bool = False
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=name, model_version=version)
    tensor = request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    if raw:
        request.raw_input_contents.append(x.astype("<f4").tobytes())
    else:
        tensor.contents.fp32_contents.extend(x.ravel().tolist())
    return request


def probabilities(response: pb.ModelInferResponse) -> np.ndarray:
    out = response.outputs[0]
    if response.raw_output_contents:
        flat = np.frombuffer(response.raw_output_contents[0], dtype="<f4")
    else:
        flat = np.asarray(out.contents.fp32_contents, dtype=np.float32)
    return flat.reshape(tuple(out.shape))


def wait_for_port(port: int, timeout: float, process: Any) -> None:
    """Until something listens on ``port``; fails early if ``process`` exits."""
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = process.stdout.read() if process.stdout else ""
            raise AssertionError(f"the server exited with {process.returncode}: {output[-3000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on {port} after {timeout} s")


def wait_for(condition: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {message}")
        time.sleep(0.1)
