"""One TensorBoard run per trial, with the HParams plugin's records.

Written by the worker from what the run reports, so PyTorch and TensorFlow
trials log the same way (and the worker never imports TensorFlow for it).
Open with ``tensorboard --logdir <AISTACK_TRAINER_TENSORBOARD_DIR>/<study>``:
the HPARAMS tab lists every trial with its parameters and metrics.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from svc_trainer.plan import ParamScalar


class TrialBoard:
    def __init__(
        self,
        run_dir: Path,
        trial_id: str,
        params: Mapping[str, ParamScalar],
        metrics: tuple[str, ...],
    ) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self._writer = EventFileWriter(str(run_dir))
        config = hparams.hparams_config_pb(
            hparams=[hparams.HParam(name) for name in sorted(params)],
            metrics=[hparams.Metric(name) for name in metrics],
        )
        self._write(config, step=0)
        self._write(hparams.hparams_pb(dict(params), trial_id=trial_id), step=0)

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        values = [
            summary_pb2.Summary.Value(tag=name, simple_value=float(value))
            for name, value in sorted(metrics.items())
            if value == value  # NaN: not measured this epoch
        ]
        self._write(summary_pb2.Summary(value=values), step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def _write(self, summary: summary_pb2.Summary, step: int) -> None:
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
