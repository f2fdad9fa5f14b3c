"""svc_transform's stored watermark, read from Spark's offset log as any
version of the service left it, and the starting offsets a fresh epoch gives."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from compose.transform_epoch import stored_watermark
from shared.errors import ConfigError
from shared.settings import load_settings
from svc_transform.settings import TransformSettings


def offsets(checkpoint: Path, query: str, batch: int, watermark_ms: int) -> None:
    log = checkpoint / query / "offsets"
    log.mkdir(parents=True, exist_ok=True)
    metadata = {"batchWatermarkMs": watermark_ms, "batchTimestampMs": 1, "conf": {}}
    source = {"aistack.events.clean": {"0": 5, "1": 7}}
    (log / str(batch)).write_text(f"v1\n{json.dumps(metadata)}\n{json.dumps(source)}")


def test_the_latest_batch_of_any_query_holds_the_watermark(tmp_path: Path) -> None:
    assert stored_watermark(tmp_path) is None  # no query yet
    offsets(tmp_path, "windows", 0, 0)
    assert stored_watermark(tmp_path) is None  # no event yet
    at = datetime(2026, 11, 25, 6, 0, tzinfo=UTC)
    offsets(tmp_path, "windows", 9, int(at.timestamp() * 1000))
    offsets(tmp_path, "windows", 10, int(at.timestamp() * 1000) + 60_000)
    offsets(tmp_path, "open-windows", 3, int(at.timestamp() * 1000))
    (tmp_path / "windows" / "offsets" / ".10.crc").write_text("")  # Hadoop's checksum files
    assert stored_watermark(tmp_path) == datetime(2026, 11, 25, 6, 1, tzinfo=UTC)


def test_starting_offsets_take_spark_json_and_refuse_anything_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given = json.dumps({"aistack.events.clean": {"0": 5, "1": 7}})
    monkeypatch.setenv("AISTACK_TRANSFORM_STARTING_OFFSETS", given)
    assert load_settings(TransformSettings).starting_offsets == given
    for bad in ("middle", '{"t": {"zero": 1}}', '{"t": {"0": "1"}}', "[1]"):
        monkeypatch.setenv("AISTACK_TRANSFORM_STARTING_OFFSETS", bad)
        with pytest.raises(ConfigError, match="AISTACK_TRANSFORM_STARTING_OFFSETS"):
            load_settings(TransformSettings)
