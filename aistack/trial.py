"""What a user's training code sees of a trial: its context, its data and its
checkpoints.

A training loop of the user's (``task.entrypoint: "mypkg.train:train"``) is
a function the platform calls once per trial, and once per rank or worker of
a distributed trial, with a ``TrialContext``::

    def train(ctx: aistack.TrialContext) -> None:
        model = ctx.prepare_model(build(ctx.params, ctx.data))
        optimizer = torch.optim.Adam(model.parameters(), lr=ctx.params["lr"])
        start = 1
        if (saved := ctx.restore()) is not None:
            state = saved.state()
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = saved.step + 1
        for epoch in range(start, ctx.epochs + 1):
            for x, y in ctx.data_loader("train", batch_size=64):
                ...
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            ctx.report(epoch, {"val_loss": ...}, checkpoint=state)
        ctx.export(model, ctx.data.x_val[:2])

The contract, the same for a single trial, every rank of a distributed one
and every launcher:

- ``report(step, metrics, checkpoint=...)`` is the one way out: the tuner sees
  every report (the objective's value is what it prunes and ranks by), and a
  checkpoint belongs to the report it comes with: it is written before the
  report leaves, so every step the tuner saw has its checkpoint, and a
  resumed trial never trains again a step the tuner saw. Call it on every
  rank at the same steps (the ranks agree on stopping there).
- A prune or stop arrives through ``report`` (it raises ``TrialPruned`` or
  ``TrialStopped``: let it propagate) or ``should_stop()`` (True), within one
  step of the decision reaching the trainer.
- ``restore()`` hands back the latest checkpoint of a resumed trial (its
  trainer was killed, or the trial was handed back), else None; call it
  before the first report. Every rank restores the same one: the ranks'
  first reports meet before the chief saves anything.
- ``export(model, example)`` is what the model server serves.

Nothing here imports a framework at module level: ``aistack`` stays cheap to
import for a client. The platform implements the ``Session``; ``local`` runs a
loop in this process with a session of its own.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

ParamValue = float | int | str | bool

CLASSIFICATION = "classification"
REGRESSION = "regression"

FRAMEWORK_TORCH = "torch"
FRAMEWORK_TENSORFLOW = "tensorflow"

# A stop request, as ``Session.stop_requested`` and ``Session.agree`` say it:
# nothing, a prune (the pruner judged the trial), a stop (the study ended) or a
# shutdown (the trainer hands the trial back; it resumes elsewhere).
NO_STOP, PRUNE, STOP, SHUTDOWN = 0, 1, 2, 3


class StopTrial(Exception):
    """The trial must end now: let it propagate out of the training function.

    ``step`` is the last step reported."""

    def __init__(self, message: str, *, step: int, reason: int) -> None:
        super().__init__(message)
        self.step = step
        self.reason = reason


class TrialPruned(StopTrial):
    """The tuner's pruner judged the trial unpromising."""


class TrialStopped(StopTrial):
    """The study was stopped, or the trainer is shutting down (the trial is
    handed back and resumes from its last checkpoint elsewhere)."""


class InvalidReport(ValueError):
    """A report the platform cannot use (a missing or non-finite objective, a
    step that does not increase, metrics that are not numbers). ``reason``
    names the rule; the trial fails with it."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ExportFailed(ValueError):
    """The model given to ``export`` cannot be exported for serving (the
    framework's exporter refused it); the trial fails with the reason
    ``export_failed``."""

    reason = "export_failed"


@dataclass(frozen=True)
class ExportRequest:
    """What ``TrialContext.export`` was asked to export; the platform exports
    it once the training function has returned (outside any distribution
    scope, the process group gone)."""

    model: Any
    example: Any
    output_names: tuple[str, ...] = ()


#: One model input or output as the exporters describe it: (name, Open
#: Inference Protocol datatype, shape with -1 for the batch dimension).
TensorDescription = tuple[str, str, tuple[int, ...]]


@dataclass(frozen=True)
class Exported:
    """An exported model: its format ("torch_export", "tf_saved_model") and
    signature."""

    format: str
    inputs: tuple[TensorDescription, ...]
    outputs: tuple[TensorDescription, ...]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A trial's data in fixed splits, as numpy arrays.

    Classification: ``y`` holds int64 class indices in ``[0, n_classes)``
    (``class_names`` says what each was in the source, when it said).
    Regression: ``y`` holds float32 targets. ``x`` is float32, one example per
    row (N, features) or an image per row (N, H, W)."""

    name: str
    version: str
    task: str
    x_train: NDArray[Any]
    y_train: NDArray[Any]
    x_val: NDArray[Any]
    y_val: NDArray[Any]
    x_test: NDArray[Any]
    y_test: NDArray[Any]
    n_classes: int = 0
    feature_names: tuple[str, ...] = ()
    class_names: tuple[str, ...] = ()
    label: str = ""

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One example's shape: (features,) or (H, W)."""
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def n_outputs(self) -> int:
        """The model's output width: the classes, or 1 for a regression."""
        return self.n_classes if self.task == CLASSIFICATION else 1

    def split(self, name: str) -> tuple[NDArray[Any], NDArray[Any]]:
        """(x, y) of "train", "val" or "test"."""
        if name not in ("train", "val", "test"):
            raise ValueError(f"split {name!r}: expected train, val or test")
        return getattr(self, f"x_{name}"), getattr(self, f"y_{name}")


# ---- checkpoints ----

_META = "meta.json"
_TORCH_STATE = "state.pt"
_NUMPY_STATE = "state.npz"
_FILES = "files"


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint ``report`` saved: its step, the metrics reported with it,
    and its files (``directory``, a private copy the loop may read)."""

    step: int
    metrics: Mapping[str, float]
    directory: Path

    def state(self) -> dict[str, Any]:
        """The mapping given as ``report(..., checkpoint=mapping)``: loaded
        with ``torch.load(weights_only=True)`` in a PyTorch trial (tensors,
        numbers, strings and containers of them: no pickled objects), from
        numpy's format in a TensorFlow one. ValueError for a checkpoint that
        was a directory (read ``directory`` then)."""
        if (self.directory / _TORCH_STATE).is_file():
            import torch

            loaded: dict[str, Any] = torch.load(
                self.directory / _TORCH_STATE, map_location="cpu", weights_only=True
            )
            return loaded
        if (self.directory / _NUMPY_STATE).is_file():
            with np.load(self.directory / _NUMPY_STATE, allow_pickle=False) as arrays:
                return _unflatten({name: arrays[name] for name in arrays.files})
        raise ValueError(
            f"the checkpoint of step {self.step} is a directory, not a mapping: "
            f"read its files in {self.directory}"
        )


class CheckpointStore:
    """A trial's user checkpoint in one directory (``root``/``user``),
    replaced whole: a process killed at any moment leaves the previous
    checkpoint or the new one, never half of one."""

    def __init__(self, root: Path, framework: str) -> None:
        self.root = root
        self._framework = framework
        self._current = root / "user"
        self._previous = root / "user.previous"

    def save(self, step: int, metrics: Mapping[str, float], checkpoint: object) -> None:
        staging = self.root / "user.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        if isinstance(checkpoint, str | os.PathLike):
            source = Path(checkpoint)
            if not source.is_dir():
                raise InvalidReport(
                    f"checkpoint {source} is not a directory", reason="invalid_checkpoint"
                )
            shutil.copytree(source, staging / _FILES)
        elif isinstance(checkpoint, Mapping):
            self._save_state(staging, checkpoint)
        else:
            raise InvalidReport(
                f"checkpoint: expected a mapping or a directory, got {type(checkpoint).__name__}",
                reason="invalid_checkpoint",
            )
        meta = {"step": step, "metrics": dict(metrics)}
        (staging / _META).write_text(json.dumps(meta))
        # Old aside, new in, old gone: a crash between the renames leaves the
        # previous checkpoint, which ``latest`` still finds.
        shutil.rmtree(self._previous, ignore_errors=True)
        if self._current.exists():
            os.replace(self._current, self._previous)
        os.replace(staging, self._current)
        shutil.rmtree(self._previous, ignore_errors=True)

    def _save_state(self, staging: Path, state: Mapping[Any, Any]) -> None:
        if self._framework == FRAMEWORK_TORCH:
            import torch

            torch.save(dict(state), staging / _TORCH_STATE)
            return
        try:
            arrays = _flatten(state)
        except (TypeError, ValueError) as exc:
            raise InvalidReport(
                f"checkpoint mapping: {exc} (a TensorFlow trial's checkpoint maps names "
                "to arrays, numbers, or lists and mappings of them)",
                reason="invalid_checkpoint",
            ) from exc
        np.savez(staging / _NUMPY_STATE, **arrays)  # type: ignore[arg-type]

    def latest(self, copy_to: Path) -> Checkpoint | None:
        """The last checkpoint saved, copied into ``copy_to``; None when none
        was (or it cannot be read)."""
        for directory in (self._current, self._previous):
            meta_path = directory / _META
            if not meta_path.is_file():
                continue
            try:
                meta = json.loads(meta_path.read_text())
                step = int(meta["step"])
                metrics = {str(k): float(v) for k, v in dict(meta["metrics"]).items()}
            except (ValueError, KeyError, TypeError):
                continue
            shutil.rmtree(copy_to, ignore_errors=True)
            shutil.copytree(directory, copy_to)
            files = copy_to / _FILES
            return Checkpoint(step, metrics, files if files.is_dir() else copy_to)
        return None


def _flatten(value: Any, prefix: str = "") -> dict[str, NDArray[Any]]:
    if isinstance(value, Mapping):
        out: dict[str, NDArray[Any]] = {}
        for key, item in value.items():
            if not isinstance(key, str) or "/" in key or key.startswith("#"):
                raise ValueError(f"key {key!r}: keys are strings without '/' or a leading '#'")
            out.update(_flatten(item, f"{prefix}{key}/"))
        return out
    if isinstance(value, list | tuple):
        out = {}
        for index, item in enumerate(value):
            out.update(_flatten(item, f"{prefix}#{index}/"))
        return out
    array = np.asarray(value)
    if array.dtype == object:
        raise TypeError(f"{prefix.rstrip('/') or 'value'} is a {type(value).__name__}")
    return {prefix.rstrip("/"): array}


def _unflatten(arrays: Mapping[str, NDArray[Any]]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for name, array in arrays.items():
        parts = name.split("/")
        node = root
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = array[()] if array.ndim == 0 else array
    return _lists(root)  # type: ignore[no-any-return]


def _lists(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    items = {key: _lists(value) for key, value in node.items()}
    if items and all(key.startswith("#") for key in items):
        return [items[f"#{i}"] for i in range(len(items))]
    return items


# ---- where reports go ----


class Session(Protocol):
    """Where a context's reports go and its stop decisions come from: the
    trainer's (implemented by the platform), or a local one (``aistack.local``)."""

    def started(self, resumed_from_step: int) -> None:
        """The loop began; from after ``resumed_from_step`` when it restored."""

    def progress(self, step: int, metrics: Mapping[str, float]) -> None:
        """The chief's report of ``step`` (its checkpoint is written)."""

    def stop_requested(self) -> int:
        """NO_STOP, PRUNE, STOP or SHUTDOWN: asked by the chief, cheap."""

    def agree(self, flag: int) -> int:
        """Called by every rank at once: the chief's ``flag`` on all of them
        (the identity for one process)."""


@dataclass
class _Reported:
    step: int = -1
    metrics: dict[str, float] = field(default_factory=dict)


class TrialContext:
    """The trial as the user's training function sees it (see the module
    docstring). Built by the platform (or ``aistack.local``); the framework's
    helpers come from ``TorchContext`` or ``TensorFlowContext``."""

    framework = ""

    def __init__(
        self,
        *,
        session: Session,
        params: Mapping[str, ParamValue],
        data: Dataset,
        checkpoint_dir: Path,
        scratch_dir: Path,
        objective: str = "",
        trial_id: str = "local/0",
        study_id: str = "local",
        trial_number: int = 0,
        attempt: int = 1,
        seed: int = 0,
        epochs: int = 0,
        options: Mapping[str, str] | None = None,
        strategy: str = "",
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.params: Mapping[str, ParamValue] = dict(params)
        self.data = data
        self.objective = objective
        self.trial_id = trial_id
        self.study_id = study_id
        self.trial_number = trial_number
        self.attempt = attempt
        self.seed = seed
        #: The epochs the study's task asks for (0: the loop decides).
        self.epochs = epochs
        self.options: Mapping[str, str] = dict(options or {})
        self.strategy = strategy
        self.rank = rank
        self.world_size = world_size
        self._session = session
        self._checkpoints = CheckpointStore(checkpoint_dir, self.framework)
        self._restored_dir = scratch_dir / f"restored-{rank}"
        self._reported = _Reported()
        self._began = False
        self._restored: Checkpoint | None = None
        #: Set when a stop was raised (or seen): the trial ends stopped.
        self.stop_reason = NO_STOP
        #: Set when a report broke the rules: the trial fails with it.
        self.fault: InvalidReport | None = None
        #: What the chief was asked to export, once ``export`` ran.
        self.export_request: ExportRequest | None = None

    # ---- who and where ----

    @property
    def is_chief(self) -> bool:
        """The one process that reports, checkpoints and exports."""
        return self.rank == 0

    @property
    def last_step(self) -> int:
        """The last step reported (-1: none)."""
        return self._reported.step

    @property
    def last_metrics(self) -> Mapping[str, float]:
        return dict(self._reported.metrics)

    # ---- the contract ----

    def restore(self) -> Checkpoint | None:
        """The latest checkpoint of this trial (a resumed trial's), else None.
        Call it before the first report."""
        if self._restored is None:
            self._restored = self._checkpoints.latest(self._restored_dir)
        self._begin()
        return self._restored

    def report(self, step: int, metrics: Mapping[str, float], *, checkpoint: object = None) -> None:
        """Report ``metrics`` at ``step`` (a whole number that increases from
        one report to the next: an epoch, a batch), with a checkpoint to
        resume from: a mapping (``Checkpoint.state`` loads it back) or a
        directory (its files are copied). The study's objective metric must be
        among the metrics and finite.

        Raises TrialPruned or TrialStopped when the trial must end (let it
        propagate), InvalidReport for a report the platform cannot use."""
        self._begin()
        if self.stop_reason != NO_STOP:
            self._raise_stop()
        if self._reported.step < 0 and self.world_size > 1:
            # Every rank has restored by its first report; the chief saves
            # nothing of this run before they all have. A rank that reached
            # restore() after the chief's first save resumed from it and
            # reported one step fewer: the ranks hung at the last report.
            self._session.agree(NO_STOP)
        try:
            clean = self._check(step, metrics)
            if self.is_chief:
                if checkpoint is not None:
                    self._checkpoints.save(step, clean, checkpoint)
                self._session.progress(step, clean)
        except InvalidReport as fault:
            self.fault = fault
            raise
        self._reported = _Reported(step, clean)
        self._stop_if_asked()

    def should_stop(self) -> bool:
        """Whether the trial must end now (a prune, a stop, a shutdown): ask it
        between batches to end sooner than the next report. Every rank must
        ask it at the same points."""
        self._begin()
        if self.stop_reason == NO_STOP:
            asked = self._session.stop_requested() if self.is_chief else NO_STOP
            self.stop_reason = self._session.agree(asked)
        return self.stop_reason != NO_STOP

    def export(self, model: Any, example: Any, *, output_names: tuple[str, ...] = ()) -> None:
        """Export ``model`` for the model server, traced on ``example`` (a
        batch of inputs; its first dimension is the batch) once the training
        function returns; the chief's call counts, the others' are ignored.
        The input is named "input", the outputs ``output_names`` (default:
        "output", or the keys of a mapping the model returns). Without a
        call, the trial completes with its metrics and no model."""
        if self.is_chief:
            self.export_request = ExportRequest(model, example, tuple(output_names))

    # ---- framework helpers (TorchContext, TensorFlowContext) ----

    @property
    def device(self) -> Any:
        """Where this rank computes (a torch.device; a TensorFlow device name)."""
        raise NotImplementedError

    def prepare_model(self, model: Any) -> Any:
        """``model`` placed for this rank: on its device, wrapped for data
        parallelism when the trial has several ranks."""
        raise NotImplementedError

    def prepare_data_loader(self, loader: Any) -> Any:
        """``loader`` sharded for this rank (a DistributedSampler, a
        distributed dataset), its batches on the device."""
        raise NotImplementedError

    def data_loader(
        self, split: str = "train", *, batch_size: int = 32, shuffle: Any = None
    ) -> Any:
        """A prepared loader over one of ``data``'s splits (shuffled: train
        only, unless ``shuffle`` says)."""
        raise NotImplementedError

    # ---- inside ----

    def _begin(self) -> None:
        if not self._began:
            self._began = True
            restored = self._restored
            if self.is_chief:
                self._session.started(restored.step if restored is not None else 0)

    def _check(self, step: object, metrics: Mapping[str, float]) -> dict[str, float]:
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise InvalidReport(
                f"report step {step!r}: expected a whole number >= 0", reason="invalid_report"
            )
        floor = max(self._reported.step, self._restored.step if self._restored else -1)
        if step <= floor:
            raise InvalidReport(
                f"report step {step} after step {floor}: steps must increase",
                reason="invalid_report",
            )
        if not isinstance(metrics, Mapping):
            raise InvalidReport(
                f"report metrics: expected a mapping, got {type(metrics).__name__}",
                reason="invalid_report",
            )
        clean: dict[str, float] = {}
        for name, value in metrics.items():
            try:
                clean[str(name)] = float(value)
            except (TypeError, ValueError):
                raise InvalidReport(
                    f"report metric {name!r}={value!r}: expected a number",
                    reason="invalid_report",
                ) from None
        if self.objective:
            if self.objective not in clean:
                raise InvalidReport(
                    f"report at step {step} has no {self.objective!r} (the study's objective); "
                    f"it has {sorted(clean)}",
                    reason="unknown_metric",
                )
            if not math.isfinite(clean[self.objective]):
                raise InvalidReport(
                    f"{self.objective}={clean[self.objective]} at step {step}: the objective "
                    "must be a finite number (did the loss diverge?)",
                    reason="nan_metric",
                )
        return clean

    def _stop_if_asked(self) -> None:
        asked = self._session.stop_requested() if self.is_chief else NO_STOP
        self.stop_reason = self._session.agree(asked)
        if self.stop_reason != NO_STOP:
            self._raise_stop()

    def _raise_stop(self) -> None:
        step = self._reported.step
        if self.stop_reason == PRUNE:
            raise TrialPruned(f"the trial was pruned after step {step}", step=step, reason=PRUNE)
        what = "the trainer is shutting down" if self.stop_reason == SHUTDOWN else "stopped"
        raise TrialStopped(
            f"the trial was stopped after step {step} ({what})",
            step=step,
            reason=self.stop_reason,
        )
