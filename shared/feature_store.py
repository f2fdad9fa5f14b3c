"""The feature store's layouts: the contract between svc_transform, which
writes both stores, and svc_model and svc_trainer, which read them.

Online store (Redis): one hash per entity, key ``online_key(prefix, entity)``;
one field per (metric, dimensions, window kind), named by ``online_field``;
the value is the entity's latest closed window as aistack.v1.FeatureWindow
bytes, the same bytes as its record on aistack.features.windows
(``decode_window`` reads them). Beside each field the writer keeps
``<field>:end``, the window's end in epoch milliseconds, so that only a newer
window replaces it. ``open_field(field)`` holds the running aggregate of the
open window that counts the entity's latest reading (``FeatureWindow.open``
set), rewritten every micro-batch: the most complete such window of the
kind, replaced by a later one or by the same one counting more (beside it
``<open field>:end`` and ``<open field>:count``).

Offline store (Parquet): every window svc_transform closed, Hive-partitioned
by ``PARTITIONS`` (``date=/metric=/window=/batch=``), the other columns
``OFFLINE_COLUMNS``. ``batch`` is the Spark micro-batch that wrote the rows:
a replayed batch replaces only its own partition, so of a window stored
twice the latest batch's row is the one to read. ``sources`` is the
FeatureWindow's: per partition of the clean topic, the least and greatest
offset and the count of the clean events the window aggregates, as
``array<struct<topic string, partition int, min_offset bigint, max_offset
bigint, count bigint>>`` (aistack.v1.OffsetRange's fields); files written
before it lack the column.

A model fed by entity takes a window's ``FEATURE_STATS``, in that order, and
predicts a statistic of the next window of the series (``forecast_label``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from shared.contracts.aistack.v1.events_pb2 import CleanEvent
from shared.contracts.aistack.v1.features_pb2 import FeatureWindow
from shared.errors import FailedPrecondition

#: The metric of web requests; the request path is its one dimension.
WEB_LATENCY = "http.latency_ms"

#: A time series a clean event gives values to: (entity, metric, path).
Series = tuple[str, str, str]


def event_series(event: CleanEvent) -> Iterator[Series]:
    """The series ``event`` gives one value each: a sensor reading's
    measurements, a web request's latency on its path. svc_transform's
    windows read events so (``svc_transform.windows.observations``, in Spark
    SQL: a test holds the two to the same series); the lineage walk matches
    clean events to windows by it."""
    kind = event.WhichOneof("body")
    if kind == "sensor_reading":
        for measurement in event.sensor_reading.measurements:
            yield (event.entity_id, measurement.metric, "")
    elif kind == "web_request":
        yield (event.entity_id, WEB_LATENCY, event.web_request.path)


#: The window statistics a feature model reads, in this order: svc_trainer
#: builds its lags from them, svc_model feeds them by entity.
FEATURE_STATS = ("mean", "stddev", "min", "max", "count", "p50", "p95")

#: What a window's statistics are per, besides the window itself.
DIMENSIONS = ("entity_id", "metric", "path", "unit")
#: What one time series is per, within one metric and window kind.
SERIES_COLUMNS = tuple(column for column in DIMENSIONS if column != "metric")

#: The offline store's Hive partitions, outermost first, with their Arrow type aliases.
PARTITIONS = (("date", "string"), ("metric", "string"), ("window", "string"), ("batch", "int64"))
PARTITION_COLUMNS = tuple(name for name, _ in PARTITIONS)
#: The offline store's columns besides the partitions, in file order.
OFFLINE_COLUMNS = (
    "window_key",
    "entity_id",
    "path",
    "unit",
    "window_start",
    "window_end",
    "window_size",
    "window_slide",
    "count",
    "mean",
    "min",
    "max",
    "stddev",
    "last",
    "p50",
    "p95",
    "error_rate",
    "last_event_time",
    "sources",
)


def merge_sources(
    sources: Iterable[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Offset ranges (``sources`` entries, as dicts) merged per (topic,
    partition): the least and greatest offset and the summed count, sorted
    by topic and partition. What many windows' sources span together."""
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for source in sources:
        key = (source["topic"], source["partition"])
        span = merged.get(key)
        if span is None:
            merged[key] = dict(source)
        else:
            span["min_offset"] = min(span["min_offset"], source["min_offset"])
            span["max_offset"] = max(span["max_offset"], source["max_offset"])
            span["count"] += source["count"]
    return [merged[key] for key in sorted(merged)]


def merge_source_column(column: Any) -> list[dict[str, Any]]:
    """``merge_sources`` over an Arrow ``sources`` column (a list of
    OffsetRange structs per row, as the offline store and scored rows hold
    it), computed in Arrow: no Python object per range, which cost batch
    scoring a fifth of its driver's time. The same spans, in the same order,
    each with its fields in the struct's order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ranges = pc.list_flatten(column)
    fields = [field.name for field in ranges.type]
    if fields != list(_SOURCE_FIELDS):  # not the layout this rule knows
        return merge_sources(source for sources in column.to_pylist() for source in sources or ())
    if len(ranges) == 0:
        return []
    table = pa.Table.from_struct_array(ranges)
    spans = (
        table.group_by(["topic", "partition"], use_threads=False)
        .aggregate([("min_offset", "min"), ("max_offset", "max"), ("count", "sum")])
        .sort_by([("topic", "ascending"), ("partition", "ascending")])
    )
    columns = [
        spans.column(name).to_pylist()
        for name in ("topic", "partition", "min_offset_min", "max_offset_max", "count_sum")
    ]
    return [dict(zip(_SOURCE_FIELDS, values, strict=True)) for values in zip(*columns, strict=True)]


_SOURCE_FIELDS = ("topic", "partition", "min_offset", "max_offset", "count")


#: Options of a read of the offline store (svc_trainer's ``features``
#: dataset) bounding the windows by their start, inclusive, as RFC 3339
#: timestamps: what svc_tuner sets for a re-tune's fresh data.
WINDOW_FROM, WINDOW_TO = "window_from", "window_to"

#: The online store's default key prefix (svc_transform's and svc_model's
#: ``online_key_prefix`` setting).
ONLINE_KEY_PREFIX = "aistack:features:"


def online_key(prefix: str, entity_id: str) -> str:
    """The Redis hash holding ``entity_id``'s latest windows."""
    return f"{prefix}{entity_id}"


def window_kind(size_seconds: int, slide_seconds: int) -> str:
    """A window kind's name, as in the offline store's ``window=`` partition
    and online fields: ``tumbling-60s``, ``sliding-300s-every-60s``."""
    if slide_seconds == size_seconds:
        return f"tumbling-{size_seconds}s"
    return f"sliding-{size_seconds}s-every-{slide_seconds}s"


_KIND = re.compile(r"tumbling-(\d+)s|sliding-(\d+)s-every-(\d+)s")


def window_spans(kind: str) -> tuple[int, int] | None:
    """``window_kind``'s inverse: (size, slide) in seconds, None for a name
    that is not a window kind."""
    match = _KIND.fullmatch(kind)
    if match is None:
        return None
    tumbling, size, slide = match.groups()
    if tumbling is not None:
        return int(tumbling), int(tumbling)
    return int(size), int(slide)


def forecast_label(statistic: str, metric: str) -> str:
    """What a forecast model predicts, as its lineage says it
    (``DataLineage.label``): the ``statistic`` of the window after the one it
    reads, e.g. ``mean of the next temperature window``."""
    return f"{statistic} of the next {metric} window"


def forecast_statistic(label: str) -> str:
    """The statistic of ``forecast_label``'s words; "" where ``label`` is
    not such a sentence (a model that does not forecast windows)."""
    statistic, found, rest = label.partition(" of the next ")
    if found and rest.endswith(" window") and statistic in FEATURE_STATS:
        return statistic
    return ""


def online_field(metric: str, window: str, path: str = "") -> str:
    """The hash field of one (metric, path, window kind): ``temperature@tumbling-60s``,
    ``http.latency_ms|path=/api/orders@tumbling-60s``. ``window`` is the window
    kind's name, as in the offline store's ``window=`` partition."""
    return f"{metric}|path={path}@{window}" if path else f"{metric}@{window}"


def window_fields(window: FeatureWindow) -> list[str]:
    """The features (online fields) a window belongs to: its metric and
    kind's path-less field (trainers train on every path's series at once)
    and, when it has a path, that path's field too. The drift monitor's
    horizons and a reader of the windows it judged both go by it."""
    kind = window_kind(window.window_size.seconds, window.window_slide.seconds)
    fields = [online_field(window.metric, kind)]
    path = window.dimensions.get("path", "")
    if path:
        fields.append(online_field(window.metric, kind, path))
    return fields


#: The label of a model version (``ModelReady.labels``) naming the online
#: field (``online_field``) it was trained on: the one svc_model reads for a
#: request that names an entity and no feature. Trainers and
#: ``aistack models register --feature`` set it.
FEATURE_LABEL = "feature"


#: What ``open_field`` appends to a closed window's field.
OPEN_SUFFIX = ":open"


def open_field(field: str) -> str:
    """The field of ``field``'s open window: ``temperature@tumbling-60s:open``."""
    return field + OPEN_SUFFIX


def partition_path(*, date: str, metric: str, window: str, batch: int) -> str:
    """One partition's directory under the offline store's root, for values
    Hive does not escape (no ``/``, ``=``, ``%`` and the like)."""
    values = {"date": date, "metric": metric, "window": window, "batch": batch}
    return "/".join(f"{name}={values[name]}" for name in PARTITION_COLUMNS)


def encode_window(window: FeatureWindow) -> bytes:
    """An online-store value (svc_transform encodes the same message in Spark)."""
    return window.SerializeToString(deterministic=True)


def decode_window(value: bytes) -> FeatureWindow:
    """An online-store value as its FeatureWindow.

    A value that starts with ``{`` is a JSON object written before the store
    held protobuf; it is read into the same message, so readers keep working
    through an upgrade until the next window of its field replaces it (the
    encoder never starts a FeatureWindow with that byte: it would be a group
    tag). Raises FailedPrecondition for a value that is neither."""
    if value[:1] == b"{":
        try:
            document = json.loads(value)
            if not isinstance(document, dict):
                raise ValueError("not a JSON object")
            return json_format.ParseDict(document, FeatureWindow(), ignore_unknown_fields=True)
        except (ValueError, json_format.ParseError) as exc:
            raise FailedPrecondition(f"not a feature window (JSON): {exc}") from exc
    try:
        return FeatureWindow.FromString(value)
    except DecodeError as exc:
        raise FailedPrecondition(f"not an aistack.v1.FeatureWindow: {exc}") from exc


def window_stats(window: FeatureWindow) -> tuple[float, ...]:
    """The window's ``FEATURE_STATS``, in that order."""
    return tuple(float(getattr(window, stat)) for stat in FEATURE_STATS)
