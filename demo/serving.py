"""Step 6 of ``aistack demo``: the best models served, called over gRPC as a
client would, on held-out digits and on an entity's latest window in Redis."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compose.stack import ServiceStack
from demo.console import Console, ServiceDied, Summary, percentile
from shared.feature_store import ONLINE_KEY_PREFIX, online_field, online_key

if TYPE_CHECKING:
    from demo.run import StudyOutcome

#: The online feature the demo's forecaster is fed by entity.
FORECAST_FEATURE = online_field("temperature", "tumbling-60s")


@dataclass
class ServingStep:
    stack: ServiceStack
    console: Console
    summary: Summary
    #: ``wait(what, probe, timeout, show)``: the demo's wait, which also
    #: watches the services.
    wait: Callable[[str, Callable[[], Any], float, Callable[[], str]], Any]

    def run(self, digits: StudyOutcome, forecast: StudyOutcome) -> str | None:
        """Serve and call the best models; the request id of the prediction
        by entity (its lineage goes into the report), None without one."""
        self.console.step(6, "the best model, served: predictions over gRPC")
        if digits.best is None:
            raise ServiceDied("the digits study completed no trial: nothing to serve")

        from shared.contracts.inference import grpc_predict_v2_pb2_grpc as pb_grpc

        with self.stack.model().open_sync() as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            self._predict_digits(stub, digits)
            if forecast.best is not None:
                return self._predict_entity(stub, forecast)
        return None

    def _predict_digits(self, stub: Any, digits: StudyOutcome) -> None:
        import numpy as np

        from shared import digits as digits_data

        name, best_value = digits.best.model_name, digits.best.value
        probe_x = np.zeros((1, 8, 8), dtype=np.float32)
        served: dict[str, str] = {}

        def champion() -> str | None:
            try:
                version = stub.ModelInfer(_request(name, probe_x), timeout=10).model_version
            except Exception as exc:  # not loaded yet: NOT_FOUND, or the server starting
                served["state"] = getattr(exc, "code", lambda: "waiting")()
                return None
            served["state"] = f"serving version {version}"
            # The champion rule is the study's best-trial rule (shared.objective).
            return version if version == digits.best.model_version else None

        version = self.wait(
            f"{name} to be served", champion, 300, lambda: f"{name}: {served.get('state', '…')}"
        )
        data = digits_data.load(seed=0)
        x_test, y_test = data.x[data.test], data.y[data.test]
        latencies, correct = [], 0
        for x, y in zip(x_test, y_test, strict=True):
            started = time.perf_counter()
            response = stub.ModelInfer(_request(name, x[np.newaxis]), timeout=10)
            latencies.append(time.perf_counter() - started)
            out = np.frombuffer(response.raw_output_contents[0], dtype="<f4")
            correct += int(out.argmax() == y)
        accuracy = correct / len(y_test)
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        self.console.line(
            f"  {name} version {version}: {accuracy:.2%} of {len(y_test)} held-out digits "
            f"right; latency p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms (one digit per call)"
        )
        self.summary.add(
            "served model", f"{name} version {version} ({digits.metric} {best_value:.4f})"
        )
        self.summary.add("held-out accuracy over gRPC", f"{accuracy:.2%} of {len(y_test)}")
        self.summary.add("gRPC latency p50 / p99", f"{p50 * 1000:.2f} ms / {p99 * 1000:.2f} ms")

    def _predict_entity(self, stub: Any, forecast: StudyOutcome) -> str | None:
        import numpy as np

        from shared.contracts.inference import grpc_predict_v2_pb2 as pb
        from shared.feature_store import decode_window
        from shared.redis_client import make_redis

        name = forecast.best.model_name
        redis = make_redis(self.stack.client_redis())
        try:
            entity, window = an_entity(redis, FORECAST_FEATURE)
        finally:
            redis.close()
        if entity is None:
            self.summary.add("prediction by entity", f"no entity has {FORECAST_FEATURE} online")
            return None
        request = pb.ModelInferRequest(model_name=name)
        request.parameters["entity_id"].string_param = entity
        request.parameters["feature"].string_param = FORECAST_FEATURE

        def answer() -> Any:
            try:
                return stub.ModelInfer(request, timeout=10)
            except Exception:
                return None  # the forecaster is still loading

        response = self.wait(f"{name} to answer", answer, 120, lambda: f"{name}: loading")
        out = response.outputs[0]
        if response.raw_output_contents:
            value = float(np.frombuffer(response.raw_output_contents[0], dtype="<f4")[0])
        else:
            value = float(out.contents.fp32_contents[0])
        last = decode_window(window).mean
        self.console.line(
            f"  {name} version {response.model_version}, entity {entity}: next mean "
            f"{value:.2f} (last window's mean {last:.2f}), from its latest window in Redis"
        )
        self.summary.add(
            "prediction by entity", f"{entity}: next mean {value:.2f} (last {last:.2f})"
        )
        request_id: str = response.parameters["request_id"].string_param
        return request_id or None


def _request(name: str, x: Any) -> Any:
    from shared.contracts.inference import grpc_predict_v2_pb2 as pb

    request = pb.ModelInferRequest(model_name=name)
    request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.astype("<f4").tobytes())
    return request


def an_entity(redis: Any, feature: str) -> tuple[str | None, bytes]:
    prefix = ONLINE_KEY_PREFIX
    for key in redis.scan_iter(match=online_key(prefix, "*"), count=500):
        window = redis.hget(key, feature)
        if window is not None:
            return key.decode().removeprefix(prefix), bytes(window)
    return None, b""
