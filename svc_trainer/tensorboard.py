"""One TensorBoard run per trial, with the HParams plugin's records.

Written by the worker from what the run reports, so PyTorch and TensorFlow
trials log the same way (and the worker never imports TensorFlow for it).
Open with ``tensorboard --logdir <AISTACK_TRAINER_TENSORBOARD_DIR>/<study>``:
the HPARAMS tab lists every trial with its parameters and metrics. Where
that is a URL (``s3://…``), the run is written locally and ``mirror`` sends
it there after each epoch and at the end; ``python -m svc_trainer.tensorboard
--logdir s3://… --load_fast=false`` is TensorBoard reading it there (its own
S3 reader, boto3's, configured by ``shared.object_store.boto3_env``: the
TensorFlow build installed beside it reads no ``s3://``).
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable, Mapping
from pathlib import Path

# TensorBoard's writers reach the filesystem through ``tensorboard.compat.tf``,
# which imports TensorFlow when it is installed (seconds, and half a gigabyte,
# in the worker) unless the marker module ``tensorboard.compat.notf`` exists;
# then they use TensorBoard's own stub.
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))

from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: E402
from tensorboard.plugins.hparams import summary_v2 as hparams  # noqa: E402
from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: E402

from svc_trainer.plan import ParamScalar  # noqa: E402


class TrialBoard:
    def __init__(
        self,
        run_dir: Path,
        trial_id: str,
        params: Mapping[str, ParamScalar],
        metrics: tuple[str, ...],
        mirror: Callable[[Path], None] | None = None,
    ) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self._mirror = mirror
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
        if self._mirror is not None:
            self._mirror(self.run_dir)

    def close(self) -> None:
        self._writer.close()
        if self._mirror is not None:
            self._mirror(self.run_dir)

    def _write(self, summary: summary_pb2.Summary, step: int) -> None:
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))


if __name__ == "__main__":
    from tensorboard.main import run_main

    run_main()
