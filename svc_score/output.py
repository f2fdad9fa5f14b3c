"""Where a scoring run's files are, and the commit that makes its output
appear whole or not at all.

A name is a local path or a URL: ``s3://bucket/prefix`` or ``s3a://…`` on
the object store that ``ObjectStoreSettings`` describes (the same objects;
Spark reads ``s3a://``, pyarrow and the driver go through s3fs), or any
other fsspec URL. The executors' pyarrow reads and writes a URL through
``arrow_filesystem``.

Either way the tasks write beside the output, under ``<output>.<id>.partial``
(``staging_of``), and only a run that succeeded commits (``Staged``):

- a local directory is renamed into place, ``_lineage.json`` inside it: one
  atomic step;
- on the store, where nothing renames, the driver copies each object into
  ``<output>/`` (server-side, no byte through the driver) and writes
  ``_lineage.json`` last, then removes the staging prefix. The lineage file is
  the marker: a reader trusts an output prefix only once it holds
  ``_lineage.json``, which names every Parquet file and its rows. A commit
  that fails removes what it copied.

Why a staging prefix rather than writing straight into ``<output>/`` (one
copy fewer): the tasks' files then stay out of the output until the whole job
(and its publishing) has succeeded, so the output prefix is empty, not half
written, while the job runs and after a driver that died mid-job, and a run
into the same name can start again; only the seconds of the copy are a
window where a reader that ignores the marker could see part of it.
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from shared import object_store
from shared.errors import AistackError, FailedPrecondition, InvalidArgument
from shared.log import get_logger
from shared.settings import ObjectStoreSettings

if TYPE_CHECKING:
    import pyarrow as pa

log = get_logger("svc_score")

#: The file beside the output's Parquet files that says where they came
#: from; on the object store, written last: the output's marker.
LINEAGE_FILE = "_lineage.json"

T = TypeVar("T")


def is_remote(name: str | Path) -> bool:
    """Whether ``name`` is a URL read through fsspec (``s3://…``), not a
    local path (Hadoop's ``file:/path`` and ``file://`` are local)."""
    return isinstance(name, str) and object_store.scheme(name) not in ("", "file")


def join(name: str, child: str) -> str:
    """``child`` under the directory or prefix ``name``."""
    return f"{name.rstrip('/')}/{child}" if is_remote(name) else os.path.join(name, child)


def staging_of(output: str) -> str:
    """Where a run's tasks write: beside ``output``, a name of the run's own.
    No leading dot: Hadoop skips hidden paths, and the publisher reads it
    back."""
    return f"{output.rstrip('/')}.{uuid.uuid4().hex}.partial"


def arrow_filesystem(name: str, settings: ObjectStoreSettings) -> tuple[Any, str]:
    """(pyarrow filesystem, path on it) of ``name``: (None, ``name``) for a
    local path, the store's (or fsspec's) filesystem wrapped for pyarrow
    for a URL."""
    if not is_remote(name):
        return None, name
    fs, path = object_store.filesystem(name, settings)
    return object_store.arrow_filesystem(fs), path


class Filesystems:
    """``arrow_filesystem`` of many names, the store opened once per URL
    scheme: a task may read many files."""

    def __init__(self, settings: ObjectStoreSettings) -> None:
        self._settings = settings
        self._opened: dict[str, Any] = {}

    def __call__(self, name: str) -> tuple[Any, str]:
        if not is_remote(name):
            return None, name
        scheme = object_store.scheme(name)
        opened = self._opened.get(scheme)
        if opened is None:
            opened, path = arrow_filesystem(name, self._settings)
            self._opened[scheme] = opened
            return opened, path
        return opened, _path_on(opened, name)


def _path_on(filesystem: Any, name: str) -> str:
    """``name``'s path on ``filesystem`` (``arrow_filesystem``'s, of its scheme)."""
    return str(filesystem.handler.fs._strip_protocol(name)).rstrip("/")


def url_of(name: str, path: str) -> str:
    """``path`` on ``name``'s filesystem (as ``arrow_filesystem`` gave it,
    or pyarrow listed it) named as ``name`` is: a URL of ``name``'s scheme,
    or the local path."""
    return f"{object_store.scheme(name)}://{path}" if is_remote(name) else path


def write_empty(name: str, schema: pa.Schema, settings: ObjectStoreSettings) -> None:
    """A Parquet file of no rows at ``name``."""
    import pyarrow.parquet as pq

    filesystem, path = arrow_filesystem(name, settings)
    pq.write_table(schema.empty_table(), path, filesystem=filesystem)


class Staged:
    """A run's output being written: ``staging``, where the tasks write, and
    ``commit``, which puts it at ``output`` whole, or ``discard``."""

    def __init__(self, output: str | Path, settings: ObjectStoreSettings) -> None:
        self.output = str(output).rstrip("/") if is_remote(output) else str(output)
        self.staging = staging_of(self.output)
        self._settings = settings
        self._fs: Any = None
        if is_remote(self.output):
            self._fs, self._output_path = object_store.filesystem(self.output, settings)
            self._staging_path = object_store.filesystem(self.staging, settings)[1]
        self._copied: list[str] = []

    @property
    def remote(self) -> bool:
        return self._fs is not None

    def refuse_existing(self) -> None:
        """InvalidArgument when the output exists: a local file or directory,
        or on the store any object under its prefix (or of its name);
        FailedPrecondition when the store refuses to say (credentials, a
        policy), Unavailable when it is away past its ride-out."""
        try:
            exists = self._exists()
        except AistackError:
            raise
        except Exception as exc:  # no credentials, access denied: one line
            raise FailedPrecondition(
                f"{self.output}: cannot list it: {type(exc).__name__}: {exc}"
            ) from exc
        if exists:
            raise InvalidArgument(f"{self.output} exists; scoring writes a new directory")

    def create(self) -> None:
        """The staging directory (a prefix needs none)."""
        if not self.remote:
            Path(self.staging).mkdir(parents=True)

    def parquet_files(self) -> list[str]:
        """The names of the Parquet files written under ``staging``."""
        if not self.remote:
            return sorted(path.name for path in Path(self.staging).glob("*.parquet"))
        return sorted(
            posixpath.basename(path)
            for path in self._store(lambda: self._listed(self._staging_path))
            if path.endswith(".parquet")
        )

    def commit(self, lineage: dict[str, Any]) -> None:
        """Put the staged files and ``LINEAGE_FILE`` holding ``lineage`` at
        ``output``. Locally, one rename. On the store:

        1. refuse an output that appeared meanwhile (nothing copied);
        2. copy each staged object into the output prefix, server-side;
        3. write ``LINEAGE_FILE`` last: from here on the output is whole;
        4. remove the staging prefix (``discard``: a failure here leaves a
           whole output and only debris beside it, logged).

        A failure in 1 to 3 removes what was copied, then raises: the
        output's prefix is as empty as before. Raises InvalidArgument (the
        output exists), Unavailable (the store away past its ride-out), or
        the store's own error."""
        text = json.dumps(lineage, indent=2) + "\n"
        if not self.remote:
            Path(self.staging, LINEAGE_FILE).write_text(text)
            os.replace(self.staging, self.output)
            return
        fs = self._fs
        try:
            self.refuse_existing()  # 1
            for path in self._store(lambda: self._listed(self._staging_path)):  # 2
                target = f"{self._output_path}/{posixpath.relpath(path, self._staging_path)}"
                self._copied.append(target)
                self._store(functools.partial(fs.copy, path, target))
            lineage_path = f"{self._output_path}/{LINEAGE_FILE}"  # 3
            self._copied.append(lineage_path)
            self._store(lambda: fs.pipe_file(lineage_path, text.encode()))
        except BaseException:
            self._remove_copied()
            raise
        self._copied = []
        self.discard()  # 4

    def discard(self) -> None:
        """Remove the staging directory or prefix, whatever it holds. Never
        raises: what it cannot remove is debris beside the output, logged."""
        if not self.remote:
            shutil.rmtree(self.staging, ignore_errors=True)
            return
        try:
            found = self._store(lambda: self._listed(self._staging_path))
            if found:
                self._store(lambda: self._fs.rm(found))
        except Exception as exc:
            log.warning("score.staging_left", staging=self.staging, error=str(exc))

    def _remove_copied(self) -> None:
        try:
            if self._copied:
                self._store(lambda: self._fs.rm(self._copied))
        except Exception as exc:  # the commit's own error is the one to tell
            log.warning("score.output_left", output=self.output, error=str(exc))
        self._copied = []

    def _exists(self) -> bool:
        if not self.remote:
            return Path(self.output).exists()
        self._fs.invalidate_cache()
        return bool(self._store(lambda: self._fs.exists(self._output_path)))

    def _listed(self, path: str) -> list[str]:
        """Every object under ``path``, listed afresh."""
        self._fs.invalidate_cache()
        try:
            return sorted(self._fs.find(path))
        except FileNotFoundError:
            return []

    def _store(self, call: Callable[[], T]) -> T:
        return object_store.ride_out(
            call,
            seconds=self._settings.ride_out_s,
            what=object_store.where(self.output, self._settings),
        )
