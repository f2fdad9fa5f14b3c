"""How the local launcher tells its own servers from other processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compose import local


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
    assert local._is_our_process(os.getpid(), "redis-server")


def test_another_program_is_not_ours() -> None:
    assert not local._is_our_process(os.getpid(), "redis-server")


def test_a_process_that_stays_blank_is_not_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Path, "read_bytes", lambda path: b"")
    monkeypatch.setattr(local.time, "sleep", lambda seconds: None)
    assert not local._is_our_process(os.getpid(), "redis-server")
