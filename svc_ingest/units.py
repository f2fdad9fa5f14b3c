"""The one unit table: every unit a device may send, and its canonical form.

A reading is stored in the canonical unit of its dimension (°C, %, hPa…), so
that windows over one metric never mix units. ``canonical = value * scale +
offset``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from svc_ingest.rejection import RecordRejected


@dataclass(frozen=True, slots=True)
class Unit:
    dimension: str
    canonical: str
    scale: float = 1.0
    offset: float = 0.0

    def to_canonical(self, value: float) -> float:
        return value * self.scale + self.offset


def _units(
    dimension: str, canonical: str, *aliases: tuple[tuple[str, ...], float, float]
) -> dict[str, Unit]:
    table: dict[str, Unit] = {}
    for names, scale, offset in aliases:
        for name in names:
            table[name] = Unit(dimension, canonical, scale, offset)
    return table


# Keys are lower-case, as the cleaner looks them up after .strip().lower().
UNITS: Mapping[str, Unit] = {
    **_units(
        "temperature",
        "degC",
        (("c", "°c", "degc", "celsius", "℃", "cel"), 1.0, 0.0),  # "Cel": SenML
        (("f", "°f", "degf", "fahrenheit", "℉"), 5 / 9, -32 * 5 / 9),
        (("k", "kelvin"), 1.0, -273.15),
    ),
    **_units(
        "ratio",
        "%",
        (("%", "percent", "pct", "%rh", "rh"), 1.0, 0.0),
    ),
    **_units(
        "pressure",
        "hPa",
        (("hpa", "mbar", "millibar"), 1.0, 0.0),
        (("pa", "pascal"), 0.01, 0.0),
        (("kpa",), 10.0, 0.0),
        (("bar",), 1000.0, 0.0),
        (("psi",), 68.947572932, 0.0),
        (("inhg",), 33.8638866667, 0.0),
        (("mmhg", "torr"), 1.33322387415, 0.0),
    ),
    **_units(
        "voltage",
        "V",
        (("v", "volt", "volts"), 1.0, 0.0),
        (("mv", "millivolt", "millivolts"), 0.001, 0.0),
    ),
    **_units(
        "current",
        "A",
        (("a", "amp", "ampere", "amps"), 1.0, 0.0),
        (("ma", "milliamp", "milliampere"), 0.001, 0.0),
    ),
    **_units(
        "power",
        "W",
        (("w", "watt", "watts"), 1.0, 0.0),
        (("kw", "kilowatt"), 1000.0, 0.0),
        (("mw", "milliwatt"), 0.001, 0.0),
    ),
    **_units(
        "energy",
        "J",
        (("j", "joule"), 1.0, 0.0),
        (("wh",), 3600.0, 0.0),
        (("kwh",), 3.6e6, 0.0),
    ),
    **_units(
        "concentration",
        "ppm",
        (("ppm",), 1.0, 0.0),
        (("ppb",), 0.001, 0.0),
    ),
    **_units(
        "speed",
        "m/s",
        (("m/s", "mps"), 1.0, 0.0),
        (("km/h", "kmh", "kph"), 1 / 3.6, 0.0),
        (("mph",), 0.44704, 0.0),
        (("kn", "kt", "knot", "knots"), 0.514444, 0.0),
    ),
    **_units(
        "length",
        "m",
        (("m", "meter", "metre"), 1.0, 0.0),
        (("cm",), 0.01, 0.0),
        (("mm",), 0.001, 0.0),
        (("km",), 1000.0, 0.0),
        (("ft", "feet"), 0.3048, 0.0),
        (("in", "inch"), 0.0254, 0.0),
    ),
    **_units(
        "illuminance",
        "lx",
        (("lx", "lux"), 1.0, 0.0),
    ),
}

# Metrics whose dimension is known: a unit of another dimension is a
# producer's bug, and a missing unit is ambiguous, so both are rejected.
METRIC_DIMENSIONS: Mapping[str, str] = {
    "temperature": "temperature",
    "humidity": "ratio",
    "relative_humidity": "ratio",
    "pressure": "pressure",
    "battery": "voltage",
    "voltage": "voltage",
    "current": "current",
    "power": "power",
    "energy": "energy",
    "co2": "concentration",
    "speed": "speed",
    "wind_speed": "speed",
    "distance": "length",
    "light": "illuminance",
}

# Plausible ranges in canonical units; settings may replace any of them.
DEFAULT_RANGES: Mapping[str, tuple[float, float]] = {
    "temperature": (-100.0, 200.0),
    "humidity": (0.0, 100.0),
    "relative_humidity": (0.0, 100.0),
    "pressure": (300.0, 1200.0),
    "battery": (0.0, 1000.0),
    "voltage": (-1e6, 1e6),
    "co2": (0.0, 100_000.0),
    "speed": (0.0, 350.0),
    "wind_speed": (0.0, 150.0),
    "light": (0.0, 200_000.0),
}


def canonical(metric: str, value: float, unit: str) -> tuple[float, str]:
    """``value`` in ``unit`` as (value, unit) in the canonical unit of its dimension."""
    found = resolve(metric, unit)
    if found is None:
        return value, ""
    return found.to_canonical(value), found.canonical


def resolve(metric: str, unit: str) -> Unit | None:
    """The unit ``metric`` is sent in; None for a dimensionless metric.

    Raises RecordRejected: ``unknown_unit``, ``unit_mismatch``, or ``missing_field``
    when a metric of known dimension comes without a unit. An unknown metric
    without a unit stays dimensionless.
    """
    dimension = METRIC_DIMENSIONS.get(metric)
    if not unit:
        if dimension is None:
            return None
        raise RecordRejected("missing_field", f"metric {metric!r} has no unit")
    found = UNITS.get(unit.lower())
    if found is None:
        raise RecordRejected("unknown_unit", f"metric {metric!r} has unknown unit {unit!r}")
    if dimension is not None and found.dimension != dimension:
        raise RecordRejected(
            "unit_mismatch",
            f"metric {metric!r} measures {dimension}, but unit {unit!r} is {found.dimension}",
        )
    return found
