"""The Python daemon Spark's executors fork their Python workers from
(``spark.python.daemon.module``, which ``shared.spark_session`` sets): Spark's
own ``pyspark.daemon``, with zip archives on the workers' path read again
only when they have changed, a reused worker collecting only its young
garbage between tasks (``collect_after_task``), and glibc's malloc keeping
what a worker frees for its next batch (``shared.malloc.hold_freed_memory``,
set in the daemon before it forks a worker: each inherits it).

Before every task a Python worker runs, pyspark calls
``importlib.invalidate_caches()`` (``setup_spark_files``), and Python 3.11's
``zipimporter.invalidate_caches`` reads its archive's whole directory again,
changed or not. Spark puts three archives on every worker's path: pyspark.zip
(1,220 entries), py4j's and Spark's core jar (5,261). On the 2-core build
machine that was 140-300 ms a task of ``aistack score``'s job, from the task's
start to the worker reading its command; the directories kept, 1-9 ms
in 22 of 24 tasks.

A directory is read again when its archive's size, modification time or
inode differ from when it was last read (what the invalidation is there to
notice: an archive replaced under a running worker), or when the importer
holds an older read of it than the last. The directories the daemon has read
when it starts count as read then.

Run by Spark as ``python -m shared.spark_daemon pyspark.worker``: it imports
only the standard library, pyspark and ``shared.malloc`` (the standard
library's ctypes), and writes nothing to stdout (the executor reads the
daemon's port from it).
"""

from __future__ import annotations

import gc
import os
import pkgutil
import sys
import types
import zipimport
from collections.abc import Callable
from typing import Any

#: Per archive, its (size, mtime, inode) when zipimport last read its
#: directory into ``zipimport._zip_directory_cache``.
_read_at: dict[str, tuple[int, int, int]] = {}
#: zipimport's directories by archive; each importer holds one as ``_files``
#: (Python 3.11's zipimport; where either is missing, every invalidation
#: reads again, as without this module).
_directories: dict[str, Any] = getattr(zipimport, "_zip_directory_cache", {})
_NONE = object()


def _stamp(archive: str) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(archive)
    except OSError:
        return None
    return (stat.st_size, stat.st_mtime_ns, stat.st_ino)


def keep_unchanged_archives() -> None:
    """From now on in this process (and the workers it forks), a zip
    importer's ``invalidate_caches`` reads its archive's directory again
    only when the archive changed since it was read, or the importer holds
    an older read of it. Every entry of ``sys.path`` gets its importer now,
    and the directories read so far are taken as read now."""
    reread: Callable[[zipimport.zipimporter], None] = zipimport.zipimporter.invalidate_caches

    def invalidate_if_changed(importer: zipimport.zipimporter) -> None:
        archive = importer.archive
        stamp = _stamp(archive)
        current = stamp is not None and _read_at.get(archive) == stamp
        if current and getattr(importer, "_files", _NONE) is _directories.get(archive):
            return
        # Stamped before the read: a change during it is seen next time.
        reread(importer)
        if stamp is not None:
            _read_at[archive] = stamp

    # An importer for every archive on the path now, so that the workers
    # forked later inherit it having read its archive.
    for entry in sys.path:
        pkgutil.get_importer(entry)
    for archive in list(_directories):
        stamp = _stamp(archive)
        if stamp is not None:
            _read_at.setdefault(archive, stamp)
    zipimport.zipimporter.invalidate_caches = invalidate_if_changed  # type: ignore[method-assign,assignment]


def collect_after_task() -> int:
    """What a reused worker collects after each task: the young generations
    (0 and 1), where what the task made and dropped in cycles still is,
    not the whole heap. pyspark's daemon runs a full ``gc.collect()`` there,
    which walks every object the worker holds: with torch imported, 206,000
    objects and 85 ms after every task here, before the worker reads its
    next one. Older garbage waits for Python's own full collections."""
    return gc.collect(1)


def collect_young_after_tasks(daemon: Any) -> None:
    """Make pyspark's ``daemon`` module's workers run
    ``collect_after_task`` where it runs ``gc.collect()`` after a task."""
    daemon.gc = types.SimpleNamespace(collect=collect_after_task)


def main() -> None:
    """Spark's daemon, as the module docstring says; serves until Spark stops it."""
    from shared.malloc import hold_freed_memory

    hold_freed_memory()
    # pyspark first: importing it puts its archives' importers on the path.
    from pyspark import daemon

    keep_unchanged_archives()
    collect_young_after_tasks(daemon)
    daemon.manager()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
