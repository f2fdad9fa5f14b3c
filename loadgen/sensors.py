"""Good IoT sensor readings: JSON (two metric shapes) and protobuf RawEvent."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from loadgen import timestamps
from loadgen.records import Draft, EventIds, Format, JsonDraft, ProtoDraft
from shared.contracts.aistack.v1 import events_pb2

# Per metric: the units a device may report in and how to get there from the
# canonical unit (°C, %, hPa, V, ppm, m/s).
_UNITS: Mapping[str, Mapping[str, Callable[[float], float]]] = {
    "temperature": {
        "C": lambda c: c,
        "°C": lambda c: c,
        "F": lambda c: c * 9 / 5 + 32,
        "°F": lambda c: c * 9 / 5 + 32,
        "K": lambda c: c + 273.15,
    },
    "humidity": {"%": lambda h: h},
    "pressure": {
        "hPa": lambda p: p,
        "Pa": lambda p: p * 100,
        "kPa": lambda p: p / 10,
        "psi": lambda p: p * 0.0145037738,
    },
    "battery": {"V": lambda v: v, "mV": lambda v: v * 1000},
    "co2": {"ppm": lambda c: c},
    "speed": {"m/s": lambda s: s, "km/h": lambda s: s * 3.6},
}

# Device families and what each measures.
_FAMILIES: Mapping[str, tuple[str, ...]] = {
    "thermo": ("temperature", "humidity"),
    "weather": ("temperature", "humidity", "pressure", "speed"),
    "air": ("co2", "temperature", "humidity"),
    "tracker": ("speed", "battery"),
    "probe": ("temperature", "battery"),
}
_SITES = ("plant-a", "plant-b", "warehouse-3", "office-hq", "field-7")
_FIRMWARE = ("1.2.3", "1.4.0", "2.0.1", "2.1.0-rc1")


@dataclass(frozen=True)
class Device:
    device_id: str
    site: str
    firmware: str
    # A device reports each metric in one unit for its whole life.
    units: tuple[tuple[str, str], ...]
    indoor: bool


def _devices(rng: random.Random, count: int) -> list[Device]:
    devices: list[Device] = []
    used: set[str] = set()
    while len(devices) < count:
        family = rng.choice(sorted(_FAMILIES))
        device_id = f"{family}-{rng.randrange(10_000):04d}"
        if device_id in used:
            continue
        used.add(device_id)
        units = tuple((m, rng.choice(sorted(_UNITS[m]))) for m in _FAMILIES[family])
        devices.append(
            Device(device_id, rng.choice(_SITES), rng.choice(_FIRMWARE), units, rng.random() < 0.5)
        )
    return devices


def _canonical_value(rng: random.Random, metric: str, indoor: bool) -> float:
    """A plausible reading in the canonical unit, well inside physical limits."""
    if metric == "temperature":
        return min(55.0, max(-35.0, rng.gauss(21.0, 2.0) if indoor else rng.gauss(12.0, 10.0)))
    if metric == "humidity":
        return min(98.0, max(2.0, rng.gauss(45.0, 12.0)))
    if metric == "pressure":
        return min(1040.0, max(960.0, rng.gauss(1013.0, 9.0)))
    if metric == "battery":
        return rng.uniform(3.3, 4.2)
    if metric == "co2":
        return rng.uniform(400.0, 1800.0)
    return rng.uniform(0.0, 25.0)  # speed


class SensorSource:
    """Readings from a fixed fleet of devices, times in the ``span_seconds``
    before ``now``; ``shift`` adds to a metric's readings (in its canonical
    unit, before conversion to the device's), to move its distribution."""

    def __init__(
        self,
        rng: random.Random,
        now: datetime,
        ids: EventIds,
        fleet: int = 48,
        *,
        span_seconds: float = timestamps.DEFAULT_SPAN_SECONDS,
        shift: Mapping[str, float] | None = None,
    ) -> None:
        self._rng = rng
        self._now = now
        self._ids = ids
        self._devices = _devices(rng, fleet)
        self._span_seconds = span_seconds
        self._shift = dict(shift or {})

    def draft(self, fmt: Format, *, structured: bool = False) -> Draft:
        if fmt == "log":
            raise ValueError("sensors have no log-line form")
        device = self._rng.choice(self._devices)
        moment = timestamps.recent(self._rng, self._now, self._span_seconds)
        readings = [
            (metric, unit, round(_UNITS[metric][unit](self._canonical(metric, device)), 2))
            for metric, unit in device.units
        ]
        if fmt == "protobuf":
            return self._proto(device, moment, readings)
        return self._json(device, moment, readings)

    def _canonical(self, metric: str, device: Device) -> float:
        return _canonical_value(self._rng, metric, device.indoor) + self._shift.get(metric, 0.0)

    def _json(
        self, device: Device, moment: datetime, readings: list[tuple[str, str, float]]
    ) -> JsonDraft:
        rng = self._rng
        event_id = self._ids.next()

        def value(number: float) -> float | str:
            # Some firmwares send numbers as strings.
            return str(number) if rng.random() < 0.25 else number

        metrics: dict[str, Any] | list[dict[str, Any]]
        if rng.random() < 0.7:
            metrics = {m: {"value": value(v), "unit": u} for m, u, v in readings}
        else:
            metrics = [{"name": m, "value": value(v), "unit": u} for m, u, v in readings]
        doc: dict[str, Any] = {
            "event_id": event_id,
            "device_id": device.device_id,
            "timestamp": timestamps.render(rng, moment),
            "metrics": metrics,
            "attributes": {"site": device.site},
        }
        # Fields this schema does not know: newer firmwares add them.
        if rng.random() < 0.3:
            doc["firmware"] = device.firmware
        if rng.random() < 0.15:
            doc["rssi"] = rng.randint(-95, -40)
        return JsonDraft(device.device_id.encode(), event_id, doc)

    def _proto(
        self, device: Device, moment: datetime, readings: list[tuple[str, str, float]]
    ) -> ProtoDraft:
        event_id = self._ids.next()
        message = events_pb2.RawEvent(event_id=event_id, attributes={"site": device.site})
        message.event_time.FromMicroseconds(timestamps.epoch_us(moment))
        message.sensor_reading.device_id = device.device_id
        for metric, unit, number in readings:
            message.sensor_reading.measurements.add(metric=metric, value=number, unit=unit)
        return ProtoDraft(device.device_id.encode(), event_id, message)
