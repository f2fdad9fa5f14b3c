"""``python -m svc_monitor``'s champion rule on the real broker: three digits
models, each a champion and a challenger in its shadow on the same requests,
labelled by users on the label topic. A challenger better on that traffic is
promoted, a worse one is not, a champion degraded past its validation value
is reported and rolled back to the version before it; the registry (read as
every service reads it) serves what the decisions chose, and the pure rule
replayed over the joined topic decides the same."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared import model_registry
from shared.bus.consumer import read_to_end
from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import monitoring_pb2, predictions_pb2
from shared.contracts.aistack.v1.monitoring_pb2 import (
    DECISION_KIND_DEGRADED,
    DECISION_KIND_KEEP,
    DECISION_KIND_PROMOTE,
    DECISION_KIND_ROLLBACK,
)
from shared.contracts.aistack.v1.predictions_pb2 import (
    PREDICTION_ROLE_CHAMPION,
    PREDICTION_ROLE_SHADOW,
)
from svc_monitor.champion import Referee
from svc_monitor.settings import MonitorSettings
from tests.infra import Infra, wait_until
from tests.integration import test_monitor
from tests.integration.test_monitor import MonitorProcess, monitor_settings
from tests.model_events import ready, retuned
from tests.unit.test_monitor_join import digits_prediction, label

pytestmark = pytest.mark.integration

launch = test_monitor.launch

REQUESTS = 60

#: model -> (its versions, (champion, wrong every k-th), (shadow, wrong every k-th))
CASES = {
    # 2 lost to 1 on validation; live it errs a twentieth as often as 1's third.
    "better": (
        [ready(1, 0.4, name="better"), retuned(2, 0.5, 1, 0.4, name="better")],
        ("1", 3),
        ("2", 20),
    ),
    "worse": (
        [ready(1, 0.1, name="worse"), retuned(2, 0.5, 1, 0.4, name="worse")],
        ("1", 10),
        ("2", 3),
    ),
    # 2 beat 1 on validation (0.05) and serves; live it errs every other time.
    "degraded": (
        [ready(1, 0.1, name="degraded"), ready(2, 0.05, name="degraded")],
        ("2", 2),
        ("1", 10),
    ),
}


@pytest.fixture
def settings(infra: Infra, unique: str) -> MonitorSettings:
    return monitor_settings(infra, unique, champion_min_pairs=REQUESTS, champion_alpha=0.01)


def served(
    model: str, request: int, version: str, every: int, role: int
) -> predictions_pb2.PredictionLogged:
    truth = request % 10
    guess = (truth + 1) % 10 if request % every == 0 else truth
    logged = digits_prediction(f"{model}-{request}", guess, version=version, role=role)  # type: ignore[arg-type]
    logged.model_name = model
    return logged


def decisions(settings: MonitorSettings) -> list[monitoring_pb2.ChampionDecision]:
    records = read_to_end(
        settings.kafka, settings.decisions_topic, monitoring_pb2.ChampionDecision, 30
    )
    return [r.decode() for r in records]


def test_live_traffic_promotes_a_better_challenger_keeps_a_worse_out_and_rolls_back(
    infra: Infra, settings: MonitorSettings, launch: list[MonitorProcess], tmp_path: Path
) -> None:
    with BusProducer(infra.kafka, source="tests") as producer:
        for versions, _, _ in CASES.values():
            for event in versions:
                producer.publish(
                    settings.models_topic, event, key=f"{event.model_name}/{event.version}"
                )
        producer.flush()
    before = model_registry.read(infra.kafka, settings.models_topic, 30)
    assert [before.serving(m, "champion").version for m in CASES] == ["1", "1", "2"]

    monitor = MonitorProcess(infra, settings, tmp_path / "monitor.log")
    launch.append(monitor)
    monitor.wait_started()
    with BusProducer(infra.kafka, source="tests") as producer:
        for model, (_, (champion, c_every), (shadow, s_every)) in CASES.items():
            for request in range(1, REQUESTS + 1):
                for logged in (
                    served(model, request, champion, c_every, PREDICTION_ROLE_CHAMPION),
                    served(model, request, shadow, s_every, PREDICTION_ROLE_SHADOW),
                ):
                    producer.publish(settings.predictions_topic, logged, key=logged.request_id)
        producer.flush()
        for model in CASES:
            for request in range(1, REQUESTS + 1):
                truth = label(f"{model}-{request}", request % 10, request)
                truth.model_name = model
                producer.publish(settings.labels_topic, truth, key=truth.request_id)
        producer.flush()

    def kinds() -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for decision in decisions(settings):
            found.setdefault(decision.model_name, []).append(decision.kind)
        return found

    expected = {
        "better": [DECISION_KIND_PROMOTE],
        "worse": [DECISION_KIND_KEEP],
        "degraded": [DECISION_KIND_DEGRADED, DECISION_KIND_ROLLBACK],
    }
    wait_until(lambda: kinds() == expected, 90, "the decisions were not published")
    by_model = {d.model_name: d for d in decisions(settings)}
    promoted, kept, rolled_back = (by_model[m] for m in CASES)
    assert (promoted.chosen_version, promoted.pairs) == ("2", REQUESTS)
    assert promoted.challenger_error < promoted.champion_error
    assert promoted.p_value < 0.01
    assert kept.chosen_version == "1" and kept.p_value > 0.01
    assert rolled_back.chosen_version == "1" and rolled_back.sequence == 1

    # Every reader of the registry now serves what the decisions chose.
    def serving() -> list[str]:
        registry = model_registry.read(infra.kafka, settings.models_topic, 30)
        return [registry.serving(m, "champion").version for m in CASES]

    wait_until(lambda: serving() == ["2", "1", "1"], 60, "the registry did not follow")
    assert monitor.terminate() == 0

    # The command shows each version's role and the last decision, and why.
    listed = subprocess.run(
        [sys.executable, "-m", "aistack.cli", "models", "list", "better"],
        env={
            **os.environ,
            "AISTACK_KAFKA_BOOTSTRAP": infra.kafka.bootstrap,
            "AISTACK_LINEAGE_MODELS_TOPIC": settings.models_topic,
            "AISTACK_LINEAGE_PERFORMANCE_TOPIC": settings.performance_topic,
            "AISTACK_LINEAGE_DECISIONS_TOPIC": settings.decisions_topic,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert "better@2     serving" in listed.stdout
    assert "better: last decision promote (serving 2, " in listed.stdout
    assert promoted.reason in listed.stdout

    # The rule replayed over the joined topic decides the same, ids and numbers.
    registry = model_registry.read(infra.kafka, settings.models_topic, 30)

    def lookup(name: str, version: str):  # type: ignore[no-untyped-def]
        return registry.version(name, version)

    referee = Referee(settings.rule(), lookup)
    joined = read_to_end(
        settings.kafka, settings.joined_topic, predictions_pb2.PredictionJoined, 30
    )
    replayed = [d for record in joined for d in referee.add(record.decode())]
    assert sorted(d.decision_id for d in replayed) == sorted(
        d.decision_id for d in decisions(settings)
    )
