"""A prediction (or a model version) walked back to the raw Kafka records
under it: ``aistack lineage REQUEST_ID | MODEL@VERSION``, ``Client.lineage``.

    prediction → model version, artifact digest → study, trial, parameters
               → the user's code: its package's digest, model or loop
               → training data: its identity (columns, label, split);
                 offline-store files → the windows' clean-event
                 positions → the raw records' positions (a few shown)
               → the feature window it was fed (requests by entity) → clean
                 events → raw records (a few shown)

Every step reads what aistack wrote: the prediction log (``aistack.predictions``),
the model registry (``aistack.models.ready``), the training files named in
the model's lineage, ``FeatureWindow.sources``, ``CleanEvent.source``. What
is gone (a record past the topic's retention, a file deleted) is shown as
gone, never guessed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from aistack.settings import LineageSettings
from shared import model_registry, object_store, offline_store
from shared.bus.consumer import read_to_end
from shared.contracts.aistack.v1 import common_pb2, events_pb2, models_pb2, predictions_pb2
from shared.errors import AistackError, InvalidArgument, NotFound
from shared.feature_store import Series, event_series
from shared.objective import version_number
from shared.settings import KafkaSettings, ObjectStoreSettings

#: The offline store's dataset name in a model's lineage (svc_trainer's ``features``).
FEATURES_DATASET = "features"


@dataclass
class Node:
    """One step of the walk: a title line, facts (for ``--json``), and what it came from."""

    title: str
    facts: dict[str, Any] = field(default_factory=dict)
    children: list[Node] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            **self.facts,
            "from": [child.to_json() for child in self.children],
        }

    def lines(self) -> list[str]:
        """The tree as text, one line per node."""
        out = [self.title]
        for i, child in enumerate(self.children):
            last = i == len(self.children) - 1
            head, rest = ("└─ ", "   ") if last else ("├─ ", "│  ")
            child_lines = child.lines()
            out.append(head + child_lines[0])
            out.extend(rest + line for line in child_lines[1:])
        return out


def trace(settings: LineageSettings, target: str) -> Node:
    """The lineage of ``target``: a prediction's request id, or ``MODEL@VERSION``.
    Raises NotFound (no such prediction or model version), InvalidArgument."""
    with Positions(settings.kafka) as bus:
        walk = _Walk(settings, bus)
        if "@" in target:
            name, _, version = target.partition("@")
            if not name:
                raise InvalidArgument(f"expected REQUEST_ID or MODEL@VERSION, got {target!r}")
            version_number(version)
            return walk.model(walk.find_model(name, version))
        return walk.prediction(walk.find_prediction(target))


class Positions:
    """Reads records by position (no consumer group, nothing committed)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._consumer = Consumer(
            {
                **kafka.client_config(),
                "group.id": "aistack-lineage",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )

    def __enter__(self) -> Positions:
        return self

    def __exit__(self, *exc: object) -> None:
        self._consumer.close()

    def first_offset(self, topic: str, partition: int) -> int:
        """The first offset still on the bus (earlier ones are past retention)."""
        low, _ = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        return int(low)

    def read(self, topic: str, partition: int, first: int, last: int) -> Iterator[Any]:
        """The records of ``topic``[``partition``] from ``first`` to ``last``
        (inclusive) that are still there."""
        self._consumer.assign([TopicPartition(topic, partition, first)])
        next_offset = first
        while True:
            # consume() waits until it has as many records as asked for (or
            # its timeout): ask for no more than the range still holds.
            wanted = max(1, min(500, last - next_offset + 1))
            batch = self._consumer.consume(wanted, timeout=5)
            if not batch:
                return
            for record in batch:
                if record.error() is not None:  # the partition's end
                    return
                offset = int(record.offset() or 0)
                if offset > last:
                    return
                yield record
                if offset == last:
                    return
                next_offset = offset + 1


class _Walk:
    def __init__(self, settings: LineageSettings, bus: Positions) -> None:
        self._settings = settings
        self._bus = bus

    # ---- finding the start ----

    def find_prediction(self, request_id: str) -> predictions_pb2.PredictionLogged:
        found: predictions_pb2.PredictionLogged | None = None
        for record in self._records(
            self._settings.predictions_topic, predictions_pb2.PredictionLogged
        ):
            if record.request_id == request_id:
                found = record
        if found is None:
            raise NotFound(
                f"no prediction {request_id!r} on {self._settings.predictions_topic} "
                "(not sampled, past retention, or never made)"
            )
        return found

    def find_model(self, name: str, version: str) -> models_pb2.ModelReady:
        s = self._settings
        return model_registry.read(s.kafka, s.models_topic, s.timeout_seconds).version(
            name, version
        )

    def _records(self, topic: str, cls: type[Any]) -> Iterator[Any]:
        for record in read_to_end(self._settings.kafka, topic, cls, self._settings.timeout_seconds):
            try:
                yield record.decode()
            except AistackError:
                continue  # not this topic's message: the services dead-letter it

    # ---- the steps ----

    def prediction(self, logged: predictions_pb2.PredictionLogged) -> Node:
        node = Node(
            f"prediction {logged.request_id}: {logged.model_name} version {logged.model_version}, "
            f"{logged.served_time.ToJsonString()}, {logged.latency_us / 1000:.2f} ms",
            {"prediction": json_format.MessageToDict(logged)},
        )
        try:
            node.children.append(
                self.model(self.find_model(logged.model_name, logged.model_version))
            )
        except NotFound as gone:
            node.children.append(Node(f"model: {gone}", {"gone": True}))
        if logged.entity_id:
            window = Node(
                f"feature window {logged.window_key or '(key not logged)'} "
                f"of entity {logged.entity_id}",
                {"entity_id": logged.entity_id, "window_key": logged.window_key},
            )
            window.children.extend(self.clean(logged.window_sources, _fed(logged)))
            node.children.append(window)
        else:
            node.children.append(
                Node(
                    f"inputs sent as tensors: sha256 {logged.inputs_sha256}",
                    {"inputs_sha256": logged.inputs_sha256},
                )
            )
        return node

    def model(self, event: models_pb2.ModelReady) -> Node:
        lineage = event.lineage
        node = Node(
            f"model {event.model_name} version {event.version}: artifact sha256 "
            f"{event.sha256} at {event.artifact_uri}",
            {"model": json_format.MessageToDict(event)},
        )
        params = ", ".join(
            f"{name}={_param(value)}" for name, value in sorted(lineage.params.items())
        )
        node.children.append(
            Node(
                f"study {lineage.study_id}, trial {lineage.trial_id} (#{lineage.trial_number})"
                + (f": {params}" if params else ""),
                {"study_id": lineage.study_id, "trial_id": lineage.trial_id},
            )
        )
        if lineage.HasField("code"):
            node.children.append(_code(lineage.code))
        node.children.append(self.training_data(lineage.data))
        return node

    def training_data(self, data: models_pb2.DataLineage) -> Node:
        node = Node(f"training data {data.dataset}", {"dataset": data.dataset})
        identity = _identity(data)
        if identity:
            node.title += f" ({identity})"
            node.facts.update(
                {"features": list(data.features), "label": data.label, "split": data.split}
            )
        if not data.files:
            node.title += ": not read from files, no bus positions to follow"
            return node
        if not data.dataset.startswith(f"{FEATURES_DATASET}@"):
            # A table of the user's: its files are the lineage's end.
            node.title += f": {len(data.files)} files"
            node.facts["files"] = list(data.files)
            node.children.extend(Node(f"file {path}") for path in data.files[:10])
            return node
        present = _present(data.files, self._settings.object_store)
        missing = len(data.files) - len(present)
        node.title += f": {len(data.files)} files" + (
            f", {missing} no longer there" if missing else ""
        )
        node.facts["files"] = list(data.files)
        count, windows, ranges = _windows_in(present, self._settings.object_store)
        if not count:
            node.children.append(Node("the files hold no window positions (written before them)"))
            return node
        summary = Node(
            f"{count} windows of {len(windows.entities)} entities, over clean events "
            + "; ".join(_range_text(r) for r in ranges),
            {"windows": count, "clean_ranges": [json_format.MessageToDict(r) for r in ranges]},
        )
        summary.children.extend(self.clean(ranges, windows))
        node.children.append(summary)
        return node

    def clean(self, ranges: Iterable[common_pb2.OffsetRange], windows: Windows) -> list[Node]:
        """The clean events in ``ranges`` that ``windows`` aggregate (a range
        also holds other series' and other windows' events), and the raw
        records under them."""
        nodes: list[Node] = []
        raw: list[common_pb2.SourcePosition] = []
        for span in ranges:
            first = self._bus.first_offset(span.topic, span.partition)
            found = 0
            for record in self._bus.read(
                span.topic, span.partition, max(span.min_offset, first), span.max_offset
            ):
                try:
                    event = events_pb2.CleanEvent.FromString(record.value())
                except DecodeError:
                    continue
                if windows.covers(event):
                    found += 1
                    if event.HasField("source"):
                        raw.append(event.source)
            title = f"clean events {_range_text(span)}: {found} read"
            if first > span.min_offset:
                title += f"; offsets below {first} are past the topic's retention"
            nodes.append(Node(title, {"range": json_format.MessageToDict(span), "read": found}))
        if raw and nodes:
            nodes[-1].children.append(self.raw(raw))
        return nodes

    def raw(self, positions: list[common_pb2.SourcePosition]) -> Node:
        grouped: dict[tuple[str, int], list[int]] = defaultdict(list)
        for position in positions:
            grouped[(position.topic, position.partition)].append(position.offset)
        spans = [
            f"{topic}[{partition}] offsets {min(offsets)}..{max(offsets)} ({len(offsets)})"
            for (topic, partition), offsets in sorted(grouped.items())
        ]
        node = Node(
            "raw records " + "; ".join(spans),
            {
                "raw": [
                    {"topic": t, "partition": p, "offsets": sorted(o)}
                    for (t, p), o in sorted(grouped.items())
                ]
            },
        )
        for position in positions[: self._settings.raw_shown]:
            node.children.append(self.raw_record(position))
        return node

    def raw_record(self, position: common_pb2.SourcePosition) -> Node:
        where = f"{position.topic}[{position.partition}]@{position.offset}"
        if self._bus.first_offset(position.topic, position.partition) > position.offset:
            return Node(f"{where}: past the topic's retention", {"gone": True})
        for record in self._bus.read(
            position.topic, position.partition, position.offset, position.offset
        ):
            return Node(f"{where}: {_show(record.value())}", {"value": _show(record.value())})
        return Node(f"{where}: not on the bus", {"gone": True})


class Windows:
    """The windows a set of clean events must fall in: per series, their
    [start, end) spans in microseconds. A clean event is under them when it
    gives a value to one of their series at a time one of them spans."""

    def __init__(self) -> None:
        self._spans: dict[Series, list[tuple[int, int]]] = defaultdict(list)
        # Entities whose window is not known better (a record written
        # before windows were logged): any of their events.
        self._whole: set[str] = set()

    def add_entity(self, entity: str) -> None:
        self._whole.add(entity)

    def add(self, series: Series, start_us: int, end_us: int) -> None:
        self._spans[series].append((start_us, end_us))

    @property
    def entities(self) -> set[str]:
        return {entity for entity, _, _ in self._spans} | self._whole

    def covers(self, event: events_pb2.CleanEvent) -> bool:
        if event.entity_id in self._whole:
            return True
        at = event.event_time.ToMicroseconds()
        for series in event_series(event):
            for start, end in self._spans.get(series, ()):
                if start <= at < end:
                    return True
        return False


def _present(files: Sequence[str], settings: ObjectStoreSettings) -> list[str]:
    """Those of ``files`` (paths, or URLs on the object store) still there."""
    local = [path for path in files if not object_store.scheme(path)]
    remote = [path for path in files if object_store.scheme(path)]
    present = {path for path in local if Path(path).exists()}
    if remote:
        fs, _ = object_store.filesystem(remote[0], settings)  # the store's, for all
        for url in remote:
            if fs.exists(url.partition("://")[2]):
                present.add(url)
    return [path for path in files if path in present]


def _windows_in(
    files: list[str], settings: ObjectStoreSettings
) -> tuple[int, Windows, list[common_pb2.OffsetRange]]:
    """(how many windows, their series and spans, their clean ranges merged
    per partition) of the offline-store files, read as the trainer read them."""
    stored = offline_store.stored_windows(files, settings)
    windows = Windows()
    for series, start, end in zip(stored.series, stored.start_us, stored.end_us, strict=True):
        windows.add(series, start, end)
    ranges = [common_pb2.OffsetRange(**span) for span in stored.sources]
    return len(stored.series), windows, ranges


def _fed(logged: predictions_pb2.PredictionLogged) -> Windows:
    """The window a prediction by entity was fed, as ``Windows``."""
    windows = Windows()
    if logged.window_metric:
        path = logged.window_dimensions.get("path", "")
        windows.add(
            (logged.entity_id, logged.window_metric, path),
            logged.window_start.ToMicroseconds(),
            logged.window_end.ToMicroseconds(),
        )
    else:
        windows.add_entity(logged.entity_id)
    return windows


def _code(code: models_pb2.CodeLineage) -> Node:
    function = code.entrypoint or code.model
    kind = "training loop" if code.entrypoint else "model"
    title = f"the user's {kind} {function}"
    facts: dict[str, Any] = {"code": json_format.MessageToDict(code)}
    if code.HasField("package"):
        package = code.package
        title += (
            f", shipped as {package.name or 'a package'} sha256 {package.sha256} at {package.uri}"
        )
    else:
        title += ", installed in the trainers' environment"
    return Node(title, facts)


def _identity(data: models_pb2.DataLineage) -> str:
    parts = []
    if data.features:
        shown = ", ".join(data.features[:6]) + (" …" if len(data.features) > 6 else "")
        parts.append(f"{len(data.features)} features: {shown}")
    if data.label:
        parts.append(f"label {data.label}")
    if data.split:
        parts.append(data.split)
    return "; ".join(parts)


def _range_text(span: common_pb2.OffsetRange) -> str:
    offsets = f"{span.min_offset}..{span.max_offset}"
    return f"{span.topic}[{span.partition}] offsets {offsets} ({span.count})"


def _param(value: common_pb2.ParamValue) -> str:
    kind = value.WhichOneof("kind")
    return str(getattr(value, kind)) if kind else "?"


def _show(value: bytes | None, limit: int = 160) -> str:
    if value is None:
        return "(no value)"
    try:
        text = value.decode()
    except UnicodeDecodeError:
        return f"{len(value)} bytes (binary, e.g. a RawEvent)"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
