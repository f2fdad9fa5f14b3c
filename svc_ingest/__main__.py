"""``python -m svc_ingest``: one cleaning worker, settings from the environment.

Start as many as you like with the same ``AISTACK_INGEST_APP_ID``: they share
the raw topic's partitions. SIGTERM stops the agent, commits and exits 0.
"""

from __future__ import annotations

import gc
import sys

from shared.errors import AistackError, ConfigError
from shared.log import configure_logging, get_logger
from shared.metrics import serve_metrics
from shared.settings import load_settings


def main() -> int:
    from svc_ingest.settings import IngestSettings

    try:
        settings = load_settings(IngestSettings)
    except ConfigError as exc:
        print(f"svc_ingest: {exc}", file=sys.stderr)
        return 2
    configure_logging("svc_ingest", settings.common.log_level, settings.common.log_format)
    log = get_logger("svc_ingest")

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
