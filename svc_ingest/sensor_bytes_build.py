"""Builds ``svc_ingest._sensor_bytes`` beside its source, when the source is newer.

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
TARGET = SOURCE.with_name("_sensor_bytes" + str(sysconfig.get_config_var("EXT_SUFFIX")))
FLAGS = ("-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-Wall", "-Werror")


def build() -> Path:
    if TARGET.exists() and TARGET.stat().st_mtime >= SOURCE.stat().st_mtime:
        return TARGET
    include = sysconfig.get_paths()["include"]
    command = ["gcc", *FLAGS, f"-I{include}", str(SOURCE), "-o", str(TARGET), "-lm"]
    subprocess.run(command, check=True)
    return TARGET


if __name__ == "__main__":
    try:
        print(f"built {build()}")
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"svc_ingest._sensor_bytes: build failed: {exc}")
