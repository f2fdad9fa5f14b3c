"""The Kafka broker's JVM maps the class archive ``make setup`` built: a JVM
on Kafka's class path started with ``-Xshare:on`` (which turns an archive it
cannot map into a failed start) runs with it, and the brokers the launcher
starts are pointed at it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from compose import kafka_class_archive, kafka_dist
from shared.settings import CommonSettings
from tests.infra import Infra


def test_a_jvm_on_kafkas_class_path_maps_the_archive() -> None:
    cache = CommonSettings().cache_dir
    # Built by make setup: a no-op here, unless the cache was emptied since.
    archive = kafka_class_archive.ensure(cache)
    done = subprocess.run(
        [
            "java",
            "-Xshare:on",
            f"-XX:SharedArchiveFile={archive}",
            "-Xlog:class+load=info",
            "-cp",
            kafka_dist.classpath(cache),
            "kafka.tools.StorageTool",
            "random-uuid",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    # Kafka's own classes come from the archive (the dynamic, "top" layer),
    # not from its jars.
    assert "org.apache.kafka.common.config.AbstractConfig source: shared objects file (top)" in (
        done.stdout
    )


def test_the_launchers_broker_runs_with_the_archive(infra: Infra) -> None:
    if infra.local_stack is None:
        pytest.skip(f"the broker is {infra.kind}'s, not the local launcher's")
    stack = infra.local_stack
    archive = kafka_class_archive.ensure(stack.cache_dir)
    pid = stack.kafka.pid()
    assert pid is not None
    arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert f"-XX:SharedArchiveFile={archive}".encode() in arguments
