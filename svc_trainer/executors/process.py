"""The executor's side of a warm executor (see ``executor``): the process
that imports its runner once, keeps the datasets it loaded and trains the
jobs the worker sends, one at a time, answering with ``executor_events``."""

from __future__ import annotations

import faulthandler
import gc
import os
import resource
import sys
import time
import traceback
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from shared.log import configure_logging, get_logger
from shared.malloc import hold_freed_memory
from svc_trainer.executors.events import (
    Epoch,
    Failed,
    Finished,
    Idle,
    Job,
    NeedsFresh,
    Ready,
    Started,
    UseCode,
)
from svc_trainer.lifetime import die_with_parent
from svc_trainer.plan import DataLoaded, DataRequest, DataSplits, Runner, StopReason, TrialError

log = get_logger("svc_trainer")


class _PipeChannel:
    def __init__(self, events: Connection, stop: Any, beats: Any) -> None:
        self._events, self._stop, self._beats = events, stop, beats
        self.started_with: dict[str, Any] = {}

    def started(self, resumed_from_step: int, note: str = "") -> None:
        self._beats.value += 1
        self._events.send(Started(resumed_from_step, note, **self.started_with))

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        self._beats.value += 1
        self._events.send(Epoch(step, dict(metrics)))

    def stop_requested(self) -> StopReason:
        self._beats.value += 1
        return StopReason(self._stop.value)


class _DataCache:
    """The datasets this executor loaded, by ``data.cache_key``, newest last."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[tuple[str, ...], DataSplits] = OrderedDict()

    def get(self, request: DataRequest) -> tuple[DataSplits, bool]:
        from svc_trainer.data import datasets

        key = datasets.cache_key(
            request.dataset, request.options, seed=request.seed, features_path=request.features_path
        )
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key], True
        loaded = datasets.load(
            request.dataset, request.options, seed=request.seed, features_path=request.features_path
        )
        if self._size > 0:
            self._entries[key] = loaded
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return loaded, False


def executor_main(
    runner_path: str,
    one_shot: bool,
    threads: int,
    cached_datasets: int,
    pipe: Connection,
    stop: Any,
    beats: Any,
    log_level: str,
    log_format: str,
    code_dir: str = "",
    crash_file: str = "",
) -> None:
    """The executor process (``Executor`` starts it): warm up, then one
    ``Job`` at a time until ``None``, EOF, a one-shot's trial or a trial
    that needs a fresh process.

    ``code_dir``: a shipped code package (unpacked and verified by the
    worker) that this executor's trials import from, first on the path of
    this process and of every process it starts. ``crash_file``: where the
    Python stacks go when the process dies of a signal (``os.abort()``, a
    segfault), for the worker to quote."""
    die_with_parent()
    hold_freed_memory()
    configure_logging("svc_trainer", log_level, log_format)
    _use_code(code_dir)
    # Open for the process's life: faulthandler writes to it as the process dies.
    crash = open(crash_file, "w") if crash_file else None
    if crash is not None:
        faulthandler.enable(crash, all_threads=True)
    code = 0
    try:
        from svc_trainer import runners

        began = time.monotonic()
        runner = runners.load(runner_path)
        if not one_shot:
            runner.warm_up(threads)
        # What the framework's import and warm-up made lives as long as this
        # process: out of the collector's sight, the collection after every
        # trial (``_run_trial``) takes milliseconds, not a quarter second.
        gc.freeze()
        pipe.send(Ready(os.getpid(), time.monotonic() - began))
        cache = _DataCache(cached_datasets)
        done = 0
        while (job := pipe.recv()) is not None:
            if isinstance(job, UseCode):  # a spare taken by a code package
                _use_code(job.directory)
                continue
            if not one_shot and runner.fresh_process(job.spec):
                pipe.send(NeedsFresh())
                break
            _run_trial(runner, job, cache, pipe, stop, beats, trials_before=done)
            done += 1
            pipe.send(Idle(_rss_bytes(), retiring=one_shot))
            if one_shot:
                break
    except EOFError:
        pass  # the worker is gone
    except BaseException:
        log.error("executor.crashed", error=traceback.format_exc())
        code = 1
    finally:
        pipe.close()
        # Everything is said; skip the interpreter's teardown, where a
        # framework's threads (gloo, TensorFlow) now and then abort the process.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _use_code(directory: str) -> None:
    """Import the package's code from ``directory`` here and in every process
    this one starts."""
    if directory:
        sys.path.insert(0, directory)
        inherited = os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (directory, inherited) if p)


def _run_trial(
    runner: Runner,
    job: Job,
    cache: _DataCache,
    events: Connection,
    stop: Any,
    beats: Any,
    *,
    trials_before: int,
) -> None:
    spec = job.spec
    log_ = get_logger("svc_trainer")
    try:
        try:
            splits, cached = cache.get(job.data)
        except TrialError as exc:
            # The data does not depend on the trial's parameters: no trial of
            # the study could load it either.
            exc.fatal_to_study = True
            raise
        from svc_trainer import baseline, evaluation

        splits = evaluation.prepare(splits, spec.options)
        events.send(
            DataLoaded(
                splits.name,
                splits.version,
                splits.source,
                splits.offsets,
                splits.feature,
                train_examples=len(splits.y_train),
                files=splits.files,
                distribution=splits.distribution,
                features=splits.feature_names,
                label=splits.label,
                split=splits.split,
            )
        )
        # Only a trial that exports a model is compared with the baseline;
        # measured before training, so a bad baseline fails the trial at once.
        measured = spec.export and not evaluation.cv_folds(spec.options)
        baseline_metrics = baseline.evaluate(spec, splits) if measured else {}
        channel = _PipeChannel(events, stop, beats)
        channel.started_with = {
            "pid": os.getpid(),
            "trials_before": trials_before,
            "data_cached": cached,
        }
        result = evaluation.run(runner, spec, splits, channel)
        if baseline_metrics and result.stopped is StopReason.NONE and result.export_format:
            result = replace(result, val_metrics={**result.val_metrics, **baseline_metrics})
        events.send(Finished(result))
    except TrialError as exc:
        events.send(Failed.of(exc))
    except SystemExit as exc:  # the user's code called sys.exit: the trial ends, not the process
        from svc_trainer.user_code import failures

        events.send(Failed.of(failures.from_exception(exc, "trial's code")))
    except Exception as exc:  # the machine's fault, not the trial's: may be retried
        log_.error("trial.crashed", trial_id=spec.trial_id, error=traceback.format_exc())
        tail = "\n".join(traceback.format_exc().rstrip().splitlines()[-15:])
        events.send(
            Failed("training_error", f"{type(exc).__name__}: {exc}", retryable=True, traceback=tail)
        )
    finally:
        try:
            runner.release()
        finally:
            gc.collect()


def _rss_bytes() -> int:
    """This process's resident memory now (its peak where /proc is absent)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
