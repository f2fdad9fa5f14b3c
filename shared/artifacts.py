"""Model artifacts: where they are kept and the digest that proves them.

The trainer writes, the model server reads and verifies; both use this one
definition of the digest. A directory's sha256 is that of a deterministic tar
stream of it (names sorted, owners, times and modes normalised), so the same
files always give the same digest wherever they are unpacked.

The store is a URL root on fsspec: a local directory by default
(``/var/lib/aistack/artifacts`` or ``file:///…``), ``s3://bucket/prefix`` on
the object store ``ObjectStoreSettings`` describes (``shared.object_store``),
or any other fsspec URL whose backend is installed (``ftp://…``). A remote
store that is away is ridden out, then fails ``Unavailable`` (retryable).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from shared import object_store
from shared.errors import FailedPrecondition
from shared.settings import ObjectStoreSettings

_CHUNK = 1 << 20
# A PyTorch model's file in its artifact directory: the trainer writes it, the
# model server loads it (``torch.export``'s format).
TORCH_EXPORT_FILE = "model.pt2"
# The file naming a remote checkpoint's current version (``put_checkpoint``).
# Pointer reads a checkpoint's copy may take while writers keep replacing it.
_CHECKPOINT_READS = 5
_LATEST = "LATEST"

T = TypeVar("T")


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

    def __init__(self, root: str, settings: ObjectStoreSettings | None = None) -> None:
        """``settings``: the object store's, for an ``s3://`` root (None:
        read from the environment, for a command or a child process)."""
        import fsspec  # the trainer's and model server's dependency, not every service's
        from fsspec.implementations.local import LocalFileSystem

        self.root = root.rstrip("/")
        if object_store.is_object_url(self.root):
            self.root = object_store.fsspec_url(self.root)
            self._settings = settings or ObjectStoreSettings()
        else:
            self._settings = settings or ObjectStoreSettings.model_construct()
        self._fs: Any
        if not object_store.scheme(self.root):
            self._fs, self._base = fsspec.filesystem("file"), str(Path(root).resolve())
        else:
            self._fs, base = object_store.filesystem(self.root, self._settings)
            self._base = str(base).rstrip("/")
        self.local = isinstance(self._fs, LocalFileSystem)
        self._objects = object_store.is_object_url(self.root)
        self._where = f"artifact store {object_store.where(self.root, self._settings)}"

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
            self._remote(lambda: self._replace_tree(local, target), f"write {key}")
        return self.uri(key)

    def mirror_dir(self, local: Path, key: str) -> str:
        """Every file of the tree at ``local`` written over its copy under
        ``key``, nothing removed: for a tree that only grows (a TensorBoard
        run), which a reader lists while it is written. Returns the URI."""
        if self.local:
            target = Path(self.path(key))
            if target.resolve() != local.resolve():
                shutil.copytree(local, target, dirs_exist_ok=True)
            return self.uri(key)
        files = sorted(p for p in local.rglob("*") if p.is_file())
        remote = [self.path(f"{key}/{p.relative_to(local).as_posix()}") for p in files]
        self._remote(lambda: self._fs.put([str(p) for p in files], remote), f"write {key}")
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
            self._remote(lambda: self._fs.pipe_file(target, data), f"write {key}")
        return self.uri(key)

    def get_dir(self, key: str, local: Path) -> bool:
        """Copy ``key`` into ``local`` (replacing it); False when absent."""
        source = self.path(key)
        if self.local:
            if not self._fs.exists(source):
                return False
            shutil.rmtree(local, ignore_errors=True)
            local.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(source, local)
            return True
        return self._remote(lambda: self._get_tree(source, local), f"read {key}")

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
        self._remote(
            lambda: self._replace_tree(local, self.path(f"{key}/{version}")),
            f"write checkpoint {key}",
        )
        # Only once the version is whole does the pointer name it.
        self._remote(
            lambda: self._fs.pipe_file(self.path(f"{key}/{_LATEST}"), version.encode()),
            f"write checkpoint {key}",
        )
        self._remote(lambda: self._drop_versions(key, keep=version), f"clean checkpoint {key}")

    def _drop_versions(self, key: str, keep: str) -> None:
        # Names only: some filesystems (FTP) list bare names, others paths.
        for entry in self._fs.ls(self.path(key), detail=False, refresh=True):
            name = str(entry).rstrip("/").rsplit("/", 1)[-1]
            if name not in (keep, _LATEST):
                self._fs.rm(self.path(f"{key}/{name}"), recursive=True)

    def get_checkpoint(self, key: str, local: Path) -> bool:
        """Copy the checkpoint ``put_checkpoint`` left at ``key`` into
        ``local`` (replacing it); False when there is none.

        A writer may replace the version the pointer named while it is being
        copied (a new version, the pointer moved, the old one removed): the
        copy then fails, finds nothing or finds part of it. So the pointer is
        read again after every copy: unmoved, the version copied was whole
        (a writer removes a version only once the pointer has left it, and
        it never comes back); moved, the newer version is copied instead. A
        failure with the pointer unmoved is the store's, and is raised."""
        if self.local:
            return self.get_dir(key, local)
        version = self._checkpoint_version(key)
        for _ in range(_CHECKPOINT_READS):
            if version is None:
                return False
            error: Exception | None = None
            try:
                copied = self.get_dir(f"{key}/{version}", local)
            except Exception as failed:  # any store's "gone" (FTP: error_perm 550)
                copied, error = False, failed
            moved = self._checkpoint_version(key)
            if moved == version:
                if error is not None:
                    raise error
                return copied
            version = moved
        raise FailedPrecondition(
            f"checkpoint {key!r} was replaced {_CHECKPOINT_READS} times while being read"
        )

    def _checkpoint_version(self, key: str) -> str | None:
        def read() -> str | None:
            try:
                return str(self._fs.cat_file(self.path(f"{key}/{_LATEST}")).decode().strip())
            except FileNotFoundError:
                return None

        return self._remote(read, f"read checkpoint {key}")

    def remove(self, key: str) -> None:
        def remove() -> None:
            if self._fs.exists(self.path(key)):
                self._fs.rm(self.path(key), recursive=True)

        if self.local:
            remove()
        else:
            self._remote(remove, f"remove {key}")

    # ---- remote trees ----

    def _remote(self, call: Callable[[], T], what: str) -> T:
        """``call`` on a remote store, ridden out while the store is away."""
        return object_store.ride_out(
            call, seconds=self._settings.ride_out_s, what=f"{self._where}: {what}"
        )

    def _replace_tree(self, local: Path, target: str) -> None:
        """The tree at ``local`` as ``target``, whatever a failed try left
        there. An object store has no directories, so every file is named
        (a directory ``put`` into a prefix that a failed try left behind
        would nest the tree one level down)."""
        if self._fs.exists(target):
            self._fs.rm(target, recursive=True)
        if not self._objects:
            self._fs.put(str(local), target, recursive=True)
            return
        files = sorted(p for p in local.rglob("*") if p.is_file())
        self._fs.put(
            [str(p) for p in files], [f"{target}/{p.relative_to(local).as_posix()}" for p in files]
        )

    def _get_tree(self, source: str, local: Path) -> bool:
        """Copy ``source`` into ``local`` (replacing it); False when absent."""
        self._fs.invalidate_cache(source)
        if not self._fs.exists(source):
            return False
        shutil.rmtree(local, ignore_errors=True)
        local.parent.mkdir(parents=True, exist_ok=True)
        if not self._objects:
            self._fs.get(source, str(local), recursive=True)
            return True
        remote = sorted(str(p) for p in self._fs.find(source))
        prefix = source.rstrip("/") + "/"
        targets = [local / p[len(prefix) :] for p in remote if p.startswith(prefix)]
        local.mkdir(parents=True, exist_ok=True)
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
        self._fs.get([p for p in remote if p.startswith(prefix)], [str(t) for t in targets])
        return True


def local_path(uri: str) -> Path:
    """The local path of a ``file://`` URI (or a plain path)."""
    if uri.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(uri).path))
    if "://" in uri:
        raise FailedPrecondition(f"{uri!r} is not a local artifact")
    return Path(uri)
