"""The model registry, read from the log that is it: ``aistack.models.ready``
(compacted, one record per model name and version). Every reader of that
log takes its rules from here: the model server, the drift monitor, batch
scoring, the client and the ``aistack`` command.

``Registry`` holds what the log says: each model's versions (the last event
of a version wins; an event naming no model, or a version that is not a
positive integer, is skipped with its reason, as the model server
dead-letters it), and which version serves under a policy
(``shared.settings.ServingSettings``, ``serving``): the champion by
``shared.objective``'s rule, or the newest; and which versions run in its
shadow (``challengers``).
Its two readers: ``read`` replays the log to its end, once (a command, batch
scoring); ``Follower`` replays it and then follows it, for a service that
keeps the registry up to date (the model server, the drift monitor): no
service tails the log itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import NamedTuple, Protocol

from shared.bus.consumer import BusTail, Record, messages_to_end
from shared.bus.loop import Batch, ConsumeLoop, DeadLetters, Publisher, Source
from shared.contracts.aistack.v1 import models_pb2
from shared.errors import InvalidArgument, NotFound, Unavailable
from shared.log import get_logger
from shared.objective import BASELINE_VERSION, champion, model_standing, top, version_number
from shared.settings import KafkaSettings, ServingPolicy

log = get_logger("shared.model_registry")


def serving(
    events: Iterable[models_pb2.ModelReady], policy: ServingPolicy
) -> models_pb2.ModelReady | None:
    """The version ``policy`` serves of one model's versions (None for none):
    the newest, or the champion over all of them (a re-tune's version judged
    against a version that arrives after it is judged again; under ``live``
    a re-tune's version only by a decision on live traffic). Every event's
    version must be valid (``invalid``)."""
    if policy == "latest":
        return max(events, key=lambda e: version_number(e.version), default=None)
    return champion(events, retunes_by_validation=policy != "live")


#: A version's label that asks for it to be run in the serving version's
#: shadow ("true"); set by ``aistack models challenge``.
CHALLENGER_LABEL = "aistack:challenger"


def challengers(
    events: Iterable[models_pb2.ModelReady], policy: ServingPolicy, limit: int
) -> list[models_pb2.ModelReady]:
    """The versions to run in the shadow of the one ``policy`` serves, newest
    first, at most ``limit``: each version marked so (``CHALLENGER_LABEL``),
    the best version of each re-tune newer than the serving one (it names a
    baseline: it lost to it, its verdict is pending, or under ``live`` it
    waits for live traffic), and the previous champion
    (what ``policy`` serves of the versions older than the serving one), so
    that a degraded champion can be rolled back on the same traffic. The
    serving version is never its own challenger. Every event's version must
    be valid."""
    ordered = sorted(events, key=lambda e: version_number(e.version), reverse=True)
    chosen = serving(ordered, policy)
    if chosen is None or limit <= 0:
        return []
    serving_number = version_number(chosen.version)
    previous = serving([e for e in ordered if version_number(e.version) < serving_number], policy)
    retuned: dict[str, list[models_pb2.ModelReady]] = {}
    for event in ordered:
        if BASELINE_VERSION in event.labels and version_number(event.version) > serving_number:
            retuned.setdefault(event.lineage.study_id, []).append(event)
    # A re-tune's trials each publish a version: its best (by the objective) challenges.
    bests = [top(study, model_standing) for study in retuned.values()]
    picked = []
    for event in ordered:
        if version_number(event.version) == serving_number:
            continue
        marked = event.labels.get(CHALLENGER_LABEL) == "true"
        if marked or event is previous or any(event is best for best in bests):
            picked.append(event)
    return picked[:limit]


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

    def challengers(
        self, name: str, policy: ServingPolicy, limit: int
    ) -> list[models_pb2.ModelReady]:
        """The versions run in the shadow of ``name``'s serving one (``challengers``)."""
        return challengers(self._models.get(name, {}).values(), policy, limit)

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
    events = messages_to_end(kafka, topic, models_pb2.ModelReady, timeout)
    return Registry.of(events)


class Update(NamedTuple):
    """One event the follower read: the record that carried it (for the
    owner's dead letter should it refuse the event later) and why the
    registry skipped it ("" when it took it)."""

    event: models_pb2.ModelReady
    record: Record[models_pb2.ModelReady]
    skipped: str


class Tail(Source[models_pb2.ModelReady], Protocol):
    """What the follower reads: a ``BusTail`` from the log's beginning, or
    ``shared.bus.testing.MemorySource`` in unit tests."""

    def caught_up(self) -> bool: ...

    def close(self) -> None: ...


class Follower:
    """The registry log replayed from its beginning (``replay``), then
    followed (``step``), into ``registry``; each returns the updates it read,
    for the owner to act on. A record that is not a ModelReady is
    dead-lettered through the owner's ``dead_letters`` (the loop flushes
    them); a tombstone is passed over: the registry forgets no version. One
    thread replays, steps and closes."""

    def __init__(
        self,
        source: Tail,
        *,
        topic: str,
        publisher: Publisher,
        dead_letters: DeadLetters,
        registry: Registry | None = None,
        poll_timeout: float = 0.2,
    ) -> None:
        self.registry = Registry() if registry is None else registry
        self._source = source
        self._topic = topic
        self._read: list[Update] = []
        self._loop = ConsumeLoop(
            source,
            self._take,
            publisher=publisher,
            dead_letters=dead_letters,
            max_records=500,
            poll_timeout=poll_timeout,
            skip_tombstones=True,
        )

    @classmethod
    def open(
        cls,
        kafka: KafkaSettings,
        topic: str,
        *,
        reader: str,
        publisher: Publisher,
        dead_letters: DeadLetters,
        registry: Registry | None = None,
        poll_timeout: float = 0.2,
    ) -> Follower:
        """Every partition of ``topic``, outside any consumer group: every
        replica sees every version. Its lag is exported under ``reader``.
        Raises Unavailable (no broker, no topic), ConfigError."""
        tail: BusTail[models_pb2.ModelReady] = BusTail(
            kafka,
            topics=[topic],
            message_cls=models_pb2.ModelReady,
            from_beginning=True,
            reader=reader,
        )
        return cls(
            tail,
            topic=topic,
            publisher=publisher,
            dead_letters=dead_letters,
            registry=registry,
            poll_timeout=poll_timeout,
        )

    def replay(self, timeout: float, stop: Callable[[], bool] = lambda: False) -> list[Update]:
        """Read up to where the log ended when the follower was opened (or
        until ``stop()``); returns the last update of each version (an
        earlier event of a version is no longer news) and every skipped
        one, in the log's order. Raises Unavailable when the log is not read
        within ``timeout`` seconds."""
        started = time.monotonic()
        read: list[Update] = []
        while not stop() and not self._source.caught_up():
            if time.monotonic() - started > timeout:
                raise Unavailable(
                    f"the models topic {self._topic} was not replayed within {timeout} s"
                )
            read.extend(self.step())
        latest = _latest(read)
        log.info(
            "registry.replayed",
            topic=self._topic,
            events=len(read),
            versions=sum(1 for update in latest if not update.skipped),
            skipped=sum(1 for update in latest if update.skipped),
            seconds=round(time.monotonic() - started, 2),
        )
        return latest

    def step(self) -> list[Update]:
        """One poll: the updates it brought, in the log's order."""
        self._loop.step()
        read, self._read = self._read, []
        return read

    def close(self) -> None:
        self._source.close()

    def _take(self, batch: Batch[models_pb2.ModelReady]) -> None:
        for event, record in batch:
            self._read.append(Update(event, record, self.registry.add(event)))


def _latest(updates: list[Update]) -> list[Update]:
    last: dict[tuple[str, int], int] = {}
    for index, update in enumerate(updates):
        if not update.skipped:
            last[(update.event.model_name, version_number(update.event.version))] = index
    kept = set(last.values())
    return [u for index, u in enumerate(updates) if u.skipped or index in kept]
