from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shared.errors import ConfigError
from shared.settings import CommonSettings, load_settings
from svc_ingest.app import CLEAN_SHUTDOWN_MARK, mark_clean_shutdown, prepare_state, state_dir
from svc_ingest.settings import IngestSettings


def test_defaults_and_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AISTACK_INGEST_METRIC_RANGES", '{"temperature": [-10, 40]}')
    settings = load_settings(IngestSettings)
    assert settings.processing_guarantee == "exactly_once"
    assert settings.source_topic == "aistack.events.raw"
    rules = settings.cleaning_rules()
    assert rules.metric_ranges["temperature"] == (-10.0, 40.0)
    assert rules.metric_ranges["humidity"] == (0.0, 100.0)  # the defaults stay


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AISTACK_INGEST_PROCESSING_GUARANTEE", "maybe_once"),
        ("AISTACK_INGEST_DEDUP_WINDOW_SECONDS", "-1"),
        ("AISTACK_INGEST_METRIC_RANGES", '{"temperature": [40, -10]}'),
        ("AISTACK_INGEST_BATCH_MAX", "0"),
        ("AISTACK_INGEST_STORE", "redis"),
    ],
)
def test_a_bad_setting_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings(IngestSettings)
    assert "\n" not in str(caught.value)
    assert variable in str(caught.value) or "METRIC_RANGES" in str(caught.value).upper()


def test_the_worker_refuses_a_bad_setting_with_one_line() -> None:
    env = {"PATH": "/usr/bin:/bin", "AISTACK_INGEST_PROCESSING_GUARANTEE": "maybe_once"}
    done = subprocess.run(
        [sys.executable, "-m", "svc_ingest"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "AISTACK_INGEST_PROCESSING_GUARANTEE" in lines[0]


def _settings(tmp_path: Path, guarantee: str) -> IngestSettings:
    return IngestSettings(common=CommonSettings(state_dir=tmp_path), processing_guarantee=guarantee)


def test_local_state_survives_only_a_clean_shutdown_under_exactly_once(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "exactly_once")
    tables = state_dir(settings) / "v1" / "tables"
    tables.mkdir(parents=True)
    mark_clean_shutdown(settings)
    assert not prepare_state(settings)  # clean: kept, and the mark is consumed
    assert tables.exists() and not (state_dir(settings) / CLEAN_SHUTDOWN_MARK).exists()
    assert prepare_state(settings)  # no mark: a crash; rebuilt from the changelog
    assert not tables.exists()


def test_at_least_once_keeps_local_state(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "at_least_once")
    tables = state_dir(settings) / "v1" / "tables"
    tables.mkdir(parents=True)
    assert not prepare_state(settings)
    assert tables.exists()
