"""Prometheus metrics: every service exposes /metrics on its own port."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

NAMESPACE = "aistack"


def serve_metrics(port: int, host: str, registry: CollectorRegistry = REGISTRY) -> None:
    """Serve ``/metrics`` on ``host:port`` (port 0 disables it) from a daemon
    thread; ``host`` is AISTACK_METRICS_HOST, loopback unless widened."""
    if port:
        start_http_server(port, addr=host, registry=registry)
