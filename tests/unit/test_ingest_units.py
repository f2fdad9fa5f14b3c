from __future__ import annotations

import pytest

from svc_ingest import units
from svc_ingest.rejection import RecordRejected


@pytest.mark.parametrize(
    ("metric", "value", "unit", "expected", "canonical"),
    [
        ("temperature", 212.0, "°F", 100.0, "degC"),
        ("temperature", 32.0, "F", 0.0, "degC"),
        ("temperature", 273.15, "K", 0.0, "degC"),
        ("temperature", 21.5, "C", 21.5, "degC"),
        ("temperature", 21.5, "Celsius", 21.5, "degC"),
        ("pressure", 101_325.0, "Pa", 1013.25, "hPa"),
        ("pressure", 1.0, "bar", 1000.0, "hPa"),
        ("pressure", 14.6959, "psi", 1013.25, "hPa"),
        ("battery", 3700.0, "mV", 3.7, "V"),
        ("speed", 36.0, "km/h", 10.0, "m/s"),
        ("humidity", 40.0, "%", 40.0, "%"),
        ("steps", 12.0, "", 12.0, ""),  # unknown metric, no unit: dimensionless
        ("flow", 2.0, "kW", 2000.0, "W"),  # unknown metric, known unit
    ],
)
def test_units_become_canonical(
    metric: str, value: float, unit: str, expected: float, canonical: str
) -> None:
    got, got_unit = units.canonical(metric, value, unit)
    assert got == pytest.approx(expected, rel=1e-4, abs=1e-9)
    assert got_unit == canonical


@pytest.mark.parametrize(
    ("metric", "unit", "reason"),
    [
        ("temperature", "furlongs", "unknown_unit"),
        ("temperature", "hPa", "unit_mismatch"),
        ("humidity", "V", "unit_mismatch"),
        ("temperature", "", "missing_field"),
    ],
)
def test_bad_units_are_rejected(metric: str, unit: str, reason: str) -> None:
    with pytest.raises(RecordRejected) as caught:
        units.canonical(metric, 1.0, unit)
    assert caught.value.reason == reason


def test_every_unit_alias_is_lower_case_and_every_range_is_ordered() -> None:
    assert all(name == name.lower() for name in units.UNITS)
    assert all(low < high for low, high in units.DEFAULT_RANGES.values())
    dimensions = {unit.dimension for unit in units.UNITS.values()}
    assert set(units.METRIC_DIMENSIONS.values()) <= dimensions
