"""``python -m svc_ingest``: one cleaning worker, settings from the environment.

Start as many as you like with the same ``AISTACK_INGEST_APP_ID``: they share
the raw topic's partitions. SIGTERM stops the agent, commits and exits 0.
"""

from __future__ import annotations

import ctypes
import gc
import sys

from shared.errors import AistackError, ConfigError
from shared.log import configure_logging, get_logger
from shared.metrics import serve_metrics
from shared.settings import load_settings

# glibc's mallopt parameter for the most malloc arenas a process keeps.
_M_ARENA_MAX = -8
#: RocksDB's background threads (flushes, compactions) each take a malloc
#: arena of their own, up to eight per core, and memory freed there lingers:
#: one worker at 2,000 events/s held 208 MB after ten minutes with glibc's
#: default and 168 MB with two arenas (the memory store: 145 MB).
MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas for threads started from now on; False where
    the C library is not glibc (nothing changes)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))


def main() -> int:
    from svc_ingest.settings import IngestSettings

    try:
        settings = load_settings(IngestSettings)
    except ConfigError as exc:
        print(f"svc_ingest: {exc}", file=sys.stderr)
        return 2
    configure_logging("svc_ingest", settings.common.log_level, settings.common.log_format)
    log = get_logger("svc_ingest")
    limit_malloc_arenas(MALLOC_ARENAS)  # before any thread starts

    import faust
    import uvloop

    try:
        # faust_compat refuses a Faust it was not written for, in one line.
        from svc_ingest.app import create_app, mark_clean_shutdown, prepare_state, prepare_topics
    except ConfigError as exc:
        print(f"svc_ingest: {exc}", file=sys.stderr)
        return 2
    from svc_ingest.metrics import IngestMetrics

    uvloop.install()
    try:
        partitions = prepare_topics(settings)
    except AistackError as exc:
        print(f"svc_ingest: {exc}", file=sys.stderr)
        return 1
    if prepare_state(settings):
        log.warning(
            "state.rebuilding", why="no clean shutdown: local state comes from the changelog"
        )
    metrics = IngestMetrics.create()
    serve_metrics(settings.metrics_port, settings.common.metrics_host)
    app = create_app(settings, metrics, partitions=partitions)
    worker = faust.Worker(
        app,
        loglevel=settings.common.log_level.lower().replace("warning", "warn"),
        quiet=True,
        redirect_stdouts=False,
        override_logging=False,
    )
    # Start-up objects (Faust, protobuf descriptors) live as long as the process:
    # keeping them out of the collector's passes saves a tenth of the CPU at load.
    gc.freeze()
    # Each batch allocates tens of thousands of short-lived objects: collect
    # the young generation less often.
    gc.set_threshold(50_000, 20, 20)
    try:
        worker.execute_from_commandline()
    except SystemExit as exit_:
        if exit_.code in (0, None):
            mark_clean_shutdown(settings)
        raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
