"""A TensorFlow trial's checkpoints: model, optimizer and epoch counter in
``spec.checkpoint_dir``, restored from the last readable one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from shared.log import get_logger

log = get_logger("svc_trainer")

CHECKPOINTS_KEPT = 2
_CHECKPOINT_NAME = "ckpt"


class Checkpoints:
    """The trial's checkpoints: model, optimizer and epoch counter, the last
    ``CHECKPOINTS_KEPT`` epochs.

    ``restore`` never raises for bad files: it tries the newest checkpoint,
    then older ones, puts unreadable ones aside in ``corrupt/`` and falls
    back to the initial weights (epoch 0)."""

    def __init__(self, directory: Path, model: Any, optimizer: Any) -> None:
        import tensorflow as tf

        self.directory = directory
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch)
        self._variables = [*model.variables, *optimizer.variables, self.epoch]
        directory.mkdir(parents=True, exist_ok=True)
        self._state_unreadable = False
        try:
            self._manager = self._new_manager()
        except Exception as exc:  # the manager parses the state file: it may be garbage
            log.warning("tf.checkpoint.state_unreadable", path=str(directory), error=repr(exc))
            self._state_unreadable = True
            self._quarantine([], state_file=True)

    def _new_manager(self) -> Any:
        import tensorflow as tf

        return tf.train.CheckpointManager(
            self._checkpoint,
            str(self.directory),
            max_to_keep=CHECKPOINTS_KEPT,
            checkpoint_name=_CHECKPOINT_NAME,
        )

    def _candidates(self) -> list[str]:
        """Newest first: the manager's latest, then every ckpt-N on disk (the
        state file may itself be what is corrupt)."""
        found: list[tuple[int, str]] = []
        pattern = re.compile(rf"{_CHECKPOINT_NAME}-(\d+)\.index")
        for entry in self.directory.iterdir():
            if match := pattern.fullmatch(entry.name):
                found.append((int(match.group(1)), str(self.directory / entry.stem)))
        paths = [p for _, p in sorted(found, reverse=True)]
        latest = self._manager.latest_checkpoint
        if latest and latest in paths:
            paths.remove(latest)
        return [latest, *paths] if latest else paths

    def restore(self) -> tuple[int, str]:
        """(the restored epoch, a note when a checkpoint was not usable)."""
        candidates = self._candidates()
        if not candidates:
            note = "checkpoint state unreadable; starting over" if self._state_unreadable else ""
            return 0, note
        initial = [np.array(v.numpy()) for v in self._variables]
        bad: list[str] = []
        for path in candidates:
            try:
                self._checkpoint.read(path).assert_existing_objects_matched()
                step = int(self.epoch.numpy())
            except Exception as exc:  # any unreadable or foreign file: never crash on it
                log.warning("tf.checkpoint.unreadable", path=path, error=repr(exc)[:500])
                bad.append(Path(path).name)
                for variable, value in zip(self._variables, initial, strict=True):
                    variable.assign(value)
                continue
            if bad:
                self._quarantine(bad)
            unreadable = [*bad, *(["the state file"] if self._state_unreadable else [])]
            if unreadable:
                return step, f"checkpoint {', '.join(unreadable)} unreadable; resumed from {path}"
            return step, ""
        self._quarantine(bad, state_file=True)
        return 0, f"checkpoint {', '.join(bad)} unreadable (corrupt?); starting over from epoch 0"

    def _quarantine(self, names: list[str], state_file: bool = False) -> None:
        aside = self.directory / "corrupt"
        aside.mkdir(exist_ok=True)
        for entry in list(self.directory.iterdir()):
            prefix = entry.name.split(".", 1)[0]
            if prefix in names or (state_file and entry.name == "checkpoint"):
                entry.replace(aside / entry.name)
        self._manager = self._new_manager()

    def save(self, step: int) -> None:
        self.epoch.assign(step)
        self._manager.save(checkpoint_number=step)
