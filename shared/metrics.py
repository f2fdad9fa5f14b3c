"""Prometheus metrics: every service exposes /metrics on its own port."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

NAMESPACE = "aistack"


def serve_metrics(port: int, registry: CollectorRegistry = REGISTRY) -> None:
    """Serve ``/metrics`` on ``port`` (0 disables it) from a daemon thread."""
    if port:
        start_http_server(port, registry=registry)
