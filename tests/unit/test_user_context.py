"""The trial context a user's training loop sees (``aistack.trial``): the
report contract, checkpoints that belong to their report, stops that
arrive through it, and a loop run locally (``aistack.local``)."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import aistack
from aistack import local
from aistack.torch import TorchContext
from aistack.trial import (
    NO_STOP,
    PRUNE,
    SHUTDOWN,
    CheckpointStore,
    Dataset,
    InvalidReport,
    TrialPruned,
    TrialStopped,
)


class Session:
    """What the platform's session records, and a stop it can be told to ask."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.stop = NO_STOP

    def started(self, resumed_from_step: int) -> None:
        self.events.append(("started", resumed_from_step))

    def progress(self, step: int, metrics: Mapping[str, float]) -> None:
        self.events.append(("progress", step, dict(metrics)))

    def stop_requested(self) -> int:
        return self.stop

    def agree(self, flag: int) -> int:
        return flag


def dataset(rows: int = 60) -> Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    third = rows // 3
    return Dataset(
        name="toy",
        version="v",
        task=aistack.CLASSIFICATION,
        x_train=x[:third],
        y_train=y[:third],
        x_val=x[third : 2 * third],
        y_val=y[third : 2 * third],
        x_test=x[2 * third :],
        y_test=y[2 * third :],
        n_classes=2,
    )


def context(tmp_path: Path, session: Session, *, rank: int = 0, **overrides: Any) -> TorchContext:
    values: dict[str, Any] = {
        "session": session,
        "params": {"lr": 0.1},
        "data": dataset(),
        "checkpoint_dir": tmp_path / "checkpoints",
        "scratch_dir": tmp_path / "scratch",
        "objective": "val_loss",
        "rank": rank,
        "world_size": 1 if rank == 0 else 2,
        **overrides,
    }
    return TorchContext(device=torch.device("cpu"), **values)


def test_a_report_reaches_the_session_after_its_start(tmp_path: Path) -> None:
    session = Session()
    ctx = context(tmp_path, session)
    ctx.report(1, {"val_loss": 0.5, "accuracy": 0.75})
    ctx.report(2, {"val_loss": 0.25})
    assert session.events == [
        ("started", 0),
        ("progress", 1, {"val_loss": 0.5, "accuracy": 0.75}),
        ("progress", 2, {"val_loss": 0.25}),
    ]
    assert ctx.last_step == 2 and ctx.last_metrics == {"val_loss": 0.25}


@pytest.mark.parametrize(
    ("step", "metrics", "reason"),
    [
        (1, {"accuracy": 0.5}, "unknown_metric"),
        (1, {"val_loss": math.nan}, "nan_metric"),
        (1, {"val_loss": math.inf}, "nan_metric"),
        (1, {"val_loss": "low"}, "invalid_report"),
        (-1, {"val_loss": 0.1}, "invalid_report"),
        (1.5, {"val_loss": 0.1}, "invalid_report"),
    ],
)
def test_a_report_the_platform_cannot_use_is_refused_and_remembered(
    tmp_path: Path, step: Any, metrics: dict[str, Any], reason: str
) -> None:
    session = Session()
    ctx = context(tmp_path, session)
    with pytest.raises(InvalidReport) as raised:
        ctx.report(step, metrics)
    assert raised.value.reason == reason
    # Caught by the loop or not, the trial fails with it.
    assert ctx.fault is raised.value
    assert not [e for e in session.events if e[0] == "progress"]


def test_steps_must_increase(tmp_path: Path) -> None:
    ctx = context(tmp_path, Session())
    ctx.report(3, {"val_loss": 1.0})
    with pytest.raises(InvalidReport, match="after step 3"):
        ctx.report(3, {"val_loss": 0.9})


def test_a_checkpoint_is_written_before_its_report_and_restored_with_its_step(
    tmp_path: Path,
) -> None:
    session = Session()
    ctx = context(tmp_path, session)
    model = nn.Linear(4, 2)
    written: list[bool] = []
    original = session.progress

    def progress(step: int, metrics: Mapping[str, float]) -> None:
        # The report leaves after its checkpoint is whole on disk.
        written.append((tmp_path / "checkpoints" / "user" / "meta.json").is_file())
        original(step, metrics)

    session.progress = progress  # type: ignore[method-assign]
    ctx.report(4, {"val_loss": 0.3}, checkpoint={"model": model.state_dict(), "epoch": 4})
    assert written == [True]

    resumed = Session()
    again = context(tmp_path, resumed)
    saved = again.restore()
    assert saved is not None and saved.step == 4 and saved.metrics == {"val_loss": 0.3}
    state = saved.state()
    assert state["epoch"] == 4
    assert torch.equal(state["model"]["weight"], model.state_dict()["weight"])
    assert resumed.events == [("started", 4)]
    with pytest.raises(InvalidReport, match="after step 4"):
        again.report(4, {"val_loss": 0.2})


def test_a_directory_checkpoint_is_copied_and_read_back(tmp_path: Path) -> None:
    source = tmp_path / "mine"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"\x00\x01")
    ctx = context(tmp_path, Session())
    ctx.report(1, {"val_loss": 1.0}, checkpoint=source)
    saved = context(tmp_path, Session()).restore()
    assert saved is not None
    assert (saved.directory / "weights.bin").read_bytes() == b"\x00\x01"
    with pytest.raises(ValueError, match="directory"):
        saved.state()


def test_a_tensorflow_trials_mapping_round_trips_through_numpy(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "tensorflow")
    weights = [np.ones((2, 3), np.float32), np.arange(3.0)]
    store.save(2, {"val_loss": 0.1}, {"weights": weights, "step": 2, "nested": {"a": 1.5}})
    saved = store.latest(tmp_path / "copy")
    assert saved is not None
    state = saved.state()
    assert [w.tolist() for w in state["weights"]] == [w.tolist() for w in weights]
    assert state["step"] == 2 and state["nested"] == {"a": 1.5}
    with pytest.raises(InvalidReport, match="TensorFlow"):
        store.save(3, {}, {"model": object()})


def test_a_checkpoint_left_half_replaced_still_restores(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "torch")
    store.save(1, {"val_loss": 1.0}, {"n": torch.tensor(1)})
    # A crash between moving the old one aside and moving the new one in.
    (tmp_path / "user").rename(tmp_path / "user.previous")
    saved = store.latest(tmp_path / "copy")
    assert saved is not None and saved.step == 1


def test_a_prune_arrives_through_the_next_report(tmp_path: Path) -> None:
    session = Session()
    ctx = context(tmp_path, session)
    ctx.report(1, {"val_loss": 1.0})
    session.stop = PRUNE
    assert ctx.should_stop()
    with pytest.raises(TrialPruned) as raised:
        ctx.report(2, {"val_loss": 0.9})
    assert raised.value.step == 1
    assert ctx.stop_reason == PRUNE


def test_a_shutdown_raises_trial_stopped_at_the_report_that_sees_it(tmp_path: Path) -> None:
    session = Session()
    ctx = context(tmp_path, session)
    session.stop = SHUTDOWN
    with pytest.raises(TrialStopped):
        ctx.report(1, {"val_loss": 1.0})
    # The report itself went out first: its checkpoint is the one to resume from.
    assert ("progress", 1, {"val_loss": 1.0}) in session.events


def test_another_rank_neither_reports_nor_checkpoints_nor_exports(tmp_path: Path) -> None:
    session = Session()
    ctx = context(tmp_path, session, rank=1)
    ctx.report(1, {"val_loss": 1.0}, checkpoint={"x": torch.tensor(1)})
    ctx.export(nn.Linear(4, 2), np.zeros((2, 4), np.float32))
    assert session.events == []
    assert not (tmp_path / "checkpoints" / "user").exists()
    assert ctx.export_request is None


class TwoRanks:
    """Two ranks' sessions whose ``agree`` meets as an all-reduce does: each
    call waits for the other rank's and returns the chief's flag."""

    def __init__(self) -> None:
        self._met = threading.Barrier(2, timeout=10)
        self._flag = NO_STOP
        self.chief_waiting = threading.Event()

    def session(self, rank: int) -> Session:
        session = Session()
        session.agree = functools.partial(self._agree, rank)  # type: ignore[method-assign]
        return session

    def _agree(self, rank: int, flag: int) -> int:
        if rank == 0:
            self._flag = flag
            self.chief_waiting.set()
        self._met.wait()
        chosen = self._flag
        self._met.wait()  # both read it before the next call sets it
        return chosen


def slow_loop(ctx: aistack.TrialContext) -> list[int]:
    """A loop without collectives of its own: one report an epoch."""
    saved = ctx.restore()
    start = saved.step + 1 if saved is not None else 1
    for step in range(start, 4):
        ctx.report(step, {"val_loss": 1.0 / step}, checkpoint={"step": step})
    return list(range(start, 4))


def test_a_rank_that_restores_late_restores_what_the_chief_did(tmp_path: Path) -> None:
    # The chief's first report waits for every rank's: a rank that reached
    # restore() after the chief had saved step 1 of this run resumed from it,
    # reported two steps to the chief's three, and both hung at the last
    # report (under torchrun on a loaded machine).
    ranks = TwoRanks()
    shared = {"checkpoint_dir": tmp_path / "checkpoints", "world_size": 2}
    chief = context(tmp_path, ranks.session(0), rank=0, **shared)
    done: list[list[int]] = []
    thread = threading.Thread(target=lambda: done.append(slow_loop(chief)))
    thread.start()
    assert ranks.chief_waiting.wait(30)
    other = context(tmp_path, ranks.session(1), rank=1, **shared)
    steps = slow_loop(other)
    thread.join(30)
    assert done == [[1, 2, 3]] and steps == [1, 2, 3]
    assert chief.last_step == other.last_step == 3


def train(ctx: aistack.TrialContext) -> dict[str, float]:
    torch.manual_seed(ctx.seed)
    model = ctx.prepare_model(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=float(ctx.params["lr"]))
    loss_fn = nn.CrossEntropyLoss()
    start = 1
    if (saved := ctx.restore()) is not None:
        model.load_state_dict(saved.state()["model"])
        start = saved.step + 1
    for epoch in range(start, ctx.epochs + 1):
        for x, y in ctx.data_loader("train", batch_size=8):
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        with torch.no_grad():
            val = float(
                loss_fn(model(torch.as_tensor(ctx.data.x_val)), torch.as_tensor(ctx.data.y_val))
            )
        ctx.report(epoch, {"val_loss": val}, checkpoint={"model": model.state_dict()})
    ctx.export(model, ctx.data.x_val[:3])
    return {"test_loss": 0.5}


def test_a_loop_runs_locally_resumes_and_exports(tmp_path: Path) -> None:
    reports: list[tuple[int, float]] = []

    def report(step: int, metrics: Mapping[str, float]) -> None:
        reports.append((step, metrics["val_loss"]))

    checkpoints = tmp_path / "checkpoints"
    first = local.run(
        train,
        params={"lr": 0.1},
        data=dataset(),
        objective="val_loss",
        epochs=2,
        report=report,
        checkpoint_dir=checkpoints,
        export_dir=tmp_path / "model",
    )
    assert first.step == 2 and not first.stopped
    assert first.metrics["test_loss"] == 0.5
    assert first.exported is not None and first.exported.format == "torch_export"
    assert first.exported.inputs == (("input", "FP32", (-1, 4)),)
    assert first.exported.outputs == (("output", "FP32", (-1, 2)),)
    program = torch.export.load(str(tmp_path / "model" / "model.pt2")).module()
    assert program(torch.zeros(5, 4)).shape == (5, 2)
    again = local.run(
        train,
        params={"lr": 0.1},
        data=dataset(),
        objective="val_loss",
        epochs=4,
        report=report,
        checkpoint_dir=checkpoints,
    )
    assert again.step == 4
    assert [step for step, _ in reports] == [1, 2, 3, 4]


def test_a_local_report_callback_can_prune(tmp_path: Path) -> None:
    result = local.run(
        train,
        params={"lr": 0.1},
        data=dataset(),
        objective="val_loss",
        epochs=5,
        report=lambda step, metrics: step >= 2,
    )
    assert result.stopped and result.step == 2 and result.exported is None
