"""The live errors svc_monitor publishes (``aistack.monitoring.performance``,
``LivePerformance``), read as their readers need them: the latest of each
model version. The topic keeps every summary, newest last per version."""

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
