"""compose.processes: starting, waiting for and stopping the launcher's processes."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from compose import processes
from compose.processes import ManagedProcess, Readiness, Supervisor, group_members
from shared.errors import Unavailable

SLEEPER = "import time; time.sleep(600)"


def managed(tmp_path: Path, name: str = "svc_demo") -> ManagedProcess:
    return ManagedProcess(name, f"-m {name}", tmp_path / f"{name}.pid", tmp_path / f"{name}.log")


def command(script: str, process: ManagedProcess) -> list[str]:
    # The marker in the command line makes the stand-in read as ours.
    return [sys.executable, "-c", script, *process.marker.split()]


@pytest.fixture
def supervisor() -> Supervisor:
    return Supervisor()


# ---- is it ours ----


def test_a_blank_cmdline_while_starting_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-server blanks /proc/<pid>/cmdline for an instant as it sets its
    process title; reading that as "not ours" failed the infra fixture now and then."""
    real = Path.read_bytes
    blanks = iter([b"", b""])

    def read_bytes(path: Path) -> bytes:
        if path.name == "cmdline":
            return next(blanks, b"redis-server\x00127.0.0.1:6379\x00")
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    assert processes.is_our_process(os.getpid(), "redis-server")


def test_another_program_is_not_ours() -> None:
    assert not processes.is_our_process(os.getpid(), "redis-server")


def test_a_process_that_stays_blank_is_not_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Path, "read_bytes", lambda path: b"")
    monkeypatch.setattr(processes.time, "sleep", lambda seconds: None)
    assert not processes.is_our_process(os.getpid(), "redis-server")


# ---- start ----


def test_spawn_records_the_pid_and_appends_output_in_a_new_session(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    process = managed(tmp_path)
    process.log_file.write_text("earlier run\n")
    script = "import os, time; print(os.environ['GREETING'], flush=True); time.sleep(600)"
    supervisor.spawn(process, command(script, process), cwd=tmp_path, env={"GREETING": "hello"})
    try:
        pid = process.pid()
        assert pid is not None and pid == process.recorded_pid()
        assert os.getpgid(pid) == pid  # its own group: a stop reaches its children
        supervisor.wait_ready(
            [Readiness(process, lambda: "hello" in process.log_file.read_text(), "in its log")],
            timeout=30,
            hint="-",
        )
        assert process.log_file.read_text() == "earlier run\nhello\n"
    finally:
        supervisor.stop([process], timeout=5)
    assert process.pid() is None and not process.pid_file.exists()


def test_wait_ready_reports_each_process_as_it_gets_ready(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    first, second = managed(tmp_path, "svc_a"), managed(tmp_path, "svc_b")
    for process in (first, second):
        supervisor.spawn(process, command(SLEEPER, process), cwd=tmp_path)
    seen: list[str] = []
    try:
        # svc_b gets ready only after svc_a has been reported.
        supervisor.wait_ready(
            [
                Readiness(second, lambda: "svc_a" in seen, "on port 2"),
                Readiness(first, lambda: True, "on port 1"),
            ],
            timeout=30,
            hint="-",
            on_ready=lambda process: seen.append(process.name),
        )
    finally:
        supervisor.stop([first, second], timeout=5)
    assert seen == ["svc_a", "svc_b"]


def test_an_exit_during_start_up_fails_with_its_status_and_log(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    process = managed(tmp_path)
    script = "import sys; print('no broker'); sys.exit(4)"
    supervisor.spawn(process, command(script, process), cwd=tmp_path)
    with pytest.raises(Unavailable) as raised:
        supervisor.wait_ready(
            [Readiness(process, lambda: False, "on port 1")], timeout=60, hint="-"
        )
    assert str(raised.value).splitlines() == [
        f"svc_demo exited during start-up (exit status 4); last lines of {process.log_file}:",
        "    no broker",
    ]


def test_not_ready_in_time_names_every_late_one_and_the_hint(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    first, second = managed(tmp_path, "svc_a"), managed(tmp_path, "svc_b")
    for process in (first, second):
        supervisor.spawn(process, command(SLEEPER, process), cwd=tmp_path)
    try:
        with pytest.raises(Unavailable) as raised:
            supervisor.wait_ready(
                [Readiness(p, lambda: False, "on port 7") for p in (first, second)],
                timeout=0.5,
                hint="raise X if it is only slow",
            )
    finally:
        supervisor.stop([first, second], timeout=5)
    assert str(raised.value).splitlines() == [
        "svc_a is not ready on port 7 after 0s (nor svc_b); raise X if it is only slow. "
        f"Last lines of {first.log_file}:",
        "    (no log)",
    ]


# ---- stop ----


def test_stop_kills_what_ignores_sigterm_at_the_deadline(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    process = managed(tmp_path)
    script = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ignoring SIGTERM', flush=True)\n"
        "time.sleep(600)\n"
    )
    supervisor.spawn(process, command(script, process), cwd=tmp_path)
    pid = process.pid()
    assert pid is not None
    supervisor.wait_ready(
        [Readiness(process, lambda: "ignoring" in process.log_file.read_text(), "-")],
        timeout=30,
        hint="-",
    )
    supervisor.stop([process], timeout=0.5)
    # It ignored SIGTERM: only the SIGKILL at the deadline ended it.
    assert not processes.pid_running(pid)
    assert not process.pid_file.exists()


def test_an_exited_leaders_children_are_leftovers_until_killed(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    process = managed(tmp_path)
    script = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    )
    supervisor.spawn(process, command(script, process), cwd=tmp_path)
    pgid = process.recorded_pid()
    assert pgid is not None
    deadline = time.monotonic() + 30
    while processes.pid_running(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.pid() is None
    assert process.leftover_group() == pgid and group_members(pgid)
    supervisor.kill_leftovers(process)
    assert process.leftover_group() is None and group_members(pgid) == []


def test_stop_of_what_never_ran_clears_its_pid_file(supervisor: Supervisor, tmp_path: Path) -> None:
    process = managed(tmp_path)
    process.pid_file.write_text("not a pid\n")
    supervisor.stop([process], timeout=1)
    assert not process.pid_file.exists()
