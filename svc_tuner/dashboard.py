"""``python -m svc_tuner.dashboard``: optuna-dashboard on the tuner's own
studies, in a browser (history, parameter importances, intermediate values,
each trial's parameters).

The studies are Optuna's journal in Redis (``svc_tuner.storage``), read here
with the tuner's own connection settings (its password and CA in secure
mode). What a person does in the dashboard (a note, a study deleted) is
written to that same journal. ``aistack dashboard`` and ``aistack up
--dashboard`` start it beside the stack; it also runs alone, configured as
the tuner is.
"""

from __future__ import annotations

from shared.errors import ConfigError
from shared.log import get_logger
from shared.service_main import run
from svc_tuner.settings import TunerSettings

log = get_logger("svc_tuner.dashboard")


def main() -> int:
    return run("svc_tuner.dashboard", TunerSettings, serve)


def serve(settings: TunerSettings) -> int:
    try:
        import optuna_dashboard
    except ImportError as exc:
        raise ConfigError(
            "optuna-dashboard is not installed: it is the `dashboard` extra (make setup has it)"
        ) from exc
    from svc_tuner.storage import redis_storage

    storage = redis_storage(settings.redis, settings.storage_prefix)
    log.info(
        "dashboard.serving",
        url=f"http://{settings.dashboard_host}:{settings.dashboard_port}",
        prefix=settings.storage_prefix,
    )
    # Serves until the process is signalled (SIGTERM's default ends it).
    optuna_dashboard.run_server(storage, host=settings.dashboard_host, port=settings.dashboard_port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
