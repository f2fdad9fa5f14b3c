"""Builds svc_ingest's compiled modules beside their sources, each when its
source is newer: ``_sensor_bytes`` (the common JSON sensor reading, a fresh
traceparent) and ``_id_table`` (the dedup window's index of ids).

``python -m svc_ingest.sensor_bytes_build`` (``make setup`` runs it): gcc,
this interpreter's headers, ``-ffp-contract=off`` so that ``x * scale +
offset`` rounds twice, as Python's floats do, and not once in a fused
multiply-add.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

SOURCE = Path(__file__).with_name("_sensor_bytes.c")
ID_TABLE_SOURCE = SOURCE.with_name("_id_table.c")
FLAGS = ("-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-Wall", "-Werror")


def target(source: Path) -> Path:
    return source.with_name(source.stem + str(sysconfig.get_config_var("EXT_SUFFIX")))


def build(source: Path = SOURCE) -> Path:
    built = target(source)
    if built.exists() and built.stat().st_mtime >= source.stat().st_mtime:
        return built
    include = sysconfig.get_paths()["include"]
    command = ["gcc", *FLAGS, f"-I{include}", str(source), "-o", str(built), "-lm"]
    subprocess.run(command, check=True)
    return built


if __name__ == "__main__":
    for source in (SOURCE, ID_TABLE_SOURCE):
        try:
            print(f"built {build(source)}")
        except (OSError, subprocess.CalledProcessError) as exc:
            sys.exit(f"svc_ingest.{source.stem}: build failed: {exc}")
