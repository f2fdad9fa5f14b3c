from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from shared.metrics import NAMESPACE, scraped_sum, serve_metrics
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


def test_a_scrape_sums_a_metrics_series_and_reads_0_where_nothing_answers() -> None:
    registry = CollectorRegistry()
    lag = Gauge("lag", "lag", ["partition"], namespace=NAMESPACE, registry=registry)
    lag.labels("0").set(3)
    lag.labels("1").set(4)
    port = free_port()
    serve_metrics(port, "127.0.0.1", registry)
    assert scraped_sum(port, "aistack_lag") == 7
    assert scraped_sum(port, "aistack_la") == 0  # a prefix is another metric
    assert scraped_sum(free_port(), "aistack_lag") == 0
