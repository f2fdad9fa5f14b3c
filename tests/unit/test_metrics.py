from __future__ import annotations

import urllib.request

from prometheus_client import CollectorRegistry, Counter

from shared.metrics import NAMESPACE, serve_metrics
from shared.ports import free_port


def test_metrics_are_served_over_http() -> None:
    registry = CollectorRegistry()
    records = Counter(
        "records", "records handled", ["topic"], namespace=NAMESPACE, registry=registry
    )
    records.labels(topic="aistack.events.raw").inc(3)
    port = free_port()
    serve_metrics(port, registry)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    assert 'aistack_records_total{topic="aistack.events.raw"} 3.0' in body
