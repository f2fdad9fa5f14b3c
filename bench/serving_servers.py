"""The served side of bench.serving: the model exported by svc_trainer's own
code, the ModelReady event that tells svc_model about it, and the server
processes (svc_model as deployed, and KServe's ModelServer in
bench.serving_kserve).

Only the standard library and numpy at module level, as in
bench.serving_callers: bench.serving imports this module, and its spawned
client processes import bench.serving again.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from bench.harness import (
    child_env,
    kafka_settings,
    python_module,
    read_metric,
    redis_settings,
    spawn,
)
from bench.serving_callers import CHECK_IMAGES, MODEL
from shared.ports import free_port

AISTACK_BATCHED = "aistack batched"
AISTACK_UNBATCHED = "aistack unbatched"
AISTACK_LOG_OFF = "aistack batched log-off"
AISTACK_UNBATCHED_LOG_OFF = "aistack unbatched log-off"
AISTACK_UNBATCHED_UNTRACED = "aistack unbatched log-off untraced"
AISTACK_SHADOWED = "aistack batched shadowed"
KSERVE = "kserve"


def shadowed_topic(models_topic: str) -> str:
    """The models topic of the shadowed server: the same version 1, and a
    version 2 marked a challenger."""
    return f"{models_topic}-shadowed"


@dataclass(frozen=True)
class Exported:
    directory: Path
    path: Path
    sha256: str
    size: int
    images: np.ndarray
    expected: np.ndarray  # the in-process probabilities of the first CHECK_IMAGES images


def export_model(directory: Path) -> Exported:
    import torch

    from shared.artifacts import digest
    from svc_trainer.backends.torch import models as torch_models
    from svc_trainer.backends.torch import runner as torch_runner
    from svc_trainer.data import datasets
    from svc_trainer.plan import Hyperparams

    data = datasets.load("digits", {})
    torch.manual_seed(0)
    model = torch_models.build("cnn", Hyperparams(), data)
    path = torch_runner.export(model, data, directory)
    sha, size = digest(directory)
    images = np.ascontiguousarray(data.x_test[:64], dtype=np.float32)
    module = torch.export.load(str(path)).module()
    with torch.inference_mode():
        expected = np.concatenate(
            [module(torch.from_numpy(images[i][None])).numpy() for i in range(CHECK_IMAGES)]
        )
    return Exported(directory, path, sha, size, images, expected)


def publish_model(topics: tuple[str, str, str], exported: Exported) -> None:
    """The ModelReady event svc_trainer would publish, on this run's own topic."""
    from shared.bus.producer import BusProducer
    from shared.bus.topics import (
        EVENTS_DLQ,
        MODELS_READY,
        PREDICTIONS,
        TOPICS_BY_NAME,
        ensure_topics,
    )
    from shared.contracts.aistack.v1 import common_pb2, models_pb2

    kafka = kafka_settings()
    from shared.model_registry import CHALLENGER_LABEL

    models_topic, dlq_topic, predictions_topic = topics
    ensure_topics(
        kafka,
        [
            TOPICS_BY_NAME[MODELS_READY].named(models_topic),
            TOPICS_BY_NAME[MODELS_READY].named(shadowed_topic(models_topic)),
            TOPICS_BY_NAME[EVENTS_DLQ].named(dlq_topic),
            TOPICS_BY_NAME[PREDICTIONS].named(predictions_topic),
        ],
    )
    ready = models_pb2.ModelReady(
        model_name=MODEL,
        version="1",
        framework=common_pb2.FRAMEWORK_TORCH,
        format=models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT,
        artifact_uri=exported.directory.as_uri(),
        sha256=exported.sha256,
        size_bytes=exported.size,
        inputs=[models_pb2.TensorSpec(name="input", datatype="FP32", shape=[-1, 8, 8])],
        outputs=[models_pb2.TensorSpec(name="probabilities", datatype="FP32", shape=[-1, 10])],
        objective=common_pb2.Objective(metric="val_error", direction=common_pb2.DIRECTION_MINIMIZE),
    )
    ready.metrics["val_error"] = 0.1
    # The same model again as version 2, worse on validation (it does not
    # serve) and marked a challenger: it runs in version 1's shadow.
    challenger = models_pb2.ModelReady()
    challenger.CopyFrom(ready)
    challenger.version = "2"
    challenger.metrics["val_error"] = 0.2
    challenger.labels[CHALLENGER_LABEL] = "true"
    with BusProducer(kafka, source="bench") as producer:
        producer.publish(models_topic, ready, key=f"{ready.model_name}/{ready.version}")
        for event in (ready, challenger):
            key = f"{event.model_name}/{event.version}"
            producer.publish(shadowed_topic(models_topic), event, key=key)
        producer.flush()


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    metrics_port: int = 0
    _handle: IO[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def wait_for_port(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: nothing listens on {self.port} after {timeout} s")

    def logged(self) -> tuple[float, float]:
        """(records logged, records dropped) so far by svc_model's prediction log."""
        logged = read_metric(self.metrics_port, "aistack_model_predictions_logged_total")
        text = "aistack_model_prediction_log_dropped_total"
        dropped = sum(
            read_metric(self.metrics_port, f'{text}{{reason="{reason}"}}')
            for reason in ("queue_full", "delivery_failed", "unencodable")
        )
        return logged, dropped

    def mean_batch(self) -> tuple[float, float]:
        """(rows, executions) so far, off svc_model's batch-size histogram."""
        rows = read_metric(self.metrics_port, f'aistack_model_batch_size_sum{{model="{MODEL}"}}')
        runs = read_metric(self.metrics_port, f'aistack_model_batch_size_count{{model="{MODEL}"}}')
        return rows, runs

    def give_model(self, path: Path) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(f"{path}\n".encode())
            self.process.stdin.close()
        except BrokenPipeError as exc:
            raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}") from exc

    def ask_to_stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: both servers drain and exit

    def wait(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        if self._handle is not None:
            self._handle.close()


def _start(
    name: str, command: list[str], env: dict[str, str], state: Path, port: int, stdin: bool = False
) -> Server:
    log = state / f"{name.replace(' ', '-')}.log"
    handle = log.open("wb")
    process = spawn(command, env, handle, stdin=stdin)
    return Server(name, port, process, log, _handle=handle)


def start_aistack(name: str, topics: tuple[str, str, str], state: Path, threads: int) -> Server:
    """svc_model as ``name`` says: batched or not, and the prediction log on
    for every request (the worst case of its cost; this run's own topic) or
    off (the ``log-off`` names); ``untraced`` runs the exported program
    itself, as KServe's ``predict`` does, not TorchScript traced from it;
    ``shadowed`` serves version 1 with version 2 as its challenger (the
    shadow share svc_model's default, AISTACK_MODEL_SHADOW_FRACTION)."""
    port, metrics_port = free_port(), free_port()
    unbatched = (AISTACK_UNBATCHED, AISTACK_UNBATCHED_LOG_OFF, AISTACK_UNBATCHED_UNTRACED)
    batching = name not in unbatched
    log_off = (AISTACK_LOG_OFF, AISTACK_UNBATCHED_LOG_OFF, AISTACK_UNBATCHED_UNTRACED)
    log_fraction = "0" if name in log_off else "1.0"
    directory = state / name.replace(" ", "-")
    directory.mkdir()
    env = child_env(
        {
            "AISTACK_STATE_DIR": str(directory),
            "AISTACK_LOG_LEVEL": "WARNING",
            "AISTACK_MODEL_GRPC_ADDRESS": f"127.0.0.1:{port}",
            "AISTACK_MODEL_MODELS_TOPIC": (
                shadowed_topic(topics[0]) if name == AISTACK_SHADOWED else topics[0]
            ),
            "AISTACK_MODEL_DLQ_TOPIC": topics[1],
            "AISTACK_MODEL_METRICS_PORT": str(metrics_port),
            "AISTACK_MODEL_BATCHING": "true" if batching else "false",
            "AISTACK_MODEL_INTRA_OP_THREADS": str(threads),
            "AISTACK_MODEL_PREDICTION_LOG_TOPIC": topics[2],
            "AISTACK_MODEL_PREDICTION_LOG_TENSOR_FRACTION": log_fraction,
            "AISTACK_MODEL_PREDICTION_LOG_ENTITY_FRACTION": log_fraction,
            "AISTACK_MODEL_TRACE_EXPORTED": str(name != AISTACK_UNBATCHED_UNTRACED).lower(),
        },
        kafka=kafka_settings(),
        redis=redis_settings(),
    )
    server = _start(name, python_module("svc_model"), env, state, port)
    server.metrics_port = metrics_port
    return server


def start_kserve(state: Path, threads: int) -> Server:
    """KServe's server, importing; ``Server.give_model`` tells it what to load.

    A process of its own: kserve registers the protobuf package ``inference``,
    as aistack's contracts and tritonclient do, and two in one process clash."""
    port = free_port()
    command = python_module(
        "bench.serving_kserve",
        "--model_path",
        "-",
        "--name",
        MODEL,
        "--grpc_port",
        str(port),
        "--http_port",
        str(free_port()),
        "--threads",
        str(threads),
    )
    return _start(KSERVE, command, child_env({}), state, port, stdin=True)
