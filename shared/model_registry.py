"""The model registry, read from the log that is it: ``aistack.models.ready``
(compacted, one record per model name and version).

``read`` replays the log to its end; ``Registry`` answers what the log holds:
a model's versions in order, one version, the champion by the objective's
rule (``shared.objective.champion``), the next version number to take.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from shared.bus.consumer import read_to_end
from shared.contracts.aistack.v1 import models_pb2
from shared.errors import NotFound, UndecodableRecord
from shared.objective import champion, version_number
from shared.settings import KafkaSettings


@dataclass(frozen=True)
class Registry:
    """Every model's versions, by name, oldest first (a version published
    twice counts once: the later record)."""

    models: dict[str, list[models_pb2.ModelReady]] = field(default_factory=dict)

    @classmethod
    def of(cls, events: Iterable[models_pb2.ModelReady]) -> Registry:
        latest: dict[tuple[str, str], models_pb2.ModelReady] = {}
        for event in events:
            latest[(event.model_name, event.version)] = event
        models: dict[str, list[models_pb2.ModelReady]] = {}
        for (name, _), event in latest.items():
            models.setdefault(name, []).append(event)
        for versions in models.values():
            versions.sort(key=lambda e: version_number(e.version))
        return cls(models)

    def versions(self, name: str) -> list[models_pb2.ModelReady]:
        """The model's versions, oldest first; NotFound for an unknown model."""
        if name not in self.models:
            known = ", ".join(sorted(self.models)) or "none"
            raise NotFound(f"no model {name!r} in the registry (models: {known})")
        return list(self.models[name])

    def version(self, name: str, version: str = "") -> models_pb2.ModelReady:
        """One version; "" for the champion. NotFound when there is none."""
        versions = self.versions(name)
        if not version:
            chosen = champion(versions)
            if chosen is None:
                raise NotFound(f"model {name!r} has no version to serve")
            return chosen
        for event in versions:
            if event.version == version:
                return event
        listed = ", ".join(e.version for e in versions)
        raise NotFound(f"model {name!r} has no version {version} (versions: {listed})")

    def next_version(self, name: str) -> str:
        """The version a new one of ``name`` takes: one above the highest."""
        versions = self.models.get(name, [])
        return str(max((version_number(e.version) for e in versions), default=0) + 1)


def read(kafka: KafkaSettings, topic: str, timeout: float) -> Registry:
    """The registry as the log holds it now (undecodable records skipped: the
    log's producers dead-letter theirs). Raises Unavailable when the log is
    not read within ``timeout`` seconds."""
    events = []
    for record in read_to_end(kafka, topic, models_pb2.ModelReady, timeout):
        try:
            events.append(record.decode())
        except UndecodableRecord:
            continue
    return Registry.of(events)
