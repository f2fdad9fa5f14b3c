"""A user's code shipped with a study: one archive of a directory, kept in the
artifact store under its sha256.

The client packs (``aistack study create --code DIR``) and stores; trainers
fetch, verify and unpack. Both sides use this one definition: the archive is
a gzip'd tar of the directory's files (names sorted, owners, times and modes
normalised, caches and version-control directories left out), so the same
files always give the same digest, and the store key is derived from the
digest alone.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from shared.errors import InvalidArgument

#: Directories and files never packed: caches, environments, version control.
SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        "venv",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".ipynb_checkpoints",
        ".tox",
        "node_modules",
    }
)
SKIPPED_SUFFIXES = (".pyc", ".pyo")
#: An archive larger than this is refused when packed: code, not data.
MAX_ARCHIVE_BYTES = 64 * 1024 * 1024
#: Where an archive lies under the artifact store's root.
STORE_PREFIX = "code"


@dataclass(frozen=True)
class Packed:
    """An archive of a directory: its bytes, their sha256 and the directory's name."""

    data: bytes
    sha256: str
    name: str

    @property
    def key(self) -> str:
        return store_key(self.sha256)


def store_key(sha256: str) -> str:
    """The archive's key in the artifact store."""
    return f"{STORE_PREFIX}/{sha256}.tar.gz"


def files(directory: Path) -> Iterator[Path]:
    """The files of ``directory`` an archive holds, in archive order."""
    found: list[Path] = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        for name in names:
            path = Path(root) / name
            if name.endswith(SKIPPED_SUFFIXES) or path.is_symlink() or not path.is_file():
                continue
            found.append(path)
    yield from sorted(found, key=lambda p: p.relative_to(directory).as_posix())


def pack(directory: Path) -> Packed:
    """The archive of ``directory``; InvalidArgument for a missing or empty
    directory, or one too large to be code."""
    if not directory.is_dir():
        raise InvalidArgument(f"--code {directory}: not a directory")
    buffer = io.BytesIO()
    # mtime 0 and no file name in the gzip header: the bytes depend on the files alone.
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, filename="") as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        count = 0
        for path in files(directory):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(directory).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.mode = 0o644
            with path.open("rb") as handle:
                tar.addfile(info, handle)
            count += 1
    if not count:
        raise InvalidArgument(f"--code {directory}: no files to ship")
    data = buffer.getvalue()
    if len(data) > MAX_ARCHIVE_BYTES:
        raise InvalidArgument(
            f"--code {directory}: {len(data) >> 20} MiB packed, over {MAX_ARCHIVE_BYTES >> 20} "
            "MiB: ship code, and read data from a dataset"
        )
    return Packed(data, hashlib.sha256(data).hexdigest(), directory.resolve().name)


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unpack(data: bytes, into: Path) -> None:
    """Extract an archive into ``into`` (created): regular files and
    directories only, nothing outside ``into`` (tarfile's "data" filter)."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(into, filter="data")
