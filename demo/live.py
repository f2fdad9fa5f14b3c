"""Step 7's end under ``AISTACK_MODEL_POLICY=live`` (what the demo runs): the
re-tuned version that won on validation runs in the serving version's shadow,
and live traffic decides. Each round asks the forecaster for every sensor's
next window mean (the champion answers; the re-tuned version runs the same
request in its shadow, both logged), then sends each sensor's readings of
that next minute, near its latest mean (and one reading after them all, so
that Spark's watermark closes those minutes): svc_monitor joins both
forecasts of each request with the window that closed, and the champion rule
judges the pairs. A client's view only: Redis, the Open
Inference Protocol and Kafka.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from compose.stack import ServiceStack
from demo.console import Console, Summary
from demo.serving import FORECAST_FEATURE
from shared.settings import KafkaSettings

#: What the demo sets for its services unless the environment says otherwise:
#: re-tunes serve only on live evidence, every request the champion serves
#: is shadowed (the demo sends few), and the rule judges after 20 pairs.
DEMO_SETTINGS = {
    "AISTACK_MODEL_POLICY": "live",
    "AISTACK_MODEL_SHADOW_FRACTION": "1.0",
    "AISTACK_MONITOR_CHAMPION_MIN_PAIRS": "20",
}
#: Rounds of requests and truths, at most; each adds about one window per
#: sensor, under the drift monitor's horizon (120) over the rounds, so the
#: champion's drift is not reported again meanwhile.
ROUNDS = 2
#: Each sensor's readings in the minute each round sends, and their spread (°C).
READINGS_PER_SENSOR = 3
READING_SPREAD = 0.5
#: Spark's watermark trails the latest event by 30 s: a reading this long
#: after the last minute's end closes every minute sent.
CLOSING_SECONDS = 45
#: Sensors whose latest window ends this long before the newest one are left
#: out (an earlier run's, in a state directory kept between runs).
STALE = timedelta(minutes=10)
#: How long a round waits for the rule's decision.
ROUND_SECONDS = 60
_OVER = object()


@dataclass(frozen=True)
class Latest:
    """A sensor's latest window online: when it ends and its mean."""

    end: datetime
    mean: float


def current(windows: dict[str, Latest]) -> dict[str, Latest]:
    """The sensors of this run: those whose latest window ends within
    ``STALE`` of the newest."""
    if not windows:
        return {}
    newest = max(latest.end for latest in windows.values())
    return {entity: w for entity, w in windows.items() if w.end >= newest - STALE}


def truth_readings(windows: dict[str, Latest], seed: int) -> list[Any]:
    """Each sensor's readings of the minute after its latest window, near its
    mean, as a device sends them (loadgen's JSON), and one after them all."""
    import random
    import uuid

    from loadgen.records import JsonDraft, good

    rng = random.Random(seed)

    def reading(entity: str, moment: datetime, value: float) -> Any:
        event_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        doc = {
            "event_id": event_id,
            "device_id": entity,
            "timestamp": moment.isoformat().replace("+00:00", "Z"),
            "metrics": {"temperature": {"value": round(value, 2), "unit": "C"}},
        }
        return good(JsonDraft(entity.encode(), event_id, doc))

    records = []
    for entity, latest in sorted(windows.items()):
        for i in range(READINGS_PER_SENSOR):
            moment = latest.end + timedelta(seconds=15 * (i + 1))
            records.append(reading(entity, moment, rng.gauss(latest.mean, READING_SPREAD)))
    if windows:
        entity, latest = max(windows.items(), key=lambda item: item[1].end)
        closing = latest.end + timedelta(seconds=60 + CLOSING_SECONDS)
        records.append(reading(entity, closing, latest.mean))
    return records


@dataclass
class LiveStep:
    stack: ServiceStack
    console: Console
    summary: Summary
    kafka: KafkaSettings
    wait: Callable[[str, Callable[[], Any], float, Callable[[], str]], Any]

    def run(self, name: str, serving: str, challenger: str) -> Any:
        """Rounds until the rule decides on ``challenger``; the decision (a
        ``ChampionDecision``), or None when it did not in the rounds."""
        self.console.line(
            f"  version {challenger} runs in version {serving}'s shadow: every forecast request "
            "goes to both, the caller gets the champion's answer"
        )
        from shared.bus.consumer import BusTail
        from shared.bus.topics import MODELS_DECISIONS
        from shared.contracts.aistack.v1 import monitoring_pb2

        # From the topic's end: the decisions on this run's rounds come after.
        decisions = BusTail(
            self.kafka, topics=[MODELS_DECISIONS], message_cls=monitoring_pb2.ChampionDecision
        )
        try:
            for number in range(1, ROUNDS + 1):
                windows = current(self._windows())
                served = self._forecast(name, sorted(windows))
                self._send(truth_readings(windows, seed=number))
                self.console.line(
                    f"  round {number}: {served} sensors' next minute forecast by {name}, then "
                    "each sensor's readings of that minute sent: each forecast meets the window "
                    "it predicted"
                )
                decision = self._decision(decisions, name, challenger, number)
                if decision is not None:
                    self._show(decision)
                    return decision
        finally:
            decisions.close()
        self.console.line(f"  no decision on version {challenger} in {ROUNDS} rounds")
        return None

    def _windows(self) -> dict[str, Latest]:
        """Each sensor with the feature online: its latest window."""
        from shared.feature_store import ONLINE_KEY_PREFIX, decode_window, online_key
        from shared.redis_client import make_redis

        redis = make_redis(self.stack.client_redis())
        found = {}
        try:
            for key in redis.scan_iter(match=online_key(ONLINE_KEY_PREFIX, "*"), count=500):
                raw = redis.hget(key, FORECAST_FEATURE)
                if raw is not None:
                    window = decode_window(cast(bytes, raw))
                    found[key.decode().removeprefix(ONLINE_KEY_PREFIX)] = Latest(
                        window.window_end.ToDatetime(UTC), window.mean
                    )
        finally:
            redis.close()
        return found

    def _forecast(self, name: str, entities: list[str]) -> int:
        import grpc

        from shared.contracts.inference import grpc_predict_v2_pb2 as pb
        from shared.contracts.inference import grpc_predict_v2_pb2_grpc as pb_grpc

        served = 0
        with self.stack.model().open_sync() as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            for entity in entities:
                request = pb.ModelInferRequest(model_name=name)
                request.parameters["entity_id"].string_param = entity
                request.parameters["feature"].string_param = FORECAST_FEATURE
                try:
                    stub.ModelInfer(request, timeout=10)
                    served += 1
                except grpc.RpcError:
                    continue  # an entity the forecaster cannot be fed
        return served

    def _send(self, records: list[Any]) -> None:
        from loadgen.publish import send
        from shared.bus.producer import BusProducer
        from shared.bus.topics import EVENTS_RAW

        producer = BusProducer(self.kafka, source="aistack-demo")
        try:
            send(records, producer, EVENTS_RAW, rate=0)
        finally:
            producer.close()

    def _decision(self, decisions: Any, name: str, challenger: str, round_number: int) -> Any:
        from shared.contracts.aistack.v1 import monitoring_pb2

        judged = (monitoring_pb2.DECISION_KIND_PROMOTE, monitoring_pb2.DECISION_KIND_KEEP)
        found: dict[str, Any] = {}

        def decided() -> Any:
            for record in decisions.poll_batch(500, timeout=0.2):
                decision = record.decode()
                if decision.model_name != name:
                    continue
                if decision.kind == monitoring_pb2.DECISION_KIND_DEGRADED:
                    found.setdefault("degraded", decision)
                elif decision.challenger_version == challenger and decision.kind in judged:
                    found["decision"] = decision
            return found.get("decision")

        deadline = time.monotonic() + ROUND_SECONDS

        def decided_or_over() -> Any:
            decision = decided()
            if decision is None and time.monotonic() > deadline:
                return _OVER
            return decision

        result = self.wait(
            f"the champion rule to judge version {challenger}",
            decided_or_over,
            ROUND_SECONDS + 60,
            lambda: f"{name}: svc_monitor joins round {round_number}'s forecasts with the "
            "windows that close",
        )
        degraded = found.get("degraded")
        if degraded is not None:
            self.console.line(f"  degraded: {degraded.reason}")
        return None if result is _OVER else result

    def _show(self, decision: Any) -> None:
        from shared.contracts.aistack.v1 import monitoring_pb2

        kind = monitoring_pb2.DecisionKind.Name(decision.kind).removeprefix("DECISION_KIND_")
        self.console.line(
            f"  live {decision.metric} on the same {decision.pairs} requests: serving version "
            f"{decision.champion_version} {decision.champion_error:.3f}, version "
            f"{decision.challenger_version} in its shadow {decision.challenger_error:.3f}"
        )
        self.console.line(f"  {kind.lower()}: {decision.reason}")
        self.summary.add(
            f"live {decision.metric} (same {decision.pairs} requests)",
            f"v{decision.champion_version} {decision.champion_error:.3f}, "
            f"v{decision.challenger_version} (shadow) {decision.challenger_error:.3f}: "
            f"{kind.lower()}",
        )
