"""The local workers of one multi-process trial: N processes on this node.

Both frameworks start their local workers here: TensorFlow's cluster tasks
as ``python -m MODULE`` commands, each with an environment of its own
(``TF_CONFIG``; ``backends.tensorflow.cluster``), and PyTorch's DDP ranks as functions in a
multiprocessing context (``backends.torch.ddp``). Ports come from ``shared.ports``.
Whichever way a worker starts:

- it dies with the process that started it (``lifetime.die_with_parent``: a
  SIGKILLed trial process runs no cleanup). A function worker gets it here,
  before its target runs; a module worker calls it first thing in its
  ``main``, as ``backends.tensorflow.cluster`` does (a ``preexec_fn`` is not safe in a
  process that runs threads, and TensorFlow's do);
- ``watch`` reports the first worker that exits with an error while the
  group is open, so a synchronous strategy need not wait for it forever;
- ``exit_codes`` and ``failed`` collect how the workers ended;
- closing the group (also on an exception) reaps every worker: SIGTERM,
  then SIGKILL for one still there after the grace period.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from shared.log import get_logger
from svc_trainer.lifetime import die_with_parent

log = get_logger("svc_trainer")

# A worker gets this long to exit on SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 5.0
WATCH_INTERVAL_S = 0.5
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class _Process(Protocol):
    """What the group needs of a started worker, whichever way it started."""

    @property
    def pid(self) -> int | None: ...

    def exit_code(self) -> int | None: ...

    def wait(self, timeout: float) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class _Command:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def exit_code(self) -> int | None:
        return self._process.poll()

    def wait(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout)

    def terminate(self) -> None:
        self._process.terminate()

    def kill(self) -> None:
        self._process.kill()


class _Function:
    def __init__(self, process: Any) -> None:
        self._process = process

    @property
    def pid(self) -> int | None:
        pid: int | None = self._process.pid
        return pid

    def exit_code(self) -> int | None:
        code: int | None = self._process.exitcode
        return code

    def wait(self, timeout: float) -> None:
        self._process.join(timeout)

    def terminate(self) -> None:
        self._process.terminate()

    def kill(self) -> None:
        self._process.kill()


def _with_parent(target: Callable[..., object], args: tuple[Any, ...]) -> None:
    """A function worker's entry point: bound to its parent before its work."""
    die_with_parent()
    target(*args)


class LocalGroup:
    """The local workers of one trial; a context manager that always reaps
    them when it closes (SIGTERM, then SIGKILL after ``grace_s``)."""

    def __init__(self, trial_id: str, *, grace_s: float = TERMINATE_GRACE_S) -> None:
        self._trial_id = trial_id
        self._grace_s = grace_s
        self._workers: list[tuple[str, _Process]] = []
        self._closing = threading.Event()

    def __enter__(self) -> LocalGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start_module(
        self, name: str, module: str, args: Sequence[str], env: Mapping[str, str]
    ) -> int:
        """Start ``python -m module *args`` with this process's environment
        plus ``env``, this package importable; returns its pid. The module
        must call ``die_with_parent`` first thing."""
        child_env = {**os.environ, **env}
        child_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_PACKAGE_ROOT), child_env.get("PYTHONPATH", "")) if p
        )
        command = [sys.executable, "-m", module, *args]
        process = subprocess.Popen(command, env=child_env, stdin=subprocess.DEVNULL)
        return self._add(name, _Command(process))

    def start_function(
        self, name: str, context: Any, target: Callable[..., object], args: tuple[Any, ...]
    ) -> int:
        """Start ``target(*args)`` in a process of the multiprocessing
        ``context`` (not a daemon: it may start processes of its own);
        returns its pid. ``target`` and ``args`` must pickle when the
        context spawns or forks a server."""
        process = context.Process(target=_with_parent, args=(target, args), daemon=False)
        process.start()
        return self._add(name, _Function(process))

    def _add(self, name: str, process: _Process) -> int:
        self._workers.append((name, process))
        pid = process.pid or 0
        log.info("launch.started", trial_id=self._trial_id, worker=name, pid=pid)
        return pid

    def watch(self, on_failure: Callable[[str, int], None]) -> None:
        """Call ``on_failure(worker, exit code)`` (once, from a thread) when a
        worker exits with an error before ``close``."""

        def poll() -> None:
            while not self._closing.wait(WATCH_INTERVAL_S):
                if failed := self.failed():
                    if not self._closing.is_set():
                        on_failure(*failed[0])
                    return

        threading.Thread(target=poll, name="launch-watch", daemon=True).start()

    @property
    def pids(self) -> list[int]:
        return [p.pid or 0 for _, p in self._workers]

    def exit_codes(self) -> dict[str, int | None]:
        """Every worker's exit code by name; None while it runs."""
        return {name: p.exit_code() for name, p in self._workers}

    def failed(self) -> list[tuple[str, int]]:
        """Workers that exited with an error, with their exit codes."""
        return [(n, rc) for n, p in self._workers if (rc := p.exit_code()) is not None and rc != 0]

    def wait(self, timeout: float) -> bool:
        """Wait for every worker to exit on its own; whether they all did."""
        deadline = time.monotonic() + timeout
        for _, process in self._workers:
            process.wait(max(0.0, deadline - time.monotonic()))
        return all(p.exit_code() is not None for _, p in self._workers)

    def close(self) -> None:
        """Reap every worker; ``exit_codes`` still answers afterwards."""
        if self._closing.is_set():
            return
        self._closing.set()
        for _, process in self._workers:
            if process.exit_code() is None:
                process.terminate()
        deadline = time.monotonic() + self._grace_s
        for name, process in self._workers:
            process.wait(max(0.0, deadline - time.monotonic()))
            if process.exit_code() is None:
                process.kill()
                process.wait(TERMINATE_GRACE_S)
            log.info(
                "launch.reaped", trial_id=self._trial_id, worker=name, code=process.exit_code()
            )
