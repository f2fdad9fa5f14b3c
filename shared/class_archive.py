"""What the JVMs' class-data-sharing archives are keyed on (Kafka's broker,
``compose.kafka_class_archive``; svc_transform's driver,
``svc_transform.class_archive``).

A JVM (JDK 13+) dumps the classes a run loaded when it exits
(``-XX:ArchiveClassesAtExit``) and maps that archive at its next start
(``-XX:SharedArchiveFile``), loading and verifying fewer classes from jars.
It maps an archive only under the JDK and the class path it was dumped with,
and starts without it (a warning in its log) where they differ: an archive's
name carries both, so that a changed set-up builds a new one rather than
keep one no JVM maps.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def jars_stamp(directory: Path) -> str:
    """Each jar's name, size and modification time: the JVM also refuses an
    archive whose class path entries changed since the dump, as they do when
    an environment is installed again at the same path (a CI clone's)."""
    entries = (
        f"{jar.name}:{stat.st_size}:{stat.st_mtime_ns}"
        for jar in sorted(directory.glob("*.jar"))
        for stat in (jar.stat(),)
    )
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def java_stamp(java: Path) -> list[str]:
    """The JDK an archive belongs to: its resolved ``java`` and that file's size."""
    resolved = java.resolve()
    return [str(resolved), str(resolved.stat().st_size)]


def archive_digest(parts: list[str]) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
