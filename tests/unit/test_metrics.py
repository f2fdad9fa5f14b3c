from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from shared.metrics import NAMESPACE, serve_metrics
from shared.ports import free_port
from shared.settings import CommonSettings


def test_metrics_are_served_over_http() -> None:
    registry = CollectorRegistry()
    records = Counter(
        "records", "records handled", ["topic"], namespace=NAMESPACE, registry=registry
    )
    records.labels(topic="aistack.events.raw").inc(3)
    port = free_port()
    serve_metrics(port, "127.0.0.1", registry)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    assert 'aistack_records_total{topic="aistack.events.raw"} 3.0' in body


def this_hosts_address() -> str | None:
    """An address of this machine other than loopback (UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.254.254.254", 1))
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_metrics_listen_on_loopback_unless_widened(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AISTACK_METRICS_HOST", raising=False)
    host = CommonSettings().metrics_host
    assert host == "127.0.0.1"
    address = this_hosts_address()
    if address is None:
        pytest.skip("this machine has no address but loopback to try from")
    port = free_port()
    serve_metrics(port, host, CollectorRegistry())
    with pytest.raises(OSError):  # refused: nothing listens there
        urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=5)
    monkeypatch.setenv("AISTACK_METRICS_HOST", "0.0.0.0")
    widened = free_port()
    serve_metrics(widened, CommonSettings().metrics_host, CollectorRegistry())
    with urllib.request.urlopen(f"http://{address}:{widened}/metrics", timeout=5) as response:
        assert response.status == 200
