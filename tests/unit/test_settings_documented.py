"""Every setting the code reads is a row of the settings page's table
(docs/settings.md), and every row names a setting the code reads (no stale
rows)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import settings_catalog

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_PAGE = ROOT / "docs" / "settings.md"

_NAME = re.compile(r"`([^`]+)`")


def settings_section(text: str) -> str:
    """The page between its ``# Settings`` title and the next heading."""
    match = re.search(r"^# Settings\n(.*?)(?=^#{1,2} |\Z)", text, re.MULTILINE | re.DOTALL)
    if match is None:
        raise AssertionError("docs/settings.md has no '# Settings' title")
    return match.group(1)


def expand(names: list[str], prefixes: tuple[str, ...]) -> list[str]:
    """Full variable names of one row's first column.

    A name starting with ``_`` abbreviates one with the prefix of the row's
    first (full) name: with ``AISTACK_KAFKA_SSL_CAFILE`` first, ``_SSL_CERTFILE``
    is ``AISTACK_KAFKA_SSL_CERTFILE``. The prefix is the longest settings-class
    prefix the first name starts with.
    """
    first = names[0]
    if not first.startswith("AISTACK_"):
        raise AssertionError(f"a row must start with a full AISTACK_ name, got {first!r}")
    prefix = next((p for p in prefixes if first.startswith(p)), "AISTACK_")
    return [name if name.startswith("AISTACK_") else prefix + name.lstrip("_") for name in names]


def documented(text: str, prefixes: tuple[str, ...]) -> set[str]:
    """Every variable the settings table's first column names."""
    found: set[str] = set()
    for line in settings_section(text).splitlines():
        cells = line.split("|")
        if len(cells) < 3 or not line.startswith("|"):
            continue
        names = _NAME.findall(cells[1])
        if names:
            found.update(expand(names, prefixes))
    return found


PREFIXES = ("AISTACK_KAFKA_", "AISTACK_TUNER_", "AISTACK_")


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (
            ["AISTACK_KAFKA_SSL_CAFILE", "_SSL_CERTFILE", "_SSL_KEY_PASSWORD"],
            [
                "AISTACK_KAFKA_SSL_CAFILE",
                "AISTACK_KAFKA_SSL_CERTFILE",
                "AISTACK_KAFKA_SSL_KEY_PASSWORD",
            ],
        ),
        (
            ["AISTACK_TUNER_TLS_CERT_FILE", "_TLS_KEY_FILE"],
            ["AISTACK_TUNER_TLS_CERT_FILE", "AISTACK_TUNER_TLS_KEY_FILE"],
        ),
        (
            ["AISTACK_KAFKA_SASL_USERNAME", "AISTACK_KAFKA_SASL_PASSWORD"],
            ["AISTACK_KAFKA_SASL_USERNAME", "AISTACK_KAFKA_SASL_PASSWORD"],
        ),
        (["AISTACK_LOG_LEVEL"], ["AISTACK_LOG_LEVEL"]),
    ],
)
def test_abbreviations_take_the_first_names_prefix(names: list[str], expected: list[str]) -> None:
    assert expand(names, PREFIXES) == expected


def test_the_table_is_read_only_between_its_heading_and_the_next() -> None:
    text = (
        "# Settings\n\n| variable | default | what |\n| --- | --- | --- |\n"
        "| `AISTACK_LOG_LEVEL` | `INFO` | levels |\n\n"
        "## Next\n\n| `AISTACK_NOT_HERE` | x | y |\n"
    )
    assert documented(text, PREFIXES) == {"AISTACK_LOG_LEVEL"}


def test_the_catalog_sees_every_kind_of_settings_class() -> None:
    names = settings_catalog.env_names()
    # nested settings models are not variables; their fields are, with their prefix
    assert "AISTACK_COMMON" not in names and "AISTACK_TRANSFORM_SPARK" not in names
    assert {"AISTACK_LOG_LEVEL", "AISTACK_SPARK_MASTER", "AISTACK_INFRA_HOST"} <= names
    # GrpcServerSettings' fields under each subclass's own prefix, never bare
    assert {"AISTACK_TUNER_TLS_KEY_FILE", "AISTACK_MODEL_AUTH_TOKEN"} <= names
    assert "AISTACK_GRPC_ADDRESS" not in names
    classes = {settings_catalog.qualified_name(c) for c in settings_catalog.settings_classes()}
    assert settings_catalog.EXPECTED <= classes, settings_catalog.EXPECTED - classes
    # bases that are never built on their own
    assert not classes & {
        "shared.settings.ServiceSettings",
        "shared.rpc.settings.GrpcServerSettings",
    }


def test_every_setting_is_in_the_settings_table() -> None:
    table = documented(SETTINGS_PAGE.read_text(), settings_catalog.env_prefixes())
    catalog = settings_catalog.settings()
    missing = sorted(set(catalog) - table)
    assert not missing, "settings missing from docs/settings.md's table: " + ", ".join(
        f"{name} ({catalog[name].owner.__name__}.{catalog[name].field})" for name in missing
    )


def test_every_row_is_a_real_setting() -> None:
    table = documented(SETTINGS_PAGE.read_text(), settings_catalog.env_prefixes())
    stale = sorted(table - settings_catalog.env_names())
    assert not stale, "docs/settings.md's table names unknown settings: " + ", ".join(stale)
