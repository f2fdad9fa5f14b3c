"""Running the launcher's long-lived processes: Kafka and Redis
(``compose.local``) and the services (``compose.stack``).

Each process runs in its own session: it outlives the command that started
it, is not killed with its terminal, and its children (Spark's JVM, trial
processes) share its process group, so that a stop reaches them too. Its
output is appended to a log file and its pid written to a pid file, which is
all that ties a later ``aistack`` command to it. A pid file can outlive its
process, and a stranger can reuse the pid: a process is ours only while its
command line holds our marker.

Nothing here makes a process die with its parent, as trial processes do
(``svc_trainer``): these outlive the command that started them on purpose.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from compose.logs import indent, last_lines
from shared.errors import Unavailable

#: How many log lines an exited process (or a failed start) shows.
LAST_LINES = 10

# After a leader exits, how long its group's remaining members get to follow
# on their own before they are sent SIGTERM too.
_ORPHAN_GRACE = 5.0


@dataclass(frozen=True)
class ManagedProcess:
    """One process the launcher starts: where its pid and its output go."""

    name: str
    # A word in the process's command line, to tell our process from a
    # stranger that reused the pid.
    marker: str
    pid_file: Path
    log_file: Path

    def recorded_pid(self) -> int | None:
        """The pid in the pid file, running or not."""
        return read_pid(self.pid_file)

    def pid(self) -> int | None:
        """The pid if the process runs and is ours; reads, changes nothing."""
        pid = self.recorded_pid()
        if pid is not None and is_our_process(pid, self.marker):
            return pid
        return None

    def leftover_group(self) -> int | None:
        """The process group of an exited leader if members of it remain."""
        pid = self.recorded_pid()
        if pid is None or pid_running(pid):
            # Alive: ours (then not a leftover) or a stranger that reused the
            # pid, whose group is not ours to touch.
            return None
        return pid if group_members(pid) else None


@dataclass(frozen=True)
class Readiness:
    """``process`` is ready once ``probe()`` is true; ``where`` says where it
    answers, for messages ("on port 9102")."""

    process: ManagedProcess
    probe: Callable[[], bool]
    where: str


class Supervisor:
    """Starts processes, waits until they are ready, and stops them.

    It keeps the children it started itself, for their exit status and to reap
    them (no zombies in a long-lived caller); processes started by an earlier
    command are found through their pid files.
    """

    def __init__(self) -> None:
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(
        self,
        process: ManagedProcess,
        command: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start ``command`` in its own session, its output appended to the
        log; ``env`` None: this process's environment."""
        with process.log_file.open("ab") as log:
            child = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=None if env is None else dict(env),
                start_new_session=True,
            )
        process.pid_file.write_text(f"{child.pid}\n")
        self._children[process.name] = child

    def wait_ready(
        self,
        checks: Sequence[Readiness],
        *,
        timeout: float,
        hint: str,
        on_ready: Callable[[ManagedProcess], object] | None = None,
    ) -> None:
        """Wait until every check passes, calling ``on_ready`` for each as it does.

        Raises Unavailable at once when a process exits first, and when any is
        not ready after ``timeout`` seconds (``hint`` says what to do about a
        slow one); both quote the end of its log.
        """
        # All are waited for together: on two cores their imports and JVMs
        # overlap with each other's waits on the broker.
        deadline = time.monotonic() + timeout
        pending = list(checks)
        while pending:
            for check in list(pending):
                process = check.process
                if check.probe():
                    pending.remove(check)
                    if on_ready is not None:
                        on_ready(process)
                elif process.pid() is None:
                    raise Unavailable(
                        f"{process.name} exited during start-up{self.exit_status(process)}; "
                        f"last lines of {process.log_file}:\n"
                        + indent(last_lines(process.log_file, LAST_LINES))
                    )
            if pending and time.monotonic() > deadline:
                first, *others = pending
                also = f" (nor {', '.join(o.process.name for o in others)})" if others else ""
                raise Unavailable(
                    f"{first.process.name} is not ready {first.where} after {timeout:.0f}s"
                    f"{also}; {hint}. Last lines of {first.process.log_file}:\n"
                    + indent(last_lines(first.process.log_file, LAST_LINES))
                )
            if pending:
                time.sleep(0.25)

    def exit_status(self, process: ManagedProcess) -> str:
        """ " (exit status 3)" or " (killed by SIGKILL)" for a child of this
        supervisor that has exited; "" otherwise."""
        child = self._children.get(process.name)
        code = child.poll() if child is not None else None
        if code is None:
            return ""
        if code < 0:
            return f" (killed by {signal.Signals(-code).name})"
        return f" (exit status {code})"

    def stop(self, processes: Sequence[ManagedProcess], timeout: float) -> None:
        """Stop ``processes`` and their groups, all under one deadline.

        Each leader gets SIGTERM and stops its own children in order (Spark's
        JVM after the queries, trials handed back); whatever of a group is left
        at the deadline gets SIGKILL. An exited leader's leftover group gets
        SIGTERM at once. Pid files are removed; raises nothing for processes
        that are not running.
        """
        deadline = time.monotonic() + timeout
        groups: dict[ManagedProcess, int] = {}
        for process in processes:
            pid = process.pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                groups[process] = pid
            elif (pgid := process.leftover_group()) is not None:
                signal_group(pgid, signal.SIGTERM)
                groups[process] = pgid
            else:
                process.pid_file.unlink(missing_ok=True)
        # When each leader was first seen gone, to give its children a moment
        # to follow on their own (Spark's JVM exits when the driver's pipe
        # closes; a signal then races its shutdown hooks).
        orphaned: dict[ManagedProcess, float] = {}
        while groups and time.monotonic() < deadline:
            for process, pgid in list(groups.items()):
                if pid_running(pgid):
                    continue
                if not group_members(pgid):
                    del groups[process]
                    process.pid_file.unlink(missing_ok=True)
                elif time.monotonic() - orphaned.setdefault(process, time.monotonic()) > (
                    _ORPHAN_GRACE
                ):
                    signal_group(pgid, signal.SIGTERM)
            if groups:
                time.sleep(0.2)
        for process, pgid in groups.items():
            signal_group(pgid, signal.SIGKILL)
            wait_gone(pgid, 10.0)
            process.pid_file.unlink(missing_ok=True)
        for process in processes:
            child = self._children.pop(process.name, None)
            if child is not None:
                child.poll()  # reaps it

    def kill_leftovers(self, process: ManagedProcess) -> None:
        """SIGKILL what an exited leader left behind (a trial, Spark's JVM)
        before a new one starts and competes with it for work and ports."""
        pgid = process.leftover_group()
        if pgid is None:
            return
        signal_group(pgid, signal.SIGKILL)
        wait_gone(pgid, 10.0)


# ---- pids and process groups ----


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def pid_running(pid: int) -> bool:
    try:
        # A zombie (our own exited child) counts as gone.
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def is_our_process(pid: int, marker: str) -> bool:
    """Whether ``pid`` runs and its command line holds ``marker``."""
    # redis-server rewrites its process title as it starts: for a moment its
    # cmdline reads empty. Read again rather than take it for someone else's.
    for _ in range(40):
        if not pid_running(pid):
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return False
        if cmdline.strip():
            return marker in cmdline
        time.sleep(0.005)
    return False


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after "(comm)": state, ppid, pgrp, …; comm may hold ")".
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            members.append(int(entry.name))
    return members


def signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def wait_gone(pgid: int, timeout: float) -> None:
    # SIGKILL is not instant (a process in uninterruptible I/O finishes it
    # first), nor always final (D state): wait a while, never forever.
    deadline = time.monotonic() + timeout
    while (pid_running(pgid) or group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)


# ---- ports ----


def port_open(host: str, port: int) -> bool:
    """Whether something accepts connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def port_taken(host: str, port: int) -> bool:
    """Whether another process listens on, or holds, ``host:port``."""
    if port_open("127.0.0.1" if host == "0.0.0.0" else host, port):
        return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the servers do: a closed connection's TIME_WAIT does not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False
