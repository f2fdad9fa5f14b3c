"""Step 7 of ``aistack demo``: the closed loop. The sensors' temperatures
shift; svc_monitor sees the forecaster's feature drift from the data its
serving version was trained on and says so on aistack.monitoring.drift;
svc_tuner starts a warm-started re-tune on the fresh windows, each trial
measuring the serving version on its own validation split; the champion rule
(shared.objective) decides whether the best new version serves, and the
model server follows it. Under the live policy the demo runs
(``demo.live.DEMO_SETTINGS``) the winner first runs in the serving version's
shadow, and svc_monitor's rule on live traffic promotes it (``demo.live``).

A client's view only: Kafka topics, the tuner's gRPC API and the Open
Inference Protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compose.stack import ServiceStack
from demo.console import Console, ServiceDied, Summary
from demo.live import LiveStep
from demo.report import DRIFT, RETUNE, DemoReport, drift_section
from demo.report import retune as report_retune
from demo.serving import FORECAST_FEATURE, an_entity
from shared.settings import KafkaSettings

if TYPE_CHECKING:
    from demo.run import StudyOutcome

#: The shift: every temperature reading this much warmer (°C), over readings
#: spread across the SHIFT_SPAN_SECONDS up to now, at the first batch's rate.
SHIFT_CELSIUS = 15.0
#: The demo's first readings end this long before they are sent, so that the
#: shifted ones fill the event time after them (Spark's watermark drops
#: readings older than what it has seen) with enough windows to re-tune on.
SHIFT_SPAN_SECONDS = 1200
FIRST_SPAN_SECONDS = 3600


@dataclass
class LoopStep:
    stack: ServiceStack
    console: Console
    summary: Summary
    kafka: KafkaSettings
    #: The demo's wait, which also watches the services.
    wait: Callable[[str, Callable[[], Any], float, Callable[[], str]], Any]
    #: Watches a study until it ends; its outcome.
    finish_study: Callable[[str], StudyOutcome]
    #: ``tuner(call)``: ``call`` with a TunerService stub.
    tuner: Callable[[Callable[[Any], Any]], Any]
    #: Where the drift and the re-tune go for the run's report.
    report: DemoReport | None = None

    def run(self, forecast: StudyOutcome, sensor_events: int) -> None:
        self.console.step(
            7,
            f"the loop: the sensors run {SHIFT_CELSIUS:.0f} °C warmer; drift, a warm-started "
            "re-tune on the fresh windows, and the champion rule decides what serves",
        )
        if forecast.best is None:
            self.summary.add("the loop", "skipped: the forecast study completed no trial")
            if self.report is not None:
                why = "the loop was skipped: the forecast study completed no trial"
                self.report.missing.update({DRIFT: why, RETUNE: why})
            return
        from shared.bus.consumer import BusTail
        from shared.bus.topics import MONITORING_DRIFT
        from shared.contracts.aistack.v1 import monitoring_pb2

        name = forecast.best.model_name
        tail = BusTail(
            self.kafka, topics=[MONITORING_DRIFT], message_cls=monitoring_pb2.DriftDetected
        )
        try:
            self._shift(sensor_events)
            drift = self._drift(tail, name)
        finally:
            tail.close()
        self._show_drift(drift)
        if self.report is not None:
            self.report.drift = drift_section(self.kafka, drift)
        retune_id = f"{forecast.study_id}-retune-1"
        self._retune(retune_id, forecast, drift)

    def _shift(self, sensor_events: int) -> None:
        from loadgen.plan import generate
        from loadgen.publish import send
        from shared.bus.producer import BusProducer
        from shared.bus.topics import EVENTS_RAW

        # The first batch's readings per device per minute, so that only the
        # temperatures move (a window's count is a feature too).
        count = max(400, round(sensor_events * SHIFT_SPAN_SECONDS / FIRST_SPAN_SECONDS))
        records = generate(
            "sensors",
            count,
            seed=int(time.time()) + 7,
            span_seconds=SHIFT_SPAN_SECONDS,
            shift={"temperature": SHIFT_CELSIUS},
        )
        producer = BusProducer(self.kafka, source="aistack-demo")
        try:
            outcome = send(records, producer, EVENTS_RAW, rate=0)
        finally:
            producer.close()
        self.console.line(
            f"  sent {outcome.good} sensor readings of the last {SHIFT_SPAN_SECONDS // 60} "
            f"minutes, temperature +{SHIFT_CELSIUS:.0f} °C"
        )

    def _drift(self, tail: Any, name: str) -> Any:
        seen: dict[str, Any] = {}

        def detected() -> Any:
            for record in tail.poll_batch(500, timeout=0.2):
                event = record.decode()
                if event.model_name == name:
                    seen["event"] = event
            return seen.get("event")

        return self.wait(
            f"svc_monitor to report drift of {name}",
            detected,
            300,
            lambda: f"{name}: waiting for the shifted windows to fill the monitor's horizon",
        )

    def _show_drift(self, drift: Any) -> None:
        drifted = [s for s in drift.scores if s.drifted]
        self.console.line(
            f"  drift: {drift.model_name} version {drift.model_version} on {drift.feature}, "
            f"{len(drifted)} of {len(drift.scores)} statistics over the last "
            f"{drift.thresholds.horizon_windows} windows (trained by {drift.study_id})"
        )
        for score in drift.scores:
            flag = "drifted" if score.drifted else "steady"
            self.console.line(
                f"    {score.statistic:<7} PSI {score.psi:6.2f} (> {drift.thresholds.psi:g})  "
                f"KS {score.ks:.2f} (> {max(drift.thresholds.ks, score.ks_critical):.2f})  {flag}"
            )
        names = ", ".join(s.statistic for s in drifted)
        self.summary.add(
            "drift detected",
            f"{drift.model_name} v{drift.model_version} on {drift.feature}: {names}",
        )

    def _retune(self, retune_id: str, forecast: StudyOutcome, drift: Any) -> None:
        import grpc

        from shared.contracts.aistack.v1 import tuner_service_pb2 as api

        def created() -> Any:
            try:
                return self.tuner(lambda s: s.GetStudy(api.GetStudyRequest(study_id=retune_id)))
            except grpc.RpcError:
                return None

        self.wait(f"the re-tune {retune_id}", created, 120, lambda: f"{retune_id}: not yet")
        self.console.line(f"  re-tune {retune_id} started by drift {drift.drift_id}")
        outcome = self.finish_study(retune_id)
        result = self._result(retune_id)
        retune = result.retune
        metric = forecast.metric or "val_mae"
        serving = retune.serving_value if retune.HasField("serving_value") else float("nan")
        best = result.best_value if result.HasField("best_value") else float("nan")
        self.console.line(
            f"  {metric} on the fresh validation windows: serving version "
            f"{retune.serving_version} {serving:.3f}, re-tuned best "
            f"{result.best_model_name} version {result.best_model_version} {best:.3f}"
        )
        for line in self._warm_start(retune_id, forecast.study_id):
            self.console.line(f"  {line}")
        verdict = "promoted" if retune.promoted else "not promoted"
        self.console.line(f"  {'shadowed' if retune.shadowed else verdict}: {retune.reason}")
        name = retune.model_name or drift.model_name
        promoted = retune.promoted
        if retune.shadowed:
            live = LiveStep(self.stack, self.console, self.summary, self.kafka, self.wait)
            decision = live.run(name, retune.serving_version, result.best_model_version)
            promoted = decision is not None and decision.chosen_version == (
                result.best_model_version
            )
            verdict = "promoted on live traffic" if promoted else "not promoted on live traffic"
        expected = result.best_model_version if promoted else retune.serving_version
        served = self._served_version(name, expected)
        self.console.line(f"  the model server now serves version {served}")
        replayed = self.tuner(lambda s: s.ReplayStudy(api.ReplayStudyRequest(study_id=retune_id)))
        same = sum(t.matches for t in replayed.trials)
        self.console.line(
            f"  replayed from its log (aistack study replay {retune_id}): {same} of "
            f"{len(replayed.trials)} proposals identical"
        )
        if self.report is not None:
            self.report.retune = report_retune(retune_id, metric, result, serving, best, served)
        self.summary.add("re-tune replayed", f"{same} of {len(replayed.trials)} identical")
        counts = ", ".join(f"{state} {n}" for state, n in sorted(outcome.counts.items()))
        self.summary.add("re-tune trials", f"{retune_id}: {counts}")
        self.summary.add(
            f"{metric} before → after (fresh windows)",
            f"{serving:.3f} (v{retune.serving_version}) → "
            f"{best if promoted else serving:.3f} (v{served}, {verdict})",
        )

    def _warm_start(self, retune_id: str, previous_id: str) -> list[str]:
        """Which of the drifted study's trials the re-tune's first ones repeat."""
        from shared.contracts.aistack.v1 import common_pb2
        from shared.contracts.aistack.v1 import tuner_service_pb2 as api

        def trials(study_id: str) -> list[Any]:
            request = api.ListTrialsRequest(study_id=study_id)
            return list(self.tuner(lambda s: s.ListTrials(request)).trials)

        spec = self.tuner(lambda s: s.GetStudy(api.GetStudyRequest(study_id=retune_id))).study.spec
        sign = -1 if spec.objective.direction == common_pb2.DIRECTION_MAXIMIZE else 1
        ranked = sorted(
            (t for t in trials(previous_id) if t.state == api.TRIAL_STATE_COMPLETED),
            key=lambda t: (sign * t.value, t.number),
        )
        warm = min(spec.retune.warm_trials or 3, spec.budget.max_trials, len(ranked))
        lines = [f"its first {warm} trials were {previous_id}'s best {warm}, tried again first:"]
        for trial in sorted(trials(retune_id), key=lambda t: t.number)[:warm]:
            rank = next(
                (i for i, p in enumerate(ranked) if dict(p.params) == dict(trial.params)), None
            )
            was = (
                "none of its trials"
                if rank is None
                else (
                    f"its #{rank + 1}, trial {ranked[rank].number} ({ranked[rank].value:.3f} there)"
                )
            )
            value = f"{trial.value:.3f}" if trial.HasField("value") else "-"
            lines.append(f"  trial {trial.number}: {value} on the fresh windows; was {was}")
        return lines

    def _result(self, study_id: str) -> Any:
        from shared.bus.consumer import read_to_end
        from shared.bus.topics import TUNING_RESULTS
        from shared.contracts.aistack.v1 import tuning_pb2

        def announced() -> Any:
            records = read_to_end(self.kafka, TUNING_RESULTS, tuning_pb2.StudyResult, timeout=30)
            results = [r.decode() for r in records if r.key == study_id.encode()]
            return results[-1] if results else None

        return self.wait(f"{study_id}'s result", announced, 60, lambda: "announcing")

    def _served_version(self, name: str, expected: str) -> str:
        import grpc

        from shared.contracts.inference import grpc_predict_v2_pb2 as pb
        from shared.contracts.inference import grpc_predict_v2_pb2_grpc as pb_grpc
        from shared.redis_client import make_redis

        redis = make_redis(self.stack.client_redis())
        try:
            entity, _ = an_entity(redis, FORECAST_FEATURE)
        finally:
            redis.close()
        if entity is None:
            raise ServiceDied(f"no entity has {FORECAST_FEATURE} online to ask {name}")
        request = pb.ModelInferRequest(model_name=name)
        request.parameters["entity_id"].string_param = entity
        request.parameters["feature"].string_param = FORECAST_FEATURE
        served: dict[str, str] = {}
        with self.stack.model().open_sync() as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]

            def serving() -> str | None:
                try:
                    served["version"] = stub.ModelInfer(request, timeout=10).model_version
                except grpc.RpcError:
                    return None
                return served["version"] if served["version"] == expected else None

            return str(
                self.wait(
                    f"{name} version {expected} to serve",
                    serving,
                    120,
                    lambda: f"{name}: serving {served.get('version', '…')}",
                )
            )
