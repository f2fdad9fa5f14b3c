"""The cleaning of one raw record: parse, validate, normalise.

``Cleaner.clean_all`` either returns the record's CleanEvents (event id,
entity, UTC event time, canonical units, attributes) or raises RecordRejected
with a reason code. It never raises anything else on any input: a property
test holds it to that.

Most records are one event. A SenML pack, a Telegraf batch or several lines
of line protocol are several: one per reading, i.e. per (entity, time) for
SenML, per metric object for Telegraf, per line for line protocol. A record
is accepted whole or dead-lettered whole (with the record or line at
fault), so a replay of its dead letter never duplicates half of it.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from shared.contracts.aistack.v1 import events_pb2
from svc_ingest import accesslog, fields, influx, payload, senml, units
from svc_ingest.rejection import RecordRejected
from svc_ingest.rules import CleaningRules
from svc_ingest.sensor_shapes import SensorShapes
from svc_ingest.timestamps import parse_time, set_timestamp

_HOST = ("host", "server", "server_name", "vhost", "hostname")
_CLIENT = ("client_address", "remote_addr", "client_ip", "client", "ip")
_PATH = ("path", "uri", "request_uri", "url")
_BYTES = ("response_bytes", "bytes", "body_bytes_sent", "bytes_sent", "size")
_AGENT = ("user_agent", "http_user_agent", "agent", "ua")
_REFERER = ("referer", "http_referer", "referrer")

_SENSOR_KINDS = frozenset({"sensor", "sensor_reading", "reading"})
_WEB_KINDS = frozenset({"web", "web_request", "access_log", "request"})

# The flat single reading: {"device_id", "timestamp", "metric", "value", "unit"}.
_FLAT_KEYS = frozenset((*fields.SENSOR_KEYS, "metric", "value", "unit"))
# Telegraf and line protocol tags naming the entity, first found wins; a
# device's own tag before the Telegraf agent's host.
_ENTITY_TAGS = (*fields.DEVICE, "host")
# A text line that starts like "host ident user [" meant to be an access log.
_ACCESS_LOG_LIKE = re.compile(r"\S+ \S+ \S+ \[")
_WEB_KEYS = frozenset(
    (
        *fields.EVENT_ID,
        *fields.TIME,
        *_HOST,
        *_CLIENT,
        *_PATH,
        *_BYTES,
        *_AGENT,
        *_REFERER,
        *fields.KIND,
        "attributes",
        "method",
        "protocol",
        "request",
        "status",
        "latency_ms",
        "request_time",
    )
)

_METRIC_NAME = re.compile(r"[a-z][a-z0-9_.]{0,63}")
_METHOD = re.compile(r"[A-Z][A-Z_-]{1,19}")
_PROTOCOL = re.compile(r"HTTP/\d(?:\.\d)?")
_HOSTNAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]{0,252})?")
_MAX_PATH = 8192
_MAX_LATENCY_MS = 86_400_000.0
_UNKNOWN_HOST = "unknown"
_MAX_SPECS = 4096

# metric, its unit (None: dimensionless), canonical unit, range
MeasurementSpec = tuple[str, units.Unit | None, str, tuple[float, float] | None]


def content_hash(value: bytes) -> str:
    """The event id of a record whose producer gave none: retries of the same bytes agree."""
    return "h-" + hashlib.blake2b(value, digest_size=16).hexdigest()


class Cleaner:
    """Turns raw records into CleanEvents under one set of rules."""

    def __init__(self, rules: CleaningRules) -> None:
        self._rules = rules
        self._ranges = rules.metric_ranges
        self._specs: dict[tuple[Any, Any], MeasurementSpec] = {}
        self._shapes = SensorShapes(rules, self.measurement_spec)

    @property
    def rules(self) -> CleaningRules:
        return self._rules

    def clean_all(
        self, value: bytes | None, key: bytes | None, content_type: str, now_us: int
    ) -> list[events_pb2.CleanEvent]:
        """The CleanEvents of one raw record, at least one (``source`` and
        ``ingest_time`` unset).

        An event without a producer's id gets the record's content hash,
        suffixed ``-{index}`` when the record holds several: retries of the
        same bytes get the same ids, so they deduplicate. Raises
        RecordRejected, and nothing else, for any bytes and headers.
        """
        found = payload.decode(value, content_type, self._rules)
        assert value is not None  # decode rejects a missing value
        try:
            if isinstance(found, dict):
                common = self._shapes.clean(found, now_us)
                if common is not None:  # its time is checked
                    if not common.event_id:
                        common.event_id = content_hash(value)
                    return [common]
                events = self._from_json(found, key)
            elif isinstance(found, list):
                events = self._from_senml(found, key, now_us)
            elif isinstance(found, str):
                events = self._from_text(found, key, now_us)
            else:
                events = [self._from_protobuf(found, key)]
        except UnicodeEncodeError:
            # JSON escapes can spell lone surrogates, which no UTF-8 string holds.
            raise RecordRejected("invalid_utf8", "a string holds a lone surrogate escape") from None
        if len(events) > self._rules.max_events:
            raise RecordRejected(
                "invalid_field",
                f"record holds {len(events)} readings, over the limit of {self._rules.max_events}",
            )
        base = ""
        for index, event in enumerate(events):
            if not event.event_id:
                base = base or content_hash(value)
                event.event_id = base if len(events) == 1 else f"{base}-{index}"
            self._check_time(event, now_us)
        return events

    def clean(
        self, value: bytes | None, key: bytes | None, content_type: str, now_us: int
    ) -> events_pb2.CleanEvent:
        """The CleanEvent of a raw record that holds one (most do): for callers
        that publish one event per record. A record of several readings is
        RecordRejected ``several_events``, never cut short; ``clean_all``
        takes every record.
        """
        events = self.clean_all(value, key, content_type, now_us)
        if len(events) != 1:
            raise RecordRejected(
                "several_events", f"record holds {len(events)} readings; use clean_all"
            )
        return events[0]

    # JSON -------------------------------------------------------------------

    def _from_json(self, doc: dict[str, Any], key: bytes | None) -> list[events_pb2.CleanEvent]:
        kind = self._json_kind(doc)
        if kind == "telegraf":
            return self._from_telegraf(doc, key)
        event = events_pb2.CleanEvent()
        _, event_id = fields.first(doc, fields.EVENT_ID)
        if event_id is not None:
            event.event_id = fields.identifier(event_id, "event_id", self._rules.max_id_length)
        _, when = fields.first(doc, fields.TIME)
        if when is None:
            raise RecordRejected("missing_field", "event has no timestamp")
        set_timestamp(event.event_time, parse_time(when))
        attributes = doc.get("attributes")
        if attributes is not None:
            if not isinstance(attributes, dict):
                raise RecordRejected("invalid_type", "attributes must be an object")
            for name, item in attributes.items():
                event.attributes[name] = fields.attribute_value(item)
        if kind == "sensor":
            known = self._sensor_json(doc, event)
        else:
            self._web_json(doc, event, key)
            known = _WEB_KEYS
        # Fields we do not know are kept, not rejected: a newer device may add them.
        for name, item in doc.items():
            if name not in known:
                event.attributes[name] = fields.attribute_value(item)
        return [event]

    @staticmethod
    def _json_kind(doc: Mapping[str, Any]) -> str:
        _, declared = fields.first(doc, fields.KIND)
        if isinstance(declared, str):
            if declared.strip().lower() in _SENSOR_KINDS:
                return "sensor"
            if declared.strip().lower() in _WEB_KINDS:
                return "web"
        if _is_telegraf(doc):
            return "telegraf"
        if "metrics" in doc or any(name in doc for name in fields.DEVICE):
            return "sensor"
        if "method" in doc or "request" in doc or "status" in doc:
            return "web"
        raise RecordRejected(
            "unknown_event_kind",
            "JSON is neither a sensor reading (device_id, metrics or metric and value), "
            "a Telegraf metric (name, fields) nor a web request (method, path, status)",
        )

    def _sensor_json(self, doc: Mapping[str, Any], event: events_pb2.CleanEvent) -> frozenset[str]:
        """Fill the reading; returns the fields it used (the rest become attributes)."""
        _, device = fields.first(doc, fields.DEVICE)
        if device is None:
            raise RecordRejected("missing_field", "sensor reading has no device_id")
        reading = event.sensor_reading
        reading.device_id = fields.identifier(device, "device_id", self._rules.max_id_length)
        event.entity_id = reading.device_id
        metrics = doc.get("metrics")
        if metrics is None and "metric" in doc:
            if "value" not in doc:
                raise RecordRejected("missing_field", f"metric {doc['metric']!r} has no value")
            self._add_measurement(reading, doc["metric"], doc["value"], doc.get("unit", ""))
            return _FLAT_KEYS
        if metrics is None:
            raise RecordRejected(
                "missing_field", "sensor reading has no metrics (nor a metric and its value)"
            )
        if isinstance(metrics, dict):
            items = list(metrics.items())
        elif isinstance(metrics, list):
            items = [self._listed_metric(entry) for entry in metrics]
        else:
            raise RecordRejected("invalid_type", "metrics must be an object or an array")
        names = set()
        for name, given in items:
            if isinstance(given, dict):
                if "value" not in given:
                    raise RecordRejected("missing_field", f"metric {name!r} has no value")
                raw_value, unit = given["value"], given.get("unit", "")
            else:
                raw_value, unit = given, ""
            names.add(self._add_measurement(reading, name, raw_value, unit))
        self._check_measurements(reading, names)
        return fields.SENSOR_KEYS

    @staticmethod
    def _listed_metric(entry: Any) -> tuple[Any, Any]:
        if not isinstance(entry, dict):
            raise RecordRejected("invalid_type", "each entry of metrics must be an object")
        _, name = fields.first(entry, ("name", "metric"))
        if name is None:
            raise RecordRejected("missing_field", "a metric has no name")
        return name, entry

    def _web_json(
        self, doc: Mapping[str, Any], event: events_pb2.CleanEvent, key: bytes | None
    ) -> None:
        web = event.web_request
        _, host = fields.first(doc, _HOST)
        web.host = self._host(host, key)
        event.entity_id = web.host
        request = doc.get("request")
        if request is not None:
            web.method, web.path, web.protocol = _split_request(fields.text(request, "request"))
        if "method" in doc:
            web.method = fields.text(doc["method"], "method").upper()
        _, path = fields.first(doc, _PATH)
        if path is not None:
            web.path = fields.text(path, "path")
        if "protocol" in doc:
            web.protocol = fields.text(doc["protocol"], "protocol").upper()
        if "status" not in doc:
            raise RecordRejected("missing_field", "web request has no status")
        status = fields.integer(doc["status"], "status")
        if not 100 <= status <= 599:
            raise RecordRejected("invalid_field", f"status {status} is not an HTTP status")
        web.status = status
        _, client = fields.first(doc, _CLIENT)
        if client is not None:
            web.client_address = fields.text(client, "client_address")
        _, size = fields.first(doc, _BYTES)
        if size is not None and size != "-":
            web.response_bytes = _non_negative(fields.integer(size, "bytes"), "bytes")
        if "latency_ms" in doc:
            web.latency_ms = fields.number(doc["latency_ms"], "latency_ms")
        elif "request_time" in doc:
            web.latency_ms = fields.number(doc["request_time"], "request_time") * 1000.0
        _, agent = fields.first(doc, _AGENT)
        if agent is not None:
            web.user_agent = fields.text(agent, "user_agent")
        _, referer = fields.first(doc, _REFERER)
        if referer is not None:
            web.referer = fields.text(referer, "referer")
        self._check_web(web)

    # SenML, Telegraf and line protocol --------------------------------------

    def _from_senml(
        self, pack: list[Any], key: bytes | None, now_us: int
    ) -> list[events_pb2.CleanEvent]:
        """One event per (entity, time) of the pack, in order of first record.

        Numbers (``v``) and booleans (``vb``, as 1.0 and 0.0) are measurements;
        text (``vs``, ``vd``) and unknown labels are attributes of their reading.
        """
        events: dict[tuple[str, int], events_pb2.CleanEvent] = {}
        names: dict[tuple[str, int], set[str]] = {}
        for record in senml.resolve(pack, now_us):
            try:
                entity = self._entity(record.entity, key, "SenML name has no device part (bn)")
                group = (entity, record.time_us)
                event = events.get(group)
                if event is None:
                    event = events[group] = events_pb2.CleanEvent(entity_id=entity)
                    event.sensor_reading.device_id = entity
                    set_timestamp(event.event_time, record.time_us)
                    names[group] = set()
                value = record.value
                if isinstance(value, str):
                    _set_attribute(event, record.metric, value)
                else:
                    names[group].add(
                        self._add_measurement(
                            event.sensor_reading, record.metric, float(value), record.unit
                        )
                    )
                for label, item in record.extra.items():
                    _set_attribute(event, f"{record.metric}.{label}", fields.attribute_value(item))
            except RecordRejected as rejected:
                raise RecordRejected(
                    rejected.reason, f"SenML record {record.index}: {rejected.message}"
                ) from None
        for group, event in events.items():
            if not event.sensor_reading.measurements:
                raise RecordRejected(
                    "missing_field",
                    f"SenML records of {group[0]!r} at one time hold no number or boolean",
                )
            self._check_measurements(event.sensor_reading, names[group])
        return list(events.values())

    def _from_point(
        self, point: influx.Point, key: bytes | None, now_us: int | None
    ) -> events_pb2.CleanEvent:
        """One event per point: metrics ``<measurement>.<field>``, dimensionless
        (neither format carries units); tags and string fields are attributes."""
        event = events_pb2.CleanEvent()
        entity_tag, given = fields.first(point.tags, _ENTITY_TAGS)
        entity = self._entity(given, key, "point has no device_id, device or host tag")
        event.entity_id = event.sensor_reading.device_id = entity
        if point.time is None:
            if now_us is None:
                raise RecordRejected("missing_field", "point has no timestamp")
            set_timestamp(event.event_time, now_us)  # as InfluxDB: no time means now
        else:
            set_timestamp(event.event_time, parse_time(point.time))
        for tag, text in point.tags.items():
            if tag != entity_tag:
                event.attributes[tag] = text
        names = set()
        reading = event.sensor_reading
        for field, value in point.fields.items():
            if isinstance(value, str):
                _set_attribute(event, field, value)
            else:
                metric = f"{point.measurement}.{field}"
                names.add(self._add_measurement(reading, metric, float(value), None))
        if not reading.measurements:
            raise RecordRejected("missing_field", "point has no numeric or boolean field")
        self._check_measurements(reading, names)
        return event

    def _from_telegraf(
        self, doc: Mapping[str, Any], key: bytes | None
    ) -> list[events_pb2.CleanEvent]:
        points = influx.telegraf_points(doc)
        if "fields" in doc:
            return [self._from_point(points[0], key, None)]
        events = []
        for index, point in enumerate(points):
            try:
                events.append(self._from_point(point, key, None))
            except RecordRejected as rejected:
                raise RecordRejected(
                    rejected.reason, f"metrics[{index}]: {rejected.message}"
                ) from None
        return events

    def _entity(self, given: Any, key: bytes | None, missing: str) -> str:
        """The device id as given, else the record key (how Kafka producers name a source)."""
        if not given and key:
            given = key.decode("utf-8", errors="replace")
        if not given:
            raise RecordRejected("missing_field", missing)
        return fields.identifier(given, "device_id", self._rules.max_id_length)

    # Log lines and protobuf -------------------------------------------------

    def _from_text(self, text: str, key: bytes | None, now_us: int) -> list[events_pb2.CleanEvent]:
        """Access-log lines are web requests; any other text is line protocol."""
        lines = text.split("\n")
        if len(lines) == 1:
            return self._from_line(text, key, now_us)
        events = []
        for number, line in enumerate(lines, 1):
            line = line.rstrip("\r")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                events.extend(self._from_line(line, key, now_us))
            except RecordRejected as rejected:
                raise RecordRejected(
                    rejected.reason, f"line {number}: {rejected.message}"
                ) from None
        if not events:
            raise RecordRejected("malformed_log_line", "text holds no line")
        return events

    def _from_line(self, line: str, key: bytes | None, now_us: int) -> list[events_pb2.CleanEvent]:
        try:
            return [self._from_log_line(line, key)]
        except RecordRejected as rejected:
            if rejected.reason != "malformed_log_line" or _ACCESS_LOG_LIKE.match(line):
                raise
            if "=" not in line:
                raise RecordRejected(
                    "malformed_log_line",
                    f"neither a Combined Log Format line nor line protocol: {line[:120]!r}",
                ) from None
        return [self._from_point(influx.parse_line(line), key, now_us)]

    def _from_log_line(self, line: str, key: bytes | None) -> events_pb2.CleanEvent:
        event = events_pb2.CleanEvent()
        self._log_line_into(line, event, key)
        return event

    def _log_line_into(self, line: str, event: events_pb2.CleanEvent, key: bytes | None) -> None:
        parsed = accesslog.parse_line(line)
        web = event.web_request
        web.host = self._host(None, key)
        event.entity_id = web.host
        set_timestamp(event.event_time, parse_time(parsed.time))
        web.method, web.path, web.protocol = _split_request(parsed.request)
        web.client_address = parsed.client_address
        web.status = parsed.status
        web.response_bytes = parsed.response_bytes
        if parsed.request_time_s is not None:
            web.latency_ms = parsed.request_time_s * 1000.0
        web.user_agent = parsed.user_agent
        web.referer = parsed.referer
        self._check_web(web)

    def _from_protobuf(self, raw: events_pb2.RawEvent, key: bytes | None) -> events_pb2.CleanEvent:
        event = events_pb2.CleanEvent()
        if raw.event_id:
            event.event_id = fields.identifier(raw.event_id, "event_id", self._rules.max_id_length)
        event.attributes.update(raw.attributes)
        body = raw.WhichOneof("body")
        if body == "log_line":
            self._log_line_into(payload._line(raw.log_line), event, key)
            return event
        if not raw.HasField("event_time"):
            raise RecordRejected("missing_field", "RawEvent has no event_time")
        event.event_time.CopyFrom(raw.event_time)
        if body == "sensor_reading":
            reading = event.sensor_reading
            reading.device_id = fields.identifier(
                raw.sensor_reading.device_id, "device_id", self._rules.max_id_length
            )
            event.entity_id = reading.device_id
            names = {
                self._add_measurement(reading, given.metric, given.value, given.unit)
                for given in raw.sensor_reading.measurements
            }
            self._check_measurements(reading, names)
        else:
            web = event.web_request
            web.CopyFrom(raw.web_request)
            web.host = self._host(raw.web_request.host or None, key)
            event.entity_id = web.host
            web.method = web.method.strip().upper()
            web.path = web.path.strip()
            web.protocol = web.protocol.strip().upper()
            web.client_address = web.client_address.strip()
            if not web.status:
                raise RecordRejected("missing_field", "web request has no status")
            if web.latency_ms - web.latency_ms != 0.0:
                raise RecordRejected("non_finite", "latency_ms is not a finite number")
            self._check_web(web)
        return event

    # Shared checks ----------------------------------------------------------

    def _add_measurement(
        self, reading: events_pb2.SensorReading, name: Any, raw_value: Any, unit: Any
    ) -> str:
        """Validate, convert and append one measurement; returns its metric name."""
        metric, found, canonical_unit, bounds = self.measurement_spec(name, unit)
        value = fields.number(raw_value, f"metric {metric!r}")
        if found is not None:
            value = value * found.scale + found.offset
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            raise RecordRejected(
                "out_of_range",
                f"{metric} {value:g} {canonical_unit} is outside [{bounds[0]:g}, {bounds[1]:g}]",
            )
        reading.measurements.add(metric=metric, value=value, unit=canonical_unit)
        return metric

    def measurement_spec(self, name: Any, unit: Any) -> MeasurementSpec:
        """Name, unit and range of a metric as sent; remembered, as devices repeat them."""
        cacheable = isinstance(name, str) and (unit is None or isinstance(unit, str))
        spec = self._specs.get((name, unit)) if cacheable else None
        return self._measurement_spec(name, unit) if spec is None else spec

    def _measurement_spec(self, name: Any, unit: Any) -> MeasurementSpec:
        metric = fields.text(name, "metric name").lower().replace(" ", "_").replace("-", "_")
        if not _METRIC_NAME.fullmatch(metric):
            raise RecordRejected("invalid_field", f"metric name {name!r} is not a name")
        unit_text = fields.text(unit, f"unit of {metric!r}") if unit is not None else ""
        found = units.resolve(metric, unit_text)
        spec = (metric, found, found.canonical if found else "", self._ranges.get(metric))
        if isinstance(name, str) and (unit is None or isinstance(unit, str)):  # hashable
            if len(self._specs) >= _MAX_SPECS:
                self._specs.clear()
            self._specs[(name, unit)] = spec
        return spec

    def _check_measurements(self, reading: events_pb2.SensorReading, names: set[str]) -> None:
        count = len(reading.measurements)
        if count == 0:
            raise RecordRejected("missing_field", "sensor reading has no metrics")
        if count > self._rules.max_metrics:
            raise RecordRejected(
                "invalid_field", f"sensor reading has {count} metrics, over the limit"
            )
        if len(names) != count:
            raise RecordRejected("duplicate_key", "sensor reading names one metric twice")

    def _host(self, given: Any, key: bytes | None) -> str:
        if given is None and key:
            given = key.decode("utf-8", errors="replace")
        if given is None:
            return _UNKNOWN_HOST
        host = fields.text(given, "host").lower()
        if not host:
            return _UNKNOWN_HOST
        if not _HOSTNAME.fullmatch(host):
            raise RecordRejected("invalid_field", f"host {host[:80]!r} is not a host name")
        return host

    @staticmethod
    def _check_web(web: events_pb2.WebRequest) -> None:
        if not web.method:
            raise RecordRejected("missing_field", "web request has no method")
        if not _METHOD.fullmatch(web.method):
            raise RecordRejected(
                "invalid_field", f"method {web.method[:20]!r} is not an HTTP method"
            )
        if not web.path:
            raise RecordRejected("missing_field", "web request has no path")
        if len(web.path) > _MAX_PATH or not (
            web.path[0] == "/" or web.path == "*" or web.path.startswith(("http://", "https://"))
        ):
            raise RecordRejected("invalid_field", f"path {web.path[:80]!r} is not a request target")
        if web.protocol and not _PROTOCOL.fullmatch(web.protocol):
            raise RecordRejected("invalid_field", f"protocol {web.protocol[:20]!r} is not HTTP/x.y")
        if not 100 <= web.status <= 599:
            raise RecordRejected("invalid_field", f"status {web.status} is not an HTTP status")
        if web.client_address in ("", "-"):
            web.client_address = ""
        else:
            web.client_address = _client_address(web.client_address)
        if not 0.0 <= web.latency_ms <= _MAX_LATENCY_MS:
            raise RecordRejected("out_of_range", f"latency {web.latency_ms:g} ms is outside a day")

    def _check_time(self, event: events_pb2.CleanEvent, now_us: int) -> None:
        when = event.event_time.seconds * 1_000_000 + event.event_time.nanos // 1000
        if when > now_us + self._rules.max_future_skew_us:
            ahead = (when - now_us) / 1e6
            raise RecordRejected(
                "future_timestamp", f"event time is {ahead:.0f} s ahead of the clock"
            )
        if when < 0:
            raise RecordRejected("invalid_timestamp", "event time is before 1970")


def _is_telegraf(doc: Mapping[str, Any]) -> bool:
    """A Telegraf JSON metric, or its batch ``{"metrics": [{"fields": …}, …]}``."""
    if "fields" in doc and "name" in doc:
        return True
    batch = doc.get("metrics")
    return (
        isinstance(batch, list)
        and bool(batch)
        and isinstance(batch[0], dict)
        and "fields" in batch[0]
        and not any(name in doc for name in fields.DEVICE)
    )


def _set_attribute(event: events_pb2.CleanEvent, name: str, value: str) -> None:
    if name in event.attributes:
        raise RecordRejected("duplicate_key", f"{name!r} is both a tag and a field, or twice")
    event.attributes[name] = value


def _split_request(request: str) -> tuple[str, str, str]:
    parts = request.split(" ")
    if len(parts) == 3:
        return parts[0].upper(), parts[1], parts[2].upper()
    if len(parts) == 2:  # HTTP/0.9: no protocol
        return parts[0].upper(), parts[1], ""
    raise RecordRejected(
        "invalid_field", f"request {request[:80]!r} is not 'METHOD target PROTOCOL'"
    )


def _non_negative(value: int, field: str) -> int:
    if not 0 <= value < 2**63:
        raise RecordRejected("out_of_range", f"{field} {value} must be between 0 and 2^63")
    return value


def _client_address(given: str) -> str:
    try:
        return str(ipaddress.ip_address(given))
    except ValueError:
        host = given.lower()
        if _HOSTNAME.fullmatch(host):
            return host  # Apache with HostnameLookups logs names, not addresses
        raise RecordRejected(
            "invalid_field", f"client address {given[:80]!r} is not an address"
        ) from None
