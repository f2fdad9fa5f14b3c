"""What svc_monitor publishes about live traffic, read as its readers need
it: the latest live error of each model version
(``aistack.monitoring.performance``, ``LivePerformance``) and the latest
decision of the champion rule on each model (``aistack.models.decisions``,
``ChampionDecision``). Both topics keep every event, newest last per model."""

from __future__ import annotations

from collections.abc import Iterable

from shared.bus.consumer import messages_to_end
from shared.contracts.aistack.v1 import monitoring_pb2
from shared.settings import KafkaSettings

#: A model version: (model name, version).
Version = tuple[str, str]


def latest(
    summaries: Iterable[monitoring_pb2.LivePerformance],
) -> dict[Version, monitoring_pb2.LivePerformance]:
    """The last summary of each version, in the order given (the topic's,
    per model: it is keyed by model name)."""
    found: dict[Version, monitoring_pb2.LivePerformance] = {}
    for summary in summaries:
        found[(summary.model_name, summary.model_version)] = summary
    return found


def read(
    kafka: KafkaSettings, topic: str, timeout: float
) -> dict[Version, monitoring_pb2.LivePerformance]:
    """The latest live error of every version, as the topic holds them now
    (undecodable records skipped). Raises Unavailable when the topic is not
    read within ``timeout`` seconds."""
    summaries = messages_to_end(kafka, topic, monitoring_pb2.LivePerformance, timeout)
    return latest(summaries)


def last_decisions(
    kafka: KafkaSettings, topic: str, timeout: float
) -> dict[str, monitoring_pb2.ChampionDecision]:
    """The last decision on each model, as the topic holds them now
    (undecodable records skipped). Raises Unavailable when the topic is not
    read within ``timeout`` seconds."""
    found: dict[str, monitoring_pb2.ChampionDecision] = {}
    for decision in messages_to_end(kafka, topic, monitoring_pb2.ChampionDecision, timeout):
        found[decision.model_name] = decision
    return found
