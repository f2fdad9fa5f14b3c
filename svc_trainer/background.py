"""Work the trainer's poll loop hands off, so that it never waits on it.

- ``InOrder``: a trial's ending (model digest and upload, model-ready event,
  final report, offset commit) runs on a thread of its own while the next
  trial starts. One thread, in submission order: offsets are committed in
  the order the trials were taken, so a commit never passes a trial whose
  reports are not yet out.
- ``Uploads``: a remote artifact store gets each epoch's checkpoint (and a
  remote TensorBoard directory each epoch's run) in the background; a newer
  snapshot of the same key replaces one not yet sent.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from shared.artifacts import ArtifactStore
from shared.log import get_logger
from svc_trainer.plan import PARTIAL_SUFFIX

log = get_logger("svc_trainer")


class InOrder:
    """Runs callables one at a time, in submission order, on one thread."""

    def __init__(self, name: str) -> None:
        self._work: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._pending = 0
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], None]) -> None:
        with self._lock:
            self._pending += 1
        self._work.put(work)

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def drain(self, timeout: float) -> bool:
        """Wait until everything submitted ran; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def close(self) -> None:
        self._work.put(None)
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while (work := self._work.get()) is not None:
            try:
                work()
            except Exception:  # the work logs its own failures; never lose the thread
                log.exception("background.failed")
            finally:
                with self._lock:
                    self._pending -= 1
                    self._lock.notify_all()


class Uploads:
    """Directories into a remote store, on a thread of its own: checkpoints
    (``put_checkpoint``, the default) or runs (``put=store.mirror_dir``).

    ``submit`` takes a snapshot of the directory at once (hard links: a
    runner replaces checkpoint files, never rewrites them in place; a
    TensorBoard writer appends, and its reader skips a last record cut
    short) and returns; the newest snapshot per key is uploaded. The runner
    goes on writing while the snapshot is taken: a file half written
    (``*.partial``) is left out, and one replaced or removed between the
    listing and the link is skipped (the next epoch's snapshot has its
    successor)."""

    def __init__(
        self,
        store: ArtifactStore,
        scratch: Path,
        put: Callable[[Path, str], object] | None = None,
    ) -> None:
        self._store = store
        self._put = put or store.put_checkpoint
        self._scratch = scratch
        self._pending: OrderedDict[str, Path] = OrderedDict()
        self._busy = False
        self._count = 0
        self._lock = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="checkpoint-uploads", daemon=True)
        self._thread.start()

    def submit(self, directory: Path, key: str) -> None:
        with self._lock:
            self._count += 1
            snapshot = self._scratch / f"{self._count}"
        shutil.rmtree(snapshot, ignore_errors=True)
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        if not _snapshot(directory, snapshot):
            # Nothing whole to send: the store keeps the last checkpoint.
            shutil.rmtree(snapshot, ignore_errors=True)
            return
        with self._lock:
            stale = self._pending.pop(key, None)
            self._pending[key] = snapshot
            self._lock.notify_all()
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)

    def drain(self, timeout: float) -> bool:
        """Wait until every snapshot is uploaded; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._lock.wait()
                if not self._pending:
                    return
                key, snapshot = self._pending.popitem(last=False)
                self._busy = True
            try:
                self._put(snapshot, key)
            except Exception as exc:  # the next epoch's upload tries again
                log.warning("upload.failed", key=key, error=str(exc))
            finally:
                shutil.rmtree(snapshot, ignore_errors=True)
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()


def _snapshot(source: Path, target: Path) -> int:
    """Hard-link the tree at ``source`` into ``target``; the files linked."""
    target.mkdir(parents=True, exist_ok=True)
    try:
        entries = list(os.scandir(source))
    except FileNotFoundError:  # removed since its parent was listed
        return 0
    linked = 0
    for entry in entries:
        if entry.name.endswith(PARTIAL_SUFFIX):
            continue
        try:
            if entry.is_dir():  # a link to a directory is copied, as copytree does
                linked += _snapshot(Path(entry.path), target / entry.name)
            else:
                _link_or_copy(entry.path, str(target / entry.name))
                linked += 1
        except FileNotFoundError:  # replaced or removed since the listing
            continue
    return linked


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # a source gone since the listing raises FileNotFoundError here too
        shutil.copy2(source, target)
