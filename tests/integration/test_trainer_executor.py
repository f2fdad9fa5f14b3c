"""Warm executors as processes, without a broker: trials run one after the
other in one process that keeps its data, are recycled after a number of
trials, and a stop reaches the run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from svc_trainer.executors.pool import (
    Epoch,
    Event,
    Executor,
    ExecutorPool,
    Failed,
    Finished,
    Idle,
    Job,
    Limits,
    Ready,
    Started,
)
from svc_trainer.plan import DataRequest, Hyperparams, StopReason
from svc_trainer.runners import registry
from tests.integration.trainer_support import run_spec


def _job(root: Path, number: int, *, epochs: int = 2, **overrides: Any) -> Job:
    spec = run_spec(
        root / f"trial-{number}",
        trial_id=f"warm/{number}",
        study_id="warm",
        trial_number=number,
        epochs=epochs,
        seed=7,
        threads=1,
        **overrides,
    )
    return Job(spec, DataRequest("digits"))


def _until_idle(executor: Executor, *, stop_after_epoch: StopReason | None = None) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        for event in executor.events(timeout=0.5):
            events.append(event)
            if isinstance(event, Epoch) and stop_after_epoch is not None:
                executor.request_stop(stop_after_epoch)
            if isinstance(event, Idle):
                return events
        assert executor.alive(), f"the executor {executor.death()}: {events}"
    raise AssertionError(f"no Idle within the time: {events}")


@pytest.fixture
def pool() -> Iterator[ExecutorPool]:
    started = ExecutorPool(registry(), Limits(max_trials=3), threads=1, log_format="console")
    yield started
    started.close()


def test_trials_reuse_one_warm_process_until_it_is_recycled(
    pool: ExecutorPool, tmp_path: Path
) -> None:
    starts: list[Started] = []
    finals: list[Finished] = []
    pids: list[int | None] = []
    for number in range(4):
        executor = pool.executor_for("torch")
        executor.submit(_job(tmp_path, number))
        events = _until_idle(executor)
        starts += [e for e in events if isinstance(e, Started)]
        finals += [e for e in events if isinstance(e, Finished)]
        pids.append(executor.pid)
        [idle] = [e for e in events if isinstance(e, Idle)]
        assert not idle.retiring and idle.rss_bytes > 0
        pool.trial_ended(executor, idle)

    # The same process for three trials (the limit), then a fresh one.
    assert [s.pid for s in starts] == pids
    assert pids[0] == pids[1] == pids[2] != pids[3]
    assert [s.trials_before for s in starts] == [0, 1, 2, 0]
    assert [s.data_cached for s in starts] == [False, True, True, False]
    assert pool.started == 2
    # Nothing of a trial leaks into the next: same seed and data, same run.
    assert finals[0].result.val_metrics["val_loss"] == pytest.approx(
        finals[1].result.val_metrics["val_loss"], rel=1e-6
    )
    assert all(f.result.export_format == "torch_export" for f in finals)


def test_a_stop_reaches_a_warm_run_and_the_process_takes_the_next_trial(
    pool: ExecutorPool, tmp_path: Path
) -> None:
    executor = pool.executor_for("torch")
    executor.submit(_job(tmp_path, 0, epochs=30))
    events = _until_idle(executor, stop_after_epoch=StopReason.PRUNE)
    [finished] = [e for e in events if isinstance(e, Finished)]
    assert finished.result.stopped is StopReason.PRUNE
    assert finished.result.epochs_completed <= 2
    assert any(isinstance(e, Ready) for e in events)

    executor.submit(_job(tmp_path, 1, epochs=1))
    events = _until_idle(executor)
    [started] = [e for e in events if isinstance(e, Started)]
    assert started.pid == executor.pid and started.trials_before == 1
    assert not [e for e in events if isinstance(e, Failed)]
    [finished] = [e for e in events if isinstance(e, Finished)]
    assert finished.result.stopped is StopReason.NONE  # the stop flag was reset


#: A trial of bench.study_speedup's study (its steps' arrays a few MiB).
LARGER = {"learning_rate": 0.005, "dropout": 0.2, "units": 256}


def _page_faults(pid: int) -> int:
    """The minor page faults of process ``pid`` so far (proc(5): stat's tenth field)."""
    after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]
    return int(after_name.split()[7])


def test_a_warm_executors_trials_reuse_the_memory_they_freed(
    pool: ExecutorPool, tmp_path: Path
) -> None:
    """A training step's arrays come from memory the steps before it freed
    (shared.malloc.hold_freed_memory, set as the executor starts), not from
    fresh pages faulted in one by one and given back at every step."""
    executor = pool.executor_for("torch")
    faults = []
    for number in range(2):
        executor.submit(_job(tmp_path, number, epochs=4, hparams=Hyperparams.from_params(LARGER)))
        assert executor.pid is not None
        before = _page_faults(executor.pid)
        [idle] = [e for e in _until_idle(executor) if isinstance(e, Idle)]
        faults.append(_page_faults(executor.pid) - before)
        pool.trial_ended(executor, idle)
    # glibc's default: 24,000 in the second trial here (1,300 held).
    assert faults[1] < 6_000, faults


def test_an_executor_still_warming_up_is_killed_at_close_not_waited_for(
    pool: ExecutorPool,
) -> None:
    executor = pool.executor_for("tensorflow")  # importing TensorFlow takes seconds
    pool.close()
    assert not executor.alive()
    assert executor.death() == "killed by SIGKILL"
    assert not executor.ready
