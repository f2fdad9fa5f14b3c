"""The pure parts of svc_score's Spark job: the input's fingerprint, the
worker's error in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import InvalidArgument
from svc_score import job


def test_the_input_digest_changes_when_a_file_is_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "part.parquet"
    path.write_bytes(b"one")
    before = job.input_digest([str(path)])
    assert job.input_digest([f"file:{path}"]) == before  # as Hadoop lists it
    assert job.input_digest([path.as_uri()]) == before
    path.write_bytes(b"three")
    assert job.input_digest([str(path)]) != before


def test_only_local_files_are_fingerprinted() -> None:
    with pytest.raises(InvalidArgument, match="local files only"):
        job.input_digest(["s3://bucket/part.parquet"])


def test_a_failed_task_is_told_by_the_workers_last_line() -> None:
    text = (
        "An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n"
        '  File "job.py", line 1, in run\n'
        "shared.model_loading.ArtifactRejected: artifact x has sha256 a, the event says b\n"
        "\n\nJVM stacktrace:\norg.apache.spark.api.python.PythonException: ...\n"
    )
    assert job._python_error(RuntimeError(text)) == (
        "shared.model_loading.ArtifactRejected: artifact x has sha256 a, the event says b"
    )
