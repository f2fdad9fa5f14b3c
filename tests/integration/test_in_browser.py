"""What a person looks at, opened in headless Chromium: a demo run's report
(a file, no network), optuna-dashboard (the tuner's own entry point, on its
journal in a real Redis) and TensorBoard (on runs the trainer's writer
wrote); each chart drew data, not an empty frame."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from compose.processes import port_open
from shared.ports import free_ports
from tests.browser import chromium, plotly_plots, rendered
from tests.infra import Infra, wait_until
from tests.reports import figures, full_demo_report

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def process(argv: list[str], env: dict[str, str], port: int, log: Path) -> Iterator[None]:
    """``argv`` running until the block ends, once it answers on ``port``."""
    with log.open("w") as out:
        started = subprocess.Popen(
            argv, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=out
        )
    try:
        wait_until(
            lambda: port_open("127.0.0.1", port) or started.poll() is not None, 90, f"{argv[2]} up"
        )
        assert started.poll() is None, log.read_text()[-3000:]
        yield
    finally:
        started.terminate()
        started.wait(30)


def test_the_demos_report_draws_every_figure_with_its_data(tmp_path: Path) -> None:
    chromium()
    path = full_demo_report(tmp_path)
    embedded = figures(path.read_text())
    dom = rendered(path.as_uri())
    plots = plotly_plots(dom)
    # Every figure the page embeds was drawn (plotly.js ran, from the page
    # itself) with traces and their points or lines, not an empty frame.
    assert len(plots) == len(embedded) == 7
    assert all(plot.traces and (plot.points or plot.lines) for plot in plots), plots
    assert "prediction p" in dom and "model m@1" in dom  # the lineage tree


def test_optuna_dashboard_draws_the_tuners_study(infra: Infra, unique: str, tmp_path: Path) -> None:
    chromium()
    import optuna

    from svc_tuner.storage import redis_storage

    prefix = f"browser:{unique}"
    study = optuna.create_study(
        storage=redis_storage(infra.redis, prefix),
        study_name=f"seen-{unique}",
        sampler=optuna.samplers.RandomSampler(seed=0),
    )

    def objective(trial: optuna.Trial) -> float:
        x, y = trial.suggest_float("x", -3, 3), trial.suggest_int("y", 0, 4)
        for step in range(3):
            trial.report((x - 1) ** 2 + y + 1 / (step + 1), step)
        return (x - 1) ** 2 + y

    study.optimize(objective, n_trials=8)
    (port,) = free_ports(1)
    env = {
        "AISTACK_REDIS_URL": infra.redis.url,
        "AISTACK_TUNER_STORAGE_PREFIX": prefix,
        "AISTACK_TUNER_DASHBOARD_PORT": str(port),
    }
    argv = [sys.executable, "-m", "svc_tuner.dashboard"]
    with process(argv, env, port, tmp_path / "dashboard.log"):
        dom = rendered(f"http://127.0.0.1:{port}/dashboard/studies/{study._study_id}")
    assert f"seen-{unique}" in dom
    plots = plotly_plots(dom)
    # History, importances, intermediate values, the parameters' slices.
    assert len(plots) >= 3, plots
    assert all(plot.traces and (plot.points or plot.lines) for plot in plots), plots
    assert max(plot.points for plot in plots) >= 8  # a point per trial, at least


def test_tensorboard_draws_the_trials_runs(tmp_path: Path) -> None:
    chromium()
    from svc_trainer.tensorboard import TrialBoard

    for trial, rate in (("trial-0", 0.1), ("trial-1", 0.01)):
        board = TrialBoard(tmp_path / "runs" / trial, trial, {"lr": rate}, ("val_loss",))
        for epoch in range(1, 6):
            board.epoch(epoch, {"val_loss": 1 / (epoch * rate * 100)})
        board.close()
    (port,) = free_ports(1)
    argv = [
        sys.executable,
        "-m",
        "tensorboard.main",
        f"--logdir={tmp_path / 'runs'}",
        "--host=127.0.0.1",
        f"--port={port}",
    ]
    with process(argv, {}, port, tmp_path / "tensorboard.log"):
        dom = rendered(f"http://127.0.0.1:{port}/?darkMode=false#timeseries")
    # The val_loss card, its chart drawn, and under it each run's last point:
    # run, smoothed, value, step.
    assert "val_loss" in dom and "<line-chart" in dom
    table = dom[dom.index("scalar-card-data-table") :]
    text = " ".join(re.sub(r"<[^>]+>", " ", table).split())
    assert re.search(r"trial-0 \S+ 0\.02 5 ", text), text[:500]
    assert re.search(r"trial-1 \S+ 0\.2 5 ", text), text[:500]
