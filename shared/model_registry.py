"""The model registry, read from the log that is it: ``aistack.models.ready``
(compacted, one record per model name and version). Every reader of that
log takes its rules from here: the model server, the drift monitor, batch
scoring, the client and the ``aistack`` command.

``Registry`` holds what the log says: each model's versions (the last event
of a version wins; an event naming no model, or a version that is not a
positive integer, is skipped with its reason, as the model server
dead-letters it), and which version serves under a policy
(``shared.settings.ServingSettings``, ``serving``): the champion by
``shared.objective``'s rule, or the newest.
``read`` replays the log to its end.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.bus.consumer import read_to_end
from shared.contracts.aistack.v1 import models_pb2
from shared.errors import InvalidArgument, NotFound, UndecodableRecord
from shared.objective import champion, version_number
from shared.settings import KafkaSettings, ServingPolicy


def serving(
    events: Iterable[models_pb2.ModelReady], policy: ServingPolicy
) -> models_pb2.ModelReady | None:
    """The version ``policy`` serves of one model's versions (None for none):
    the newest, or the champion over all of them (a re-tune's version judged
    against a version that arrives after it is judged again). Every event's
    version must be valid (``invalid``)."""
    if policy == "latest":
        return max(events, key=lambda e: version_number(e.version), default=None)
    return champion(events)


def invalid(event: models_pb2.ModelReady) -> str:
    """Why the registry skips ``event`` ("" when it takes it)."""
    if not event.model_name:
        return "the event names no model"
    try:
        version_number(event.version)
    except InvalidArgument as exc:
        return str(exc)
    return ""


class Registry:
    """Every model's versions, by name; what each model serves under a policy."""

    def __init__(self) -> None:
        self._models: dict[str, dict[int, models_pb2.ModelReady]] = {}
        #: The events skipped, each with why.
        self.skipped: list[tuple[models_pb2.ModelReady, str]] = []

    @classmethod
    def of(cls, events: Iterable[models_pb2.ModelReady]) -> Registry:
        registry = cls()
        for event in events:
            registry.add(event)
        return registry

    def add(self, event: models_pb2.ModelReady) -> str:
        """Take ``event`` (it replaces an earlier event of its version);
        returns why it was skipped instead ("" when taken)."""
        reason = invalid(event)
        if reason:
            self.skipped.append((event, reason))
            return reason
        self._models.setdefault(event.model_name, {})[version_number(event.version)] = event
        return ""

    def names(self) -> list[str]:
        """The models, by name."""
        return sorted(self._models)

    def versions(self, name: str) -> list[models_pb2.ModelReady]:
        """The model's versions, oldest first; NotFound for an unknown model."""
        versions = self._models.get(name)
        if versions is None:
            known = ", ".join(self.names()) or "none"
            raise NotFound(f"unknown model {name!r} (models: {known})")
        return [versions[number] for number in sorted(versions)]

    def serving(self, name: str, policy: ServingPolicy) -> models_pb2.ModelReady | None:
        """The version ``policy`` serves of ``name`` (None for an unknown model)."""
        return serving(self._models.get(name, {}).values(), policy)

    def version(
        self, name: str, version: str = "", policy: ServingPolicy = "champion"
    ) -> models_pb2.ModelReady:
        """One version; "" for the one ``policy`` serves. NotFound when there
        is none."""
        versions = self.versions(name)
        if not version:
            chosen = serving(versions, policy)
            if chosen is None:
                raise NotFound(f"model {name!r} has no version to serve")
            return chosen
        event = self._models[name].get(_number(version))
        if event is None:
            listed = ", ".join(e.version for e in versions)
            raise NotFound(f"model {name!r} has no version {version} (versions: {listed})")
        return event

    def next_version(self, name: str) -> str:
        """The version a new one of ``name`` takes: one above the highest."""
        return str(max(self._models.get(name, {}), default=0) + 1)


def _number(version: str) -> int:
    try:
        return version_number(version)
    except InvalidArgument:
        return 0  # no version has it


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
