"""Prometheus metrics: every service exposes /metrics on its own port."""

from __future__ import annotations

import urllib.request

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

NAMESPACE = "aistack"


def serve_metrics(port: int, host: str, registry: CollectorRegistry = REGISTRY) -> None:
    """Serve ``/metrics`` on ``host:port`` (port 0 disables it) from a daemon
    thread; ``host`` is AISTACK_METRICS_HOST, loopback unless widened."""
    if port:
        start_http_server(port, addr=host, registry=registry)


def scraped_sum(port: int, name: str, host: str = "127.0.0.1") -> float:
    """The sum of every series of the metric ``name`` on the ``/metrics`` at
    ``host:port``, as a scraper reads it; 0 when nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name}{{", f"{name} "))
    )
