"""``python -m svc_model``: the model server, settings from the environment.

Replays ``aistack.models.ready`` (the registry), loads what the policy keeps,
then serves the Open Inference Protocol over gRPC (default :8001) and follows
the topic for new versions. SIGTERM stops taking calls, lets those in flight
finish and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import TYPE_CHECKING

from shared.log import get_logger
from shared.metrics import serve_metrics
from shared.service_main import run
from svc_model.settings import ModelSettings

if TYPE_CHECKING:
    from svc_model.registry import RegistryFollower


def main() -> int:
    return run("svc_model", ModelSettings, _serve)


def _serve(settings: ModelSettings) -> int:
    # TensorFlow and torch's compiler (Triton) each carry an LLVM; loaded into
    # one process in the other order they abort. torch's first, then TF.
    with contextlib.suppress(ImportError):
        import triton  # noqa: F401
    return asyncio.run(serve(settings))


async def serve(settings: ModelSettings) -> int:
    from svc_model.app import ModelServer

    log = get_logger("svc_model")
    serve_metrics(settings.metrics_port, settings.common.metrics_host)
    server = await ModelServer.start(settings)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    log.info("model_server.serving", port=server.port)
    watcher = asyncio.ensure_future(_watch(server.follower, stopping))
    try:
        await stopping.wait()
    finally:
        watcher.cancel()
        await server.stop(grace=5)
    failure = server.follower.failure
    if failure is not None:
        print(f"svc_model: the models topic cannot be followed: {failure}", file=sys.stderr)
        return 1
    return 0


async def _watch(follower: RegistryFollower, stopping: asyncio.Event) -> None:
    # A follower that died (broker gone for good) stops the server rather
    # than leave it serving a repository that no longer follows the registry.
    while follower.failure is None:
        await asyncio.sleep(1.0)
    stopping.set()


if __name__ == "__main__":
    raise SystemExit(main())
