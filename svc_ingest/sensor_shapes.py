"""The JSON sensor reading most devices send, cleaned by a plan per key order.

A device sends one shape over and over: the same keys in the same order, its
``metrics`` an object of numbers or of ``{"value", "unit"}`` objects. The
general path (``Cleaner._from_json``) asks of every record which key holds
the id, the time and the device, which kind of event it is and which keys
are attributes; here those answers are worked out once per key order (a
``_Plan``) and the record is filled straight from them, with the same field
functions, in the same order.

Whatever a plan does not cover (a declared kind, Telegraf, a flat reading,
metrics as an array, a value out of range, anything the general path would
reject) makes ``SensorShapes.clean`` return None, and the general path
decides: the fast path never rejects, so it cannot reject differently, and
what it accepts is the event the general path builds
(tests/unit/test_ingest_sensor_shapes.py holds it to that).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.contracts.aistack.v1 import events_pb2
from svc_ingest import fields
from svc_ingest.rejection import RecordRejected
from svc_ingest.rules import CleaningRules
from svc_ingest.timestamps import parse_time, set_timestamp

if TYPE_CHECKING:
    from svc_ingest.cleaner import MeasurementSpec

_MAX_PLANS = 1024
# Integers JSON parsers hand over within 64 bits convert to float exactly as
# the general path converts them; larger ones take the general path.
_LARGEST_INT = 2**63


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where a document of one key order keeps what a sensor reading needs."""

    event_id: str  # "" when the document has no id field
    time: str
    device: str
    attributes: bool
    extra: tuple[str, ...]  # keys kept as attributes, in document order


class SensorShapes:
    """Plans by key order, and the records cleaned by them."""

    def __init__(
        self, rules: CleaningRules, spec_of: Callable[[Any, Any], MeasurementSpec]
    ) -> None:
        self._max_id_length = rules.max_id_length
        self._max_metrics = rules.max_metrics
        self._max_future_skew_us = rules.max_future_skew_us
        # A record must be allowed one reading for any plan to serve.
        self._serves = rules.max_events >= 1
        self._spec_of = spec_of
        self._plans: dict[tuple[str, ...], _Plan | None] = {}

    def clean(self, doc: dict[str, Any], now_us: int) -> events_pb2.CleanEvent | None:
        """The reading's event, as ``Cleaner.clean_all`` returns it but for an
        id the producer did not give (left empty), or None: the general
        path decides. ``now_us``: the clock event times may not run ahead of."""
        order = tuple(doc)
        try:
            plan = self._plans[order]
        except KeyError:
            plan = self._plan(order)
        if plan is None:
            return None
        try:
            return self._fill(doc, plan, now_us)
        except RecordRejected:
            return None

    def _plan(self, order: tuple[str, ...]) -> _Plan | None:
        """The general path's questions that the keys alone answer."""
        if len(self._plans) >= _MAX_PLANS:
            self._plans.clear()
        keys = set(order)
        plan = None
        if (
            self._serves
            and "metrics" in keys
            and not keys.intersection(fields.KIND)
            and not {"fields", "name"} <= keys  # a Telegraf metric
        ):
            time = _first(order, fields.TIME)
            device = _first(order, fields.DEVICE)
            if time and device:
                plan = _Plan(
                    event_id=_first(order, fields.EVENT_ID),
                    time=time,
                    device=device,
                    attributes="attributes" in keys,
                    extra=tuple(name for name in order if name not in fields.SENSOR_KEYS),
                )
        self._plans[order] = plan
        return plan

    def _fill(self, doc: dict[str, Any], plan: _Plan, now_us: int) -> events_pb2.CleanEvent | None:
        metrics = doc["metrics"]
        if type(metrics) is not dict or not metrics:
            return None
        event = events_pb2.CleanEvent()
        if plan.event_id:
            given = doc[plan.event_id]
            if given is not None:
                event.event_id = fields.identifier(given, "event_id", self._max_id_length)
        when = doc[plan.time]
        if when is None:
            return None
        micros = parse_time(when)
        if not 0 <= micros <= now_us + self._max_future_skew_us:
            return None
        set_timestamp(event.event_time, micros)
        if plan.attributes:
            attributes = doc["attributes"]
            if attributes is not None:
                if type(attributes) is not dict:
                    return None
                for name, item in attributes.items():
                    event.attributes[name] = fields.attribute_value(item)
        device = doc[plan.device]
        if device is None:
            return None
        reading = event.sensor_reading
        reading.device_id = fields.identifier(device, "device_id", self._max_id_length)
        event.entity_id = reading.device_id
        if not self._add_measurements(reading.measurements, metrics):
            return None
        for name in plan.extra:
            item = doc[name]
            event.attributes[name] = item if type(item) is str else fields.attribute_value(item)
        return event

    def _add_measurements(self, measurements: Any, metrics: dict[Any, Any]) -> bool:
        """Append each metric, converted and in range; False where the general
        path must decide."""
        if len(metrics) > self._max_metrics:
            return False
        names = set()
        for name, given in metrics.items():
            if type(given) is dict:
                if "value" not in given:
                    return False
                raw, unit = given["value"], given.get("unit", "")
            else:
                raw, unit = given, ""
            kind = type(raw)
            if kind is float:
                if raw - raw != 0.0:  # inf or nan
                    return False
                value = raw
            elif kind is int and -_LARGEST_INT < raw < _LARGEST_INT:
                value = float(raw)
            else:
                return False
            metric, found, canonical_unit, bounds = self._spec_of(name, unit)
            if found is not None:
                value = value * found.scale + found.offset
            if bounds is not None and not bounds[0] <= value <= bounds[1]:
                return False
            measurements.add(metric=metric, value=value, unit=canonical_unit)
            names.add(metric)
        return len(names) == len(metrics)


def _first(order: tuple[str, ...], names: tuple[str, ...]) -> str:
    """``fields.first``'s choice among keys: the first of ``names`` present."""
    for name in names:
        if name in order:
            return name
    return ""
