"""``python -m svc_ingest``: one cleaning worker, settings from the environment.

Start as many as you like with the same ``AISTACK_INGEST_APP_ID``: they share
the raw topic's partitions. SIGTERM stops the agent, commits and exits 0.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from shared.log import get_logger
from shared.malloc import limit_arenas
from shared.metrics import serve_metrics
from shared.service_main import run

if TYPE_CHECKING:
    from svc_ingest.settings import IngestSettings

#: RocksDB's background threads (flushes, compactions) each take a malloc
#: arena of their own, up to eight per core, and memory freed there lingers:
#: one worker at 2,000 events/s held 208 MB after ten minutes with glibc's
#: default and 168 MB with two arenas (the memory store: 145 MB).
MALLOC_ARENAS = 2


def main() -> int:
    from svc_ingest.settings import IngestSettings

    return run("svc_ingest", IngestSettings, serve)


def serve(settings: IngestSettings) -> int:
    log = get_logger("svc_ingest")
    limit_arenas(MALLOC_ARENAS)  # before any thread starts

    import faust
    import uvloop

    # faust_compat refuses a Faust it was not written for, in one line (a ConfigError).
    from svc_ingest.app import create_app, mark_clean_shutdown, prepare_state, prepare_topics
    from svc_ingest.metrics import IngestMetrics

    uvloop.install()
    partitions = prepare_topics(settings)
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
