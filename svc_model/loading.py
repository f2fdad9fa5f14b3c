"""From a model-ready event to a servable version: its runner and its queue."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from shared import model_loading
from shared.contracts.aistack.v1 import models_pb2
from shared.log import get_logger
from shared.model_loading import Runner
from shared.objective import version_number
from svc_model.batching import Batcher
from svc_model.metrics import ModelMetrics
from svc_model.repository import Served
from svc_model.settings import ModelSettings

log = get_logger("svc_model")


@dataclass(frozen=True)
class Loaded:
    runner: Runner
    batcher: Batcher


class Loader:
    def __init__(self, settings: ModelSettings, metrics: ModelMetrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self._cache: Path = settings.cache_dir()

    def load(self, event: models_pb2.ModelReady) -> Served:
        """Fetch, verify and load (blocking: call it from a thread).
        Raises ArtifactRejected, InvalidArgument (a bad version string)."""
        number = version_number(event.version)
        settings = self._settings
        directory = model_loading.fetch(event, self._cache, settings.object_store)
        name = event.model_name
        # Each version runs on threads of its own, always the same ones, and
        # so does all its framework work (load, trace, checks): torch and
        # TensorFlow keep a team of intra-op threads per calling thread, and
        # every team beyond the first costs every call. GNU OpenMP spins a
        # waiting worker only while its process holds no more threads than
        # cores; past that it parks and wakes them per operator (measured: the
        # digits CNN's call 0.18 ms on one team, 0.7 ms once a loading thread
        # had run it too; a shared pool's threads did the same). The threads
        # end when the version is dropped.
        executor = ThreadPoolExecutor(
            max_workers=settings.instances, thread_name_prefix=f"infer-{name}-{number}"
        )

        def prepare() -> tuple[Runner, float | None]:
            runner = model_loading.load(
                event, directory, settings.intra_op_threads, trace_exported=settings.trace_exported
            )
            model_loading.smoke_test(runner)
            # Timed only where the answer can matter: a slow model's calls
            # are not repeated at every load for nothing.
            on_loop = _may_run_on_loop(settings, settings.batching and runner.batched)
            return runner, model_loading.call_seconds(runner) if on_loop else None

        try:
            runner, call_seconds = executor.submit(prepare).result()
        except BaseException:
            executor.shutdown(wait=False)
            raise
        merge = settings.batching and runner.batched
        short = call_seconds is not None and call_seconds * 1000 <= settings.inline_max_ms
        inline = short and not merge
        batch_rows = self._metrics.batch_rows.labels(name)
        queue_delay = self._metrics.queue_delay.labels(name)

        def observe(rows: int, waits: list[float]) -> None:
            batch_rows.observe(rows)
            for waited in waits:
                queue_delay.observe(waited)

        batcher = Batcher(
            runner.run,
            executor,
            max_batch_size=settings.max_batch_size if merge else 1,
            max_queue_delay_s=settings.max_queue_delay_us / 1e6,
            instances=settings.instances,
            observe=observe,
            inline=inline,
            lone_inline=short and merge,
        )
        log.info(
            "model.loaded",
            model=name,
            version=number,
            platform=runner.platform,
            runtime=runner.runtime or runner.platform,
            batching=merge,
            inline=inline,
            lone_inline=batcher.lone_inline,
            call_ms=None if call_seconds is None else round(call_seconds * 1000, 3),
            path=str(directory),
        )
        return Served(name=name, version=number, event=event, executor=Loaded(runner, batcher))


def _may_run_on_loop(settings: ModelSettings, merge: bool) -> bool:
    """Whether some of a version's calls may run on the event loop, its call
    time aside: one intra-op thread (a second thread's team would slow the
    version's every call, see ``Loader.load``), and either merged (a request
    alone in the server) or unmerged on one instance (every request)."""
    return (
        settings.intra_op_threads == 1
        and settings.inline_max_ms > 0
        and (merge or settings.instances == 1)
    )
