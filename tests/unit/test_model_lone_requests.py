"""svc_model's core decides when a request is alone: with nothing to merge
it with, a merging version runs it on the event loop (no hand-over to the
instance thread and back); requests that arrive together, and every request
while the server has lately had company, go through the batcher and merge."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CollectorRegistry

from shared.contracts.aistack.v1 import models_pb2
from shared.contracts.inference import grpc_predict_v2_pb2 as pb
from shared.model_loading import Runner, TensorSig
from svc_model.batching import Batcher
from svc_model.inference import InferenceCore
from svc_model.loading import Loaded
from svc_model.metrics import ModelMetrics
from svc_model.repository import Served
from svc_model.settings import ModelSettings

SIG = (TensorSig("x", "FP32", (-1, 3)),)
OUT = (TensorSig("y", "FP32", (-1, 3)),)


class Model:
    """Doubles its input; records the thread and the rows of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __call__(self, inputs: Any) -> dict[str, Any]:
        self.calls.append((threading.current_thread().name, len(inputs["x"])))
        return {"y": inputs["x"] * 2}


class OneVersion:
    """Stands in for svc_model's Loader (which fetches and loads an artifact):
    version 1 of ``m``, a merging batcher that may run lone requests inline."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def load(self, event: models_pb2.ModelReady) -> Served:
        runner = Runner(SIG, OUT, self.model, "python")
        batcher = Batcher(
            runner.run,
            ThreadPoolExecutor(1, thread_name_prefix="instance"),
            max_batch_size=8,
            lone_inline=True,
        )
        return Served(name="m", version=1, event=event, executor=Loaded(runner, batcher))


def request(value: float) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="x", datatype="FP32", shape=[1, 3])
    tensor.contents.fp32_contents.extend([value] * 3)
    return message


def test_a_lone_request_runs_on_the_loop_and_requests_together_merge() -> None:
    model = Model()

    async def scenario() -> tuple[str, list[Any]]:
        core = InferenceCore(
            ModelSettings(prediction_log_entity_fraction=0, prediction_log_tensor_fraction=0),
            OneVersion(model),  # type: ignore[arg-type]
            ThreadPoolExecutor(1),
            ModelMetrics.create(CollectorRegistry()),
        )
        await core.offer(models_pb2.ModelReady(model_name="m", version="1"))
        alone = await core.infer(request(1))
        together = await asyncio.gather(*(core.infer(request(v)) for v in (2, 3, 4, 5)))
        after = await core.infer(request(6))  # alone, but the server just had company
        return threading.current_thread().name, [alone, *together, after]

    loop_thread, responses = asyncio.run(scenario())
    values = [list(r.outputs[0].contents.fp32_contents) for r in responses]
    assert values == [[2.0 * v] * 3 for v in (1, 2, 3, 4, 5, 6)]
    assert model.calls[0] == (loop_thread, 1)
    # The four arrived together: none on the loop, and those queued behind
    # the first merged.
    assert all(thread == "instance_0" for thread, _ in model.calls[1:])
    assert sorted(rows for _, rows in model.calls[1:-1]) == [1, 3]
    assert model.calls[-1] == ("instance_0", 1)
