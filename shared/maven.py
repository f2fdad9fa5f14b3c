"""Java runtimes resolved from Maven Central once, into the user's cache.

Each runtime is a ``pom.xml`` whose dependencies are the jars wanted; Maven
copies them (runtime scope: what the pom marks ``provided`` is left out) into
``<home>/libs``, and a stamp file marks the copy complete: of that pom and
the properties it was resolved with, whose digest it holds, so that a changed
pom (a dependency added or pinned) is fetched again into the same home.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from shared.errors import ConfigError, Unavailable

_STAMP = ".complete"


def is_fetched(home: Path, pom: Path, properties: Mapping[str, str] | None = None) -> bool:
    """Whether ``home`` holds a complete copy of ``pom``'s runtime as it is
    now, resolved with ``properties``."""
    stamp = home / _STAMP
    return stamp.is_file() and _digest(pom, properties) in stamp.read_text().splitlines()


def _digest(pom: Path, properties: Mapping[str, str] | None) -> str:
    digest = hashlib.sha256(pom.read_bytes())
    for name, value in sorted((properties or {}).items()):
        digest.update(f"\0{name}={value}".encode())
    return digest.hexdigest()


def fetch_runtime(
    pom: Path,
    home: Path,
    *,
    expect: str,
    what: str,
    properties: Mapping[str, str] | None = None,
) -> Path:
    """Copy ``pom``'s runtime dependencies into ``home/libs`` (a no-op when there).

    ``expect`` is a glob that must match a copied file; ``properties``
    override the pom's own (``-Dname=value``). Raises ConfigError when Maven
    is missing and Unavailable when Maven Central cannot be reached.
    """
    if is_fetched(home, pom, properties):
        return home
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError(f"Maven (mvn) is needed once to fetch {what}: apt-get install maven")
    home.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home.parent) as tmp:
        libs = Path(tmp) / "libs"
        result = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={libs}",
                *(f"-D{name}={value}" for name, value in sorted((properties or {}).items())),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0 or not any(libs.glob(expect)):
            tail = (result.stdout + result.stderr).strip().splitlines()[-5:]
            raise Unavailable(f"could not fetch {what}: {' | '.join(tail)}")
        if home.exists():
            shutil.rmtree(home)
        home.mkdir(parents=True)
        libs.rename(home / "libs")
    (home / _STAMP).write_text(f"{what}\n{_digest(pom, properties)}\n")
    return home
