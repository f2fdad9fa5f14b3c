"""svc_monitor.champion: the champion rule on live traffic, from settled
predictions to decisions (pure; the bus around it is in test_monitor_join's
integration tests)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from shared.contracts.aistack.v1 import monitoring_pb2, predictions_pb2
from shared.contracts.aistack.v1.monitoring_pb2 import (
    DECISION_KIND_DEGRADED,
    DECISION_KIND_KEEP,
    DECISION_KIND_PROMOTE,
    DECISION_KIND_ROLLBACK,
)
from shared.contracts.aistack.v1.predictions_pb2 import (
    PREDICTION_ROLE_CHAMPION,
    PREDICTION_ROLE_NAMED,
    PREDICTION_ROLE_SHADOW,
)
from svc_monitor.champion import Referee, Rule, wilcoxon_less
from tests.model_events import ready

RULE = Rule(min_pairs=50, alpha=0.01, margin=0.5)


def settled(
    request: int, version: int, role: int, error: float, *, model: str = "m"
) -> predictions_pb2.PredictionJoined:
    joined = predictions_pb2.PredictionJoined(
        join_id=f"{model}/{version}/{request}",
        request_id=f"r{request}",
        model_name=model,
        model_version=str(version),
        role=role,  # type: ignore[arg-type]
        outcome=predictions_pb2.JOIN_OUTCOME_JOINED,
        metric="error",
        error=error,
    )
    joined.truth_time.FromSeconds(1_800_000_000 + request)
    return joined


def traffic(
    start: int,
    count: int,
    champion: tuple[int, float],
    shadows: dict[int, float],
    seed: int = 0,
) -> list[predictions_pb2.PredictionJoined]:
    """``count`` requests from ``start``, each served by the champion and run
    by each shadow; each version wrong (error 1) at its own rate."""
    rng = np.random.default_rng(seed)
    events = []
    for request in range(start, start + count):
        version, rate = champion
        events.append(settled(request, version, PREDICTION_ROLE_CHAMPION, rng.random() < rate))
        for shadow, shadow_rate in shadows.items():
            events.append(
                settled(request, shadow, PREDICTION_ROLE_SHADOW, rng.random() < shadow_rate)
            )
    return events


def lookup(values: dict[int, float]):  # type: ignore[no-untyped-def]
    def find(name: str, version: str):  # type: ignore[no-untyped-def]
        value = values.get(int(version))
        return None if value is None else ready(version, value, name=name)

    return find


def run(
    referee: Referee, events: list[predictions_pb2.PredictionJoined]
) -> list[monitoring_pb2.ChampionDecision]:
    return [decision for event in events for decision in referee.add(event)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_signed_rank_test_is_scipys_normal_approximation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # Ties and zeros, as 0/1 errors and rounded values make them.
    differences = np.round(rng.normal(-0.1, 1.0, size=300), 1)
    expected = stats.wilcoxon(
        differences, zero_method="wilcox", correction=True, alternative="less", method="approx"
    ).pvalue
    assert wilcoxon_less(differences) == pytest.approx(expected, rel=1e-9)
    assert wilcoxon_less(np.zeros(10)) == 1.0


def test_a_challenger_better_on_the_same_requests_is_promoted_with_its_numbers() -> None:
    # 1 validated at 0.4: half wrong live is within its margin, not degraded.
    referee = Referee(RULE, lookup({1: 0.4, 2: 0.1}))
    events = traffic(0, 200, champion=(1, 0.5), shadows={2: 0.1})
    decisions = run(referee, events)
    promoted = decisions[0]
    assert promoted.kind == DECISION_KIND_PROMOTE and len(decisions) == 1
    assert (promoted.champion_version, promoted.challenger_version, promoted.chosen_version) == (
        "1",
        "2",
        "2",
    )
    assert promoted.pairs == RULE.min_pairs and promoted.sequence == 1
    assert promoted.newest_version == "2" and promoted.metric == "error"
    assert promoted.challenger_error < promoted.champion_error
    assert promoted.p_value < RULE.alpha and promoted.alpha == RULE.alpha
    assert "beat the champion on 50 requests" in promoted.reason
    # The requests the old champion still served after the decision count for nothing.
    assert run(referee, traffic(200, 100, champion=(1, 0.5), shadows={2: 0.1})) == []


def test_a_challenger_not_better_is_kept_out_and_judged_again_after_as_many_more() -> None:
    referee = Referee(RULE, lookup({1: 0.3, 2: 0.1}))
    decisions = run(referee, traffic(0, 150, champion=(1, 0.3), shadows={2: 0.35}))
    assert [d.kind for d in decisions] == [DECISION_KIND_KEEP] * 3
    assert [d.pairs for d in decisions] == [50, 100, 150]
    assert all(d.chosen_version == "1" and d.sequence == 0 for d in decisions)
    assert "did not beat the champion" in decisions[0].reason
    # A version served by name, and a settlement with no truth, are no pairs.
    named = settled(999, 2, PREDICTION_ROLE_NAMED, 0.0)
    assert referee.add(named) == []


def test_a_degraded_champion_is_reported_and_rolled_back_to_the_better_version_before_it() -> None:
    # 2 validated at 0.1 and errs half the time live; 1, in its shadow, a tenth.
    referee = Referee(RULE, lookup({1: 0.1, 2: 0.1}))
    decisions = run(referee, traffic(0, 100, champion=(2, 0.5), shadows={1: 0.1}))
    kinds = [d.kind for d in decisions]
    assert kinds == [DECISION_KIND_DEGRADED, DECISION_KIND_ROLLBACK]
    degraded, rolled_back = decisions
    assert degraded.validation_value == pytest.approx(0.1)
    assert degraded.champion_error > 0.1 * (1 + RULE.margin)
    assert degraded.chosen_version == "2" and degraded.sequence == 0
    assert rolled_back.chosen_version == "1" and rolled_back.sequence == 1
    assert "degraded champion gave way" in rolled_back.reason


def test_an_earlier_version_better_on_live_traffic_does_not_replace_a_champion_that_holds() -> None:
    # 2 errs a fifth of the time live, within its margin of 0.2; 1 does better.
    referee = Referee(RULE, lookup({1: 0.1, 2: 0.2}))
    decisions = run(referee, traffic(0, 100, champion=(2, 0.2), shadows={1: 0.0}))
    assert decisions and {d.kind for d in decisions} == {DECISION_KIND_KEEP}
    assert "has not degraded" in decisions[0].reason


def test_a_degraded_champion_without_a_better_version_before_it_is_only_reported() -> None:
    referee = Referee(RULE, lookup({1: 0.1, 2: 0.1}))
    decisions = run(referee, traffic(0, 50, champion=(2, 0.5), shadows={1: 0.5}))
    assert [d.kind for d in decisions] == [DECISION_KIND_DEGRADED, DECISION_KIND_KEEP]
    # Reported once per reign.
    assert DECISION_KIND_DEGRADED not in {
        d.kind for d in run(referee, traffic(50, 100, champion=(2, 0.5), shadows={}))
    }


def test_a_champion_whose_objective_measures_something_else_is_never_degraded() -> None:
    def maximized(name: str, version: str):  # type: ignore[no-untyped-def]
        from shared.contracts.aistack.v1 import common_pb2

        return ready(version, 0.99, name=name, direction=common_pb2.DIRECTION_MAXIMIZE)

    referee = Referee(RULE, maximized)
    assert run(referee, traffic(0, 100, champion=(2, 0.9), shadows={})) == []


def test_replaying_the_settlements_gives_the_same_decisions() -> None:
    events = [
        *traffic(0, 120, champion=(1, 0.4), shadows={2: 0.05}, seed=3),
        *traffic(120, 200, champion=(2, 0.6), shadows={1: 0.05}, seed=4),
    ]
    first = run(Referee(RULE, lookup({1: 0.4, 2: 0.1})), events)
    again = run(Referee(RULE, lookup({1: 0.4, 2: 0.1})), events)
    assert [d.kind for d in first] == [
        DECISION_KIND_PROMOTE,
        DECISION_KIND_DEGRADED,
        DECISION_KIND_ROLLBACK,
    ]
    assert [d.SerializeToString(deterministic=True) for d in first] == [
        d.SerializeToString(deterministic=True) for d in again
    ]
    assert len({d.decision_id for d in first}) == 3
    assert [d.sequence for d in first] == [1, 0, 2]


# ---- on the bus (svc_monitor.deciding) ----


def test_a_promotion_enters_the_registry_before_its_decision_and_each_is_published_once() -> None:
    from prometheus_client import CollectorRegistry

    from shared import model_registry
    from shared.bus.testing import MemoryPublisher
    from shared.objective import DECISION_LABEL, DECISION_SEQUENCE_LABEL
    from svc_monitor.deciding import Deciding
    from svc_monitor.metrics import MonitorMetrics
    from svc_monitor.settings import MonitorSettings
    from tests.model_events import retuned

    settings = MonitorSettings(
        models_topic="models", decisions_topic="decisions", champion_min_pairs=50
    )
    events = traffic(0, 60, champion=(1, 0.5), shadows={2: 0.05})

    def deciding() -> tuple[Deciding, MemoryPublisher, model_registry.Registry]:
        registry = model_registry.Registry.of([ready(1, 0.4), retuned(2, 0.5, 1, 0.4)])
        publisher = MemoryPublisher()
        metrics = MonitorMetrics.create(CollectorRegistry())
        return Deciding(settings, publisher, registry, metrics), publisher, registry

    first, published, registry = deciding()
    assert registry.serving("m", "champion").version == "1"
    for event in events:
        first.add(event)
    assert [p.topic for p in published.queued] == ["models", "decisions"]
    chosen, decision = (p.message for p in published.queued)
    assert isinstance(decision, monitoring_pb2.ChampionDecision)
    assert decision.kind == DECISION_KIND_PROMOTE and published.queued[1].key == b"m"
    assert chosen.version == "2" and published.queued[0].key == b"m/2"
    assert chosen.labels[DECISION_LABEL] == decision.decision_id
    assert chosen.labels[DECISION_SEQUENCE_LABEL] == "1"
    assert registry.serving("m", "champion").version == "2"  # every reader agrees

    # A restart reads its decisions back: the same settlements decide the
    # same, and nothing is published twice. One whose decision was cut off
    # after its version was labelled publishes the decision alone.
    again, republished, restarted = deciding()
    restarted.add(chosen)
    again.recall(decision)
    for event in events:
        again.add(event)
    assert republished.queued == []
    cut_off, alone, labelled = deciding()
    labelled.add(chosen)
    for event in events:
        cut_off.add(event)
    assert [p.topic for p in alone.queued] == ["decisions"]
    assert alone.queued[0].message == decision
