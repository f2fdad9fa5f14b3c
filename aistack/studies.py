"""Studies as a user writes and reads them: a spec from YAML, JSON or a
dict; a directory of code shipped with one; a study and its trials in
words (what ``aistack study`` prints and ``Client`` returns).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format

from shared import code_packages
from shared.artifacts import ArtifactStore
from shared.contracts.aistack.v1 import common_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.errors import InvalidArgument
from shared.search_space import python_value
from shared.settings import ObjectStoreSettings

BAR_WIDTH = 24
#: Lines of a failed trial's traceback ``describe_study`` shows.
TRACEBACK_SHOWN = 6

Spec = tuning_pb2.StudySpec | Mapping[str, Any] | str | os.PathLike[str]


def load_spec(text: str) -> tuning_pb2.StudySpec:
    """A StudySpec from YAML or JSON text (field names as in the proto, or camelCase)."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InvalidArgument(f"spec is not YAML or JSON: {error}") from error
    return spec_from_dict(document)


def spec_from_dict(document: object) -> tuning_pb2.StudySpec:
    if not isinstance(document, dict):
        raise InvalidArgument("spec must be a mapping of StudySpec fields")
    try:
        return json_format.ParseDict(document, tuning_pb2.StudySpec())
    except json_format.ParseError as error:
        raise InvalidArgument(f"spec does not match StudySpec: {error}") from error


def spec_of(spec: Spec) -> tuning_pb2.StudySpec:
    """A StudySpec from a message, a mapping, a path to a YAML or JSON file,
    or YAML or JSON text."""
    if isinstance(spec, tuning_pb2.StudySpec):
        copy = tuning_pb2.StudySpec()
        copy.CopyFrom(spec)
        return copy
    if isinstance(spec, Mapping):
        return spec_from_dict(dict(spec))
    if isinstance(spec, os.PathLike):
        return load_spec(Path(spec).read_text())
    if "\n" not in spec and spec.endswith((".yaml", ".yml", ".json")) and Path(spec).is_file():
        return load_spec(Path(spec).read_text())
    return load_spec(spec)


def ship_code(
    directory: Path, artifact_root: str, object_store: ObjectStoreSettings | None = None
) -> common_pb2.CodePackage:
    """Pack ``directory`` (``shared.code_packages``) and store the archive in
    the artifact store under its digest (once: the same files, the same
    object); what a study's task names to get it to the trainers.
    ``object_store``: how to reach an ``s3://`` root (None: the environment's)."""
    packed = code_packages.pack(directory)
    store = ArtifactStore(artifact_root, object_store)
    if store.exists(packed.key):
        uri = store.uri(packed.key)
    else:
        uri = store.put_bytes(packed.data, packed.key)
    return common_pb2.CodePackage(
        uri=uri, sha256=packed.sha256, size_bytes=len(packed.data), name=packed.name
    )


def with_code(spec: tuning_pb2.StudySpec, package: common_pb2.CodePackage) -> tuning_pb2.StudySpec:
    """``spec`` whose task names ``package``."""
    shipped = tuning_pb2.StudySpec()
    shipped.CopyFrom(spec)
    shipped.task.code.CopyFrom(package)
    return shipped


# ---- in words ----


@dataclass(frozen=True)
class StudyProgress:
    """A watched study at one moment: trials finished of its budget, trials
    per state, and its best so far ("" before any completed trial)."""

    finished: int
    total: int
    counts: tuple[tuple[str, int], ...]
    best: str

    def text(self) -> str:
        """``requested 1  running 3  completed 5 ... best 0.0123 (trial 4)``."""
        parts = [f"{name} {count}" for name, count in self.counts]
        if self.best:
            parts.append(self.best)
        return "  ".join(parts)

    def line(self) -> str:
        """``[#####.....] 5/16  requested 1 ...``: one line of plain text."""
        filled = round(BAR_WIDTH * self.finished / self.total) if self.total else 0
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        return f"[{bar}] {self.finished}/{self.total}  {self.text()}"


def progress_of(trials: Iterable[api.Trial], total: int, maximize: bool) -> StudyProgress:
    listed = list(trials)
    counts = Counter(
        api.TrialState.Name(t.state).removeprefix("TRIAL_STATE_").lower() for t in listed
    )
    finished = sum(counts[s] for s in ("completed", "pruned", "failed", "quarantined"))
    states = ("requested", "running", "completed", "pruned", "failed", "quarantined")
    done = [t for t in listed if t.state == api.TRIAL_STATE_COMPLETED and t.HasField("value")]
    best = ""
    if done:
        top = (max if maximize else min)(done, key=lambda t: t.value)
        best = f"best {top.value:.6g} (trial {top.number})"
    return StudyProgress(finished, total, tuple((s, counts[s]) for s in states), best)


def progress_line(trials: Iterable[api.Trial], total: int, maximize: bool) -> str:
    """``[#####.....] 5/16  requested 1  running 3  completed 5 ... best 0.0123 (trial 4)``."""
    return progress_of(trials, total, maximize).line()


class Progress:
    """A watched study's progress: a new line only when a trial's state (or the
    best) changes; an epoch's intermediate value is an update too, not a change."""

    def __init__(self, total: int, maximize: bool) -> None:
        self._total = total
        self._maximize = maximize
        self._trials: dict[int, api.Trial] = {}
        self._line = ""
        self.now = progress_of([], total, maximize)

    def update(self, trial: api.Trial) -> str | None:
        """The new line, or None when nothing a person would see changed
        (``now`` holds the progress either way)."""
        self._trials[trial.number] = trial
        self.now = progress_of(self._trials.values(), self._total, self._maximize)
        line = self.now.line()
        if line == self._line:
            return None
        self._line = line
        return line


def describe_trial(trial: api.Trial) -> str:
    params = ", ".join(
        f"{name}={getattr(v, v.WhichOneof('kind') or 'float_value')}"
        for name, v in sorted(trial.params.items())
    )
    value = f"{trial.value:.6g}" if trial.HasField("value") else "-"
    state = api.TrialState.Name(trial.state).removeprefix("TRIAL_STATE_").lower()
    model = f"; model {trial.model_name}@{trial.model_version}" if trial.model_version else ""
    return f"trial {trial.number} ({state}): value {value}; {params}{model}"


def describe_failure(trial: api.Trial) -> list[str]:
    """A failed or quarantined trial: its last error and the last lines of
    its traceback, indented under the trial's line."""
    lines = [describe_trial(trial)]
    if trial.errors:
        lines.append(f"    {trial.errors[-1]}")
    if trial.traceback:
        lines += [f"      {line}" for line in trial.traceback.splitlines()[-TRACEBACK_SHOWN:]]
    return lines


def describe_study(study: api.Study, trials: Iterable[api.Trial] = ()) -> str:
    """The study's state, counts and best trial; why it failed; and each
    failed or quarantined trial of ``trials`` with its reason."""
    counts = ", ".join(f"{k} {v}" for k, v in sorted(study.trial_counts.items())) or "no trials"
    lines = [f"study {study.study_id}: {api.StudyState.Name(study.state)}; {counts}"]
    if study.error:
        lines.append(f"failed: {study.error}")
    if study.HasField("best_trial"):
        lines.append("best: " + describe_trial(study.best_trial))
    failed = [
        t
        for t in trials
        if t.state in (api.TRIAL_STATE_FAILED, api.TRIAL_STATE_QUARANTINED) and t.errors
    ]
    if failed:
        lines.append("failed trials:")
        for trial in failed:
            lines += [f"  {line}" for line in describe_failure(trial)]
    return "\n".join(lines)


def describe_replay(replayed: api.ReplayStudyResponse) -> list[str]:
    """One line per trial (its logged parameters, and the replayed ones where
    they differ), then the verdict."""
    lines = []
    for trial in replayed.trials:
        state = api.TrialState.Name(trial.state).removeprefix("TRIAL_STATE_").lower()
        how = "enqueued" if trial.enqueued else "sampled"
        logged = _params(trial.logged_params)
        if trial.matches:
            lines.append(f"trial {trial.number} ({state}, {how}): logged = replayed: {logged}")
        else:
            replayed_params = _params(trial.replayed_params)
            lines.append(
                f"trial {trial.number} ({state}, {how}): logged {logged} != replayed "
                f"{replayed_params}"
            )
    differ = [str(t.number) for t in replayed.trials if not t.matches]
    if replayed.identical:
        verdict = f"identical: {len(replayed.trials)} trials proposed as logged"
    else:
        verdict = f"differs: trials {', '.join(differ)} proposed otherwise than logged"
    lines.append(f"study {replayed.study_id}: replay {verdict}")
    return lines


def _params(params: Mapping[str, common_pb2.ParamValue]) -> str:
    shown = (f"{name}={python_value(value)!r}" for name, value in sorted(params.items()))
    return ", ".join(shown) or "-"
