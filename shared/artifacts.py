"""Model artifacts: where they are kept and the digest that proves them.

The trainer writes, the model server reads and verifies; both use this one
definition of the digest. A directory's sha256 is that of a deterministic tar
stream of it (names sorted, owners, times and modes normalised), so the same
files always give the same digest wherever they are unpacked.

The store is a URL root on fsspec: a local directory by default
(``/var/lib/aistack/artifacts`` or ``file:///…``), ``s3://bucket/prefix``
and the like when the matching fsspec backend (s3fs, gcsfs) is installed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

from shared.errors import FailedPrecondition

_CHUNK = 1 << 20
# A PyTorch model's file in its artifact directory: the trainer writes it, the
# model server loads it (``torch.export``'s format).
TORCH_EXPORT_FILE = "model.pt2"
# The file naming a remote checkpoint's current version (``put_checkpoint``).
# Pointer reads a checkpoint's copy may take while writers keep replacing it.
_CHECKPOINT_READS = 5
_LATEST = "LATEST"


class _HashSink:
    """A write-only file object that only hashes (tarfile streams into it)."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return len(data)


def digest(path: Path) -> tuple[str, int]:
    """(hex sha256, size in bytes of the files) of a file or a directory tree."""
    if path.is_file():
        sha = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                sha.update(chunk)
        return sha.hexdigest(), path.stat().st_size
    if not path.is_dir():
        raise FileNotFoundError(f"no artifact at {path}")
    sink = _HashSink()
    size = 0
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for member in sorted(path.rglob("*"), key=lambda p: p.relative_to(path).as_posix()):
            info = tar.gettarinfo(str(member), arcname=member.relative_to(path).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.mode = 0o755 if member.is_dir() else 0o644
            if member.is_file():
                size += info.size
                with member.open("rb") as handle:
                    tar.addfile(info, handle)
            elif member.is_dir():
                tar.addfile(info)
            # Symlinks and other special files are not part of a model.
    return sink.digest.hexdigest(), size


class ArtifactStore:
    """Directories under one root URL. Keys are relative POSIX paths.

    A URL root may carry what its filesystem needs to connect
    (``ftp://user:password@host:port/dir``, ``s3://bucket/prefix``): fsspec
    parses it, and ``uri`` hands back full URLs under the same root."""

    def __init__(self, root: str) -> None:
        import fsspec  # the trainer's and model server's dependency, not every service's
        from fsspec.implementations.local import LocalFileSystem

        self.root = root.rstrip("/")
        protocol, _, rest = self.root.partition("://")
        self._fs: Any
        if not rest:
            self._fs, self._base = fsspec.filesystem("file"), str(Path(root).resolve())
        else:
            try:
                self._fs, base = fsspec.core.url_to_fs(self.root)
            except (ImportError, ValueError) as exc:
                raise FailedPrecondition(
                    f"artifact store {root!r}: no fsspec backend for {protocol}:// ({exc})"
                ) from exc
            self._base = str(base).rstrip("/")
        self.local = isinstance(self._fs, LocalFileSystem)

    def path(self, key: str) -> str:
        """The store's own path for ``key`` (a local path for a local store)."""
        return f"{self._base}/{key.strip('/')}"

    def uri(self, key: str) -> str:
        if self.local:
            return Path(self.path(key)).as_uri()
        return f"{self.root}/{key.strip('/')}"

    def exists(self, key: str) -> bool:
        return bool(self._fs.exists(self.path(key)))

    def put_dir(self, local: Path, key: str) -> str:
        """Copy the tree at ``local`` to ``key``, replacing what was there;
        returns the URI. A local store copies into a sibling first and
        renames, so a reader never sees half a tree."""
        target = self.path(key)
        if self.local:
            if Path(target).resolve() == local.resolve():
                return self.uri(key)
            staging = Path(f"{target}.partial")
            shutil.rmtree(staging, ignore_errors=True)
            staging.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(local, staging)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
        else:
            if self._fs.exists(target):
                self._fs.rm(target, recursive=True)
            self._fs.put(str(local), target, recursive=True)
        return self.uri(key)

    def put_bytes(self, data: bytes, key: str) -> str:
        """Write ``data`` as the file ``key``, replacing it, never half
        written (a local store writes a sibling and renames it; an object
        store writes an object whole); returns its URI."""
        target = self.path(key)
        if self.local:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            partial = Path(f"{target}.partial-{os.getpid()}")
            partial.write_bytes(data)
            os.replace(partial, target)
        else:
            self._fs.pipe_file(target, data)
        return self.uri(key)

    def get_dir(self, key: str, local: Path) -> bool:
        """Copy ``key`` into ``local`` (replacing it); False when absent."""
        source = self.path(key)
        if not self._fs.exists(source):
            return False
        shutil.rmtree(local, ignore_errors=True)
        local.parent.mkdir(parents=True, exist_ok=True)
        if self.local:
            shutil.copytree(source, local)
        else:
            self._fs.get(source, str(local), recursive=True)
        return True

    def put_checkpoint(self, local: Path, key: str) -> None:
        """Replace the checkpoint at ``key`` with the tree at ``local`` so that
        a process killed at any moment leaves a whole checkpoint behind.

        A local store renames (``put_dir``). Object stores and FTP have no
        atomic rename of a tree, so a remote checkpoint is a new version
        beside the old (``key/<version>/``), then a one-object pointer
        (``key/LATEST``) naming it, then the old versions go: the pointer
        always names a version that was written whole."""
        if self.local:
            self.put_dir(local, key)
            return
        version = f"v{time.time_ns():020d}"
        self._fs.put(str(local), self.path(f"{key}/{version}"), recursive=True)
        self._fs.pipe_file(self.path(f"{key}/{_LATEST}"), version.encode())
        # Names only: some filesystems (FTP) list bare names, others paths.
        for entry in self._fs.ls(self.path(key), detail=False):
            name = str(entry).rstrip("/").rsplit("/", 1)[-1]
            if name not in (version, _LATEST):
                self._fs.rm(self.path(f"{key}/{name}"), recursive=True)

    def get_checkpoint(self, key: str, local: Path) -> bool:
        """Copy the checkpoint ``put_checkpoint`` left at ``key`` into
        ``local`` (replacing it); False when there is none.

        A writer may replace the version the pointer named while it is being
        copied (a new version, the pointer moved, the old one removed): the
        copy then fails or finds nothing, and the pointer, read again, names
        the newer one, which is copied instead. A failure with the pointer
        unmoved is the store's, and is raised."""
        if self.local:
            return self.get_dir(key, local)
        version = self._checkpoint_version(key)
        for _ in range(_CHECKPOINT_READS):
            if version is None:
                return False
            try:
                if self.get_dir(f"{key}/{version}", local):
                    return True
                error: Exception | None = None
            except Exception as failed:  # any store's "gone" (FTP: error_perm 550)
                error = failed
            moved = self._checkpoint_version(key)
            if moved == version:
                if error is not None:
                    raise error
                return False
            version = moved
        raise FailedPrecondition(
            f"checkpoint {key!r} was replaced {_CHECKPOINT_READS} times while being read"
        )

    def _checkpoint_version(self, key: str) -> str | None:
        try:
            return str(self._fs.cat_file(self.path(f"{key}/{_LATEST}")).decode().strip())
        except FileNotFoundError:
            return None

    def remove(self, key: str) -> None:
        if self._fs.exists(self.path(key)):
            self._fs.rm(self.path(key), recursive=True)


def local_path(uri: str) -> Path:
    """The local path of a ``file://`` URI (or a plain path)."""
    if uri.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(uri).path))
    if "://" in uri:
        raise FailedPrecondition(f"{uri!r} is not a local artifact")
    return Path(uri)
