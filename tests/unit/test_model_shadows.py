"""svc_model runs a model's challengers in its champion's shadow: on a
sampled copy of the champion's requests, after the caller has its answer;
the caller gets the champion's outputs and status whatever a challenger
does, and both predictions are logged under one request id with their role."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from shared import model_registry
from shared.contracts.aistack.v1 import models_pb2
from shared.contracts.aistack.v1 import predictions_pb2 as roles
from shared.contracts.inference import grpc_predict_v2_pb2 as pb
from shared.model_loading import Runner, TensorSig
from svc_model.batching import Batcher
from svc_model.inference import InferenceCore
from svc_model.loading import Loaded
from svc_model.metrics import ModelMetrics
from svc_model.prediction_log import Prediction
from svc_model.repository import Served
from svc_model.settings import ModelSettings
from tests.model_events import ready

SIG = (TensorSig("x", "FP32", (-1, 3)),)
OUT = (TensorSig("y", "FP32", (-1, 3)),)


def times(factor: float) -> Any:
    return lambda inputs: {"y": inputs["x"] * factor}


def fails(inputs: Any) -> Any:
    raise RuntimeError("the challenger is broken")


class Versions:
    """Stands in for svc_model's Loader: version v of ``m`` runs ``models[v]``."""

    def __init__(self, models: dict[int, Any]) -> None:
        self.models = models

    def load(self, event: models_pb2.ModelReady) -> Served:
        version = int(event.version)
        runner = Runner(SIG, OUT, self.models[version], "python")
        batcher = Batcher(runner.run, ThreadPoolExecutor(1), max_batch_size=8)
        return Served(name="m", version=version, event=event, executor=Loaded(runner, batcher))


class Log:
    """Stands in for the prediction log: samples nothing by itself."""

    def __init__(self) -> None:
        self.offered: list[Prediction] = []

    def sampled(self, by_entity: bool) -> bool:
        return False

    def offer(self, prediction: Prediction) -> None:
        self.offered.append(prediction)


def challenger(version: int, value: float) -> models_pb2.ModelReady:
    event = ready(version, value)
    event.labels[model_registry.CHALLENGER_LABEL] = "true"
    return event


def request(value: float, version: str = "") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", model_version=version, id=f"r{value}")
    tensor = message.inputs.add(name="x", datatype="FP32", shape=[1, 3])
    tensor.contents.fp32_contents.extend([value] * 3)
    return message


def outputs(response: pb.ModelInferResponse) -> list[float]:
    return list(response.outputs[0].contents.fp32_contents)


def core_with(
    models: dict[int, Any], log: Log, registry: CollectorRegistry, **settings: Any
) -> InferenceCore:
    return InferenceCore(
        ModelSettings(**{"shadow_fraction": 1.0, **settings}),
        Versions(models),  # type: ignore[arg-type]
        ThreadPoolExecutor(1),
        ModelMetrics.create(registry),
        prediction_log=log,  # type: ignore[arg-type]
    )


async def settle(core: InferenceCore) -> None:
    """Until every shadow run has finished."""
    while core._shadow_tasks:
        await asyncio.gather(*core._shadow_tasks)


def shadow_runs(registry: CollectorRegistry, outcome: str) -> float:
    value = registry.get_sample_value(
        "aistack_model_shadow_runs_total", {"model": "m", "outcome": outcome}
    )
    return value or 0.0


def test_the_caller_gets_the_champion_and_both_predictions_are_logged_with_their_role() -> None:
    log, registry = Log(), CollectorRegistry()

    async def scenario() -> tuple[pb.ModelInferResponse, pb.ModelInferResponse]:
        core = core_with({1: times(2), 2: times(3)}, log, registry)
        await core.replay([ready(1, 0.1), challenger(2, 0.2)])
        served = await core.infer(request(1.0))
        named = await core.infer(request(5.0, version="2"))  # named: no shadow
        await settle(core)
        return served, named

    served, named = asyncio.run(scenario())
    assert (served.model_version, outputs(served)) == ("1", [2.0, 2.0, 2.0])
    assert (named.model_version, outputs(named)) == ("2", [15.0, 15.0, 15.0])
    logged = [(p.request_id, p.model_version, p.role) for p in log.offered]
    assert logged == [
        ("r1.0", "1", roles.PREDICTION_ROLE_CHAMPION),
        ("r1.0", "2", roles.PREDICTION_ROLE_SHADOW),
    ]
    shadow = log.offered[1]
    np.testing.assert_allclose(shadow.outputs["y"], [[3.0, 3.0, 3.0]])
    assert shadow.output_names == ("y",) and shadow.tensors[0].name == "x"
    assert shadow_runs(registry, "ok") == 1


def test_a_failing_challenger_fails_nothing_the_caller_sees() -> None:
    log, registry = Log(), CollectorRegistry()

    async def scenario() -> list[pb.ModelInferResponse]:
        core = core_with({1: times(2), 2: fails}, log, registry)
        await core.replay([ready(1, 0.1), challenger(2, 0.2)])
        answers = [await core.infer(request(v)) for v in (1.0, 2.0)]
        await settle(core)
        return answers

    answers = asyncio.run(scenario())
    assert [outputs(a) for a in answers] == [[2.0] * 3, [4.0] * 3]
    assert [p.role for p in log.offered] == [roles.PREDICTION_ROLE_CHAMPION] * 2
    assert shadow_runs(registry, "failed") == 2


def test_past_the_in_flight_limit_a_shadow_is_skipped_and_counted() -> None:
    log, registry = Log(), CollectorRegistry()

    async def scenario() -> None:
        core = core_with({1: times(2), 2: times(3)}, log, registry, shadow_max_in_flight=1)
        await core.replay([ready(1, 0.1), challenger(2, 0.2)])
        await asyncio.gather(*(core.infer(request(v)) for v in (1.0, 2.0, 3.0)))
        await settle(core)

    asyncio.run(scenario())
    assert shadow_runs(registry, "ok") + shadow_runs(registry, "skipped") == 3
    assert shadow_runs(registry, "skipped") >= 1
    shadows = [p for p in log.offered if p.role == roles.PREDICTION_ROLE_SHADOW]
    assert len(shadows) == shadow_runs(registry, "ok")


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"shadow_fraction": 0.0}, "shadows off"),
        ({"serving": {"challengers": 0}}, "no challengers"),
    ],
)
def test_without_shadows_no_challenger_runs(settings: dict[str, Any], why: str) -> None:
    log, registry = Log(), CollectorRegistry()

    async def scenario() -> list[int]:
        core = core_with({1: times(2), 2: times(3)}, log, registry, **settings)
        await core.replay([ready(1, 0.1), challenger(2, 0.2)])
        await core.infer(request(1.0))
        await settle(core)
        return core.repository.loaded_versions("m")

    loaded = asyncio.run(scenario())
    assert log.offered == [], why
    assert shadow_runs(registry, "ok") == 0
    assert loaded == [1, 2]  # the newest kept versions load all the same


def test_a_challenger_marked_later_is_loaded_kept_and_run() -> None:
    log, registry = Log(), CollectorRegistry()

    async def scenario() -> list[int]:
        core = core_with({1: times(2), 2: times(3), 3: times(4), 4: times(5)}, log, registry)
        await core.replay([ready(v, 0.1 * v) for v in (1, 2, 3, 4)])  # keeps 1, 3, 4
        await core.offer(challenger(2, 0.2))  # version 2, marked: loaded again
        await core.infer(request(1.0))
        await settle(core)
        return core.repository.loaded_versions("m")

    assert asyncio.run(scenario()) == [1, 2, 3, 4]
    assert [(p.model_version, p.role) for p in log.offered] == [
        ("1", roles.PREDICTION_ROLE_CHAMPION),
        ("2", roles.PREDICTION_ROLE_SHADOW),
    ]


def test_shadows_that_arrive_together_reach_the_challenger_together() -> None:
    """They wait for the challenger's next gate and merge in its batcher: no
    one-row execution per request (bench.serving's shadow_cost)."""
    log, registry = Log(), CollectorRegistry()
    calls: list[int] = []

    def challenger_model(inputs: Any) -> dict[str, Any]:
        calls.append(len(inputs["x"]))
        return {"y": inputs["x"] * 3}

    async def scenario() -> None:
        core = core_with({1: times(2), 2: challenger_model}, log, registry)
        await core.replay([ready(1, 0.1), challenger(2, 0.2)])
        for value in range(8):
            await core.infer(request(float(value)))  # one after another, as callers do
        await settle(core)

    asyncio.run(scenario())
    assert sum(calls) == 8
    assert len(calls) <= 2, calls  # the first alone at most, the rest merged
    shadows = [p for p in log.offered if p.role == roles.PREDICTION_ROLE_SHADOW]
    assert sorted(p.request_id for p in shadows) == sorted(f"r{float(v)}" for v in range(8))
    for p in shadows:  # each row back to its own request
        value = float(p.request_id[1:])
        np.testing.assert_allclose(p.outputs["y"], [[3 * value] * 3])
