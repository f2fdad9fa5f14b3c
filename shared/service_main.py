"""The start every service's ``python -m svc_X`` shares: its settings from
the environment, logging, then the service; what stops it, said in one line.

- A bad setting: one line naming it (``load_settings``), exit status 2,
  before anything starts; also a ConfigError the service raises while it
  prepares (a setting only it can check).
- Any other AistackError (no broker, a topic not read in time): one line,
  exit status 1.
- SIGTERM and SIGINT: ``stop_on_signals`` for a service whose main thread
  polls; an asyncio service adds its own handlers on its loop.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

from shared.errors import AistackError, ConfigError
from shared.log import configure_logging
from shared.settings import ServiceSettings, load_settings

SettingsT = TypeVar("SettingsT", bound=ServiceSettings)


def run(service: str, settings_class: type[SettingsT], serve: Callable[[SettingsT], int]) -> int:
    """``serve`` the service on its settings; its exit status."""
    try:
        settings = load_settings(settings_class)
    except ConfigError as exc:
        print(f"{service}: {exc}", file=sys.stderr)
        return 2
    configure_logging(service, settings.common.log_level, settings.common.log_format)
    try:
        return serve(settings)
    except ConfigError as exc:
        print(f"{service}: {exc}", file=sys.stderr)
        return 2
    except AistackError as exc:
        print(f"{service}: {exc}", file=sys.stderr)
        return 1


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (call from the main thread)."""
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    return stopping
