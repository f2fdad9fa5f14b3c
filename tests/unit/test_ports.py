"""Free ports are picked where no connection's local port can take them."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from shared import ports
from tests import infra
from tests.infra import port_is_free


def kernel_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """The kernel's ephemeral range, as ``shared.ports`` reads it, set to ``text``."""
    span = tmp_path / "ip_local_port_range"
    span.write_text(text)
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", span)


def test_ports_are_distinct_free_and_below_the_ephemeral_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel_range(tmp_path, monkeypatch, "32768\t60999\n")
    picked = ports.free_ports(20)
    assert len(set(picked)) == 20
    assert all(ports.LOWEST <= port < 32768 for port in picked), picked
    assert all(port_is_free(port) for port in picked)


def test_a_port_taken_is_not_picked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # A range with room for one port below it, and that one is taken.
        kernel_range(tmp_path, monkeypatch, f"{taken + 1} 65000")
        monkeypatch.setattr(ports, "LOWEST", taken)
        (port,) = ports.free_ports(1)
    # The kernel's choice instead: the only port below the range was taken.
    assert port != taken


def test_without_the_kernels_range_the_kernel_picks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "absent")
    assert ports.ephemeral_range() is None
    picked = ports.free_ports(3)
    assert len(set(picked)) == 3 and all(port > 0 for port in picked)


def test_a_clusters_further_brokers_ports_stay_below_the_ephemeral_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel_range(tmp_path, monkeypatch, "32768 60999")
    # The first pick's third broker would land at 32,750 + 200, in the range.
    picks = iter([[32_750, 20_000, 20_001], [21_000, 21_001, 21_002]])
    monkeypatch.setattr(infra, "free_ports", lambda count: next(picks))
    assert infra.stepped_free_ports(3, brokers=3) == [21_000, 21_001, 21_002]
