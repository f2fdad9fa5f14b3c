"""Structured logging: one JSON object per line, with the service's context.

``log.info("trial.completed", trial_id=t.id, value=v)``: an event name and
fields, never an f-string message.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


class _CurrentStderr:
    """Whatever ``sys.stderr`` is when a line is written, not when logging was
    configured: a stream swapped in and closed since (pytest's capture, a
    redirect) must not turn every later log call into "I/O operation on
    closed file"."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_STDERR: Any = _CurrentStderr()


def configure_logging(service: str, level: str = "INFO", fmt: str = "json") -> None:
    """Route structlog and the stdlib (librdkafka, grpc, faust) to stderr."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared_processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared_processors,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=_STDERR),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
    handler = logging.StreamHandler(_STDERR)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared_processors,
            # Tracebacks of stdlib records (Faust's crashes) as text, not a repr.
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
