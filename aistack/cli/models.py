"""``aistack models``: the model registry (``aistack.models.ready``) for
people: list a model's versions, fetch one's verified artifact, register a
model trained elsewhere (``aistack.models``)."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer

from aistack import models
from aistack.cli import terminal
from aistack.settings import ClientSettings
from shared import model_registry
from shared.contracts.aistack.v1 import common_pb2, monitoring_pb2
from shared.errors import InvalidArgument
from shared.model_signatures import parse_tensor
from shared.settings import ServingSettings, load_settings

_DIRECTIONS = {"minimize": common_pb2.DIRECTION_MINIMIZE, "maximize": common_pb2.DIRECTION_MAXIMIZE}

app = typer.Typer(help="The model registry: list, fetch, register.", no_args_is_help=True)


@app.command("list")
def list_versions(name: Annotated[str | None, typer.Argument()] = None) -> int:
    """A model's versions (every model's without a name): which serves, which challenge it."""
    return _list(load_settings(ClientSettings), name)


@app.command()
def fetch(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL[@VERSION]", help="default version: the one served (AISTACK_MODEL_POLICY)"
        ),
    ],
    into: Annotated[str, typer.Option(help="a directory for the copy")],
) -> int:
    """A version's artifact, its sha256 checked."""
    name, _, version = model.partition("@")
    directory = models.fetch(load_settings(ClientSettings), name, version, Path(into))
    print(f"{name}: {directory}")
    return 0


@app.command()
def challenge(
    model: Annotated[str, typer.Argument(metavar="MODEL@VERSION")],
    off: Annotated[bool, typer.Option("--off", help="no longer a challenger")] = False,
) -> int:
    """Run a version in the serving version's shadow (a share of its requests, off the
    request path, both predictions logged), or stop with --off."""
    name, _, version = model.partition("@")
    if not version:
        raise InvalidArgument(f"{model!r}: name the version, as MODEL@VERSION")
    event = models.challenge(load_settings(ClientSettings), name, version, on=not off)
    state = "no longer a challenger" if off else "a challenger: it runs in the serving one's shadow"
    print(f"{event.model_name}@{event.version}: {state}")
    return 0


Repeated = Annotated[list[str] | None, typer.Option(metavar="NAME:DATATYPE:DIMS")]


@app.command()
def register(
    name: str,
    artifact: Annotated[
        str,
        typer.Option(
            help="a torch.export program (.pt2), a TorchScript file (.pt) or a SavedModel "
            "directory; a path or an fsspec URL"
        ),
    ],
    input: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            metavar="NAME:DATATYPE:DIMS",
            help="an input, e.g. input:FP32:-1,30 (read from the artifact unless TorchScript)",
        ),
    ] = None,
    output: Repeated = None,
    metric: Annotated[
        list[str] | None, typer.Option(metavar="NAME=VALUE", help="e.g. val_error=0.03")
    ] = None,
    objective: Annotated[
        str | None,
        typer.Option(
            metavar="METRIC:minimize|maximize",
            help="what its versions compete on for the champion's place (its value among --metric)",
        ),
    ] = None,
    label: Annotated[list[str] | None, typer.Option(metavar="KEY=VALUE")] = None,
    dataset: Annotated[str, typer.Option(help="where its training data came from")] = "",
    feature: Annotated[
        str | None,
        typer.Option(
            metavar="METRIC@WINDOW",
            help="the online-store field it reads by entity (e.g. temperature@tumbling-60s): its "
            "windows in the offline store (AISTACK_TRAINER_FEATURES_PATH) become its training "
            "distribution, which svc_monitor watches",
        ),
    ] = None,
    windows_from: Annotated[
        str, typer.Option(metavar="RFC3339", help="the first training window's start")
    ] = "",
    windows_to: Annotated[
        str, typer.Option(metavar="RFC3339", help="the last training window's start")
    ] = "",
) -> int:
    """Register a model trained elsewhere as the next version of NAME (served, scored and
    watched like a trained one)."""
    settings = load_settings(ClientSettings)
    reference = None
    if feature:
        from shared.offline_store import training_distribution

        bounds = (_moment(windows_from, "--windows-from"), _moment(windows_to, "--windows-to"))
        reference = training_distribution(
            settings.features_path(), feature, bounds, settings.lineage.object_store
        )
    with tempfile.TemporaryDirectory(prefix="aistack-artifact-") as scratch:
        event = models.register(
            settings,
            models.Registration(
                name=name,
                artifact=_local(artifact, Path(scratch)),
                inputs=[parse_tensor(text) for text in input or []],
                outputs=[parse_tensor(text) for text in output or []],
                metrics=dict(_metric(text) for text in metric or []),
                objective=_objective(objective) if objective else None,
                labels=dict(_pair(text, "--label") for text in label or []),
                dataset=dataset,
                training_distribution=reference,
            ),
        )
    signature = ", ".join(
        f"{s.name} {s.datatype} {list(s.shape)}" for s in (*event.inputs, *event.outputs)
    )
    print(
        f"registered {event.model_name} version {event.version}: sha256 {event.sha256} "
        f"at {event.artifact_uri} ({signature})"
    )
    if reference is not None:
        windows = max((s.windows for s in reference.statistics), default=0)
        print(f"watched on {reference.feature}: the distribution of {windows} training windows")
    return 0


def _list(settings: ClientSettings, name: str | None) -> int:
    from shared import live_performance, model_registry
    from shared.errors import Unavailable

    lineage = settings.lineage
    registry = model_registry.read(lineage.kafka, lineage.models_topic, lineage.timeout_seconds)
    try:
        live = live_performance.read(
            lineage.kafka, lineage.performance_topic, lineage.timeout_seconds
        )
    except Unavailable as exc:  # no monitor has published yet: the registry alone
        print(f"no live errors: {exc}", file=sys.stderr)
        live = {}
    try:
        decided = live_performance.last_decisions(
            lineage.kafka, lineage.decisions_topic, lineage.timeout_seconds
        )
    except Unavailable as exc:
        print(f"no decisions on live traffic: {exc}", file=sys.stderr)
        decided = {}
    names = [name] if name else registry.names()
    rows = version_rows(registry, names, lineage.serving, live)
    terminal.table(
        "models",
        ("model", "version", "role", "objective", "live error", "from"),
        rows,
        [
            f"{model}@{version:<5} {role:<10} {value:<24} {error:<24} {origin}"
            for model, version, role, value, error, origin in rows
        ],
    )
    for line in decision_lines(names, decided):
        print(line)
    return 0


def decision_lines(
    names: list[str], decided: Mapping[str, monitoring_pb2.ChampionDecision]
) -> list[str]:
    """Each model's last decision on live traffic and why, one line each."""
    lines = []
    for model in names:
        decision = decided.get(model)
        if decision is None:
            continue
        kind = monitoring_pb2.DecisionKind.Name(decision.kind).removeprefix("DECISION_KIND_")
        lines.append(
            f"{model}: last decision {kind.lower()} (serving {decision.chosen_version}, "
            f"{decision.decided_time.ToJsonString()}): {decision.reason}"
        )
    return lines


def version_rows(
    registry: model_registry.Registry,
    names: list[str],
    serving: ServingSettings,
    live: Mapping[tuple[str, str], monitoring_pb2.LivePerformance] | None = None,
) -> list[tuple[str, str, str, str, str, str]]:
    """One row per version of each model: its role (``serving``, the version
    requests get; ``challenger``, run in its shadow; else none), its value on
    its objective (validation), its live error over the predictions joined
    with their truth (``shared.live_performance``) and where it came from."""
    rows = []
    for model in names:
        best = registry.serving(model, serving.policy)
        challenging = {
            e.version for e in registry.challengers(model, serving.policy, serving.challengers)
        }
        for event in registry.versions(model):
            role = (
                "serving"
                if best is not None and event.version == best.version
                else "challenger"
                if event.version in challenging
                else "-"
            )
            metric = event.objective.metric
            value = f"{metric}={event.metrics[metric]:.6g}" if metric in event.metrics else "-"
            origin = event.labels.get(models.REGISTERED) or event.lineage.study_id
            summary = (live or {}).get((model, event.version))
            error = (
                f"{summary.metric}={summary.mae:.6g} (n={summary.pairs})"
                if summary is not None and summary.pairs
                else "-"
            )
            rows.append((model, event.version, role, value, error, origin))
    return rows


def _local(artifact: str, scratch: Path) -> Path:
    """The artifact as a local path: a URL's copied into ``scratch`` first."""
    if "://" not in artifact or artifact.startswith("file://"):
        from shared.artifacts import local_path

        return local_path(artifact)
    from shared.artifacts import ArtifactStore

    root, _, key = artifact.rstrip("/").rpartition("/")
    target = scratch / key
    if not ArtifactStore(root).get_dir(key, target):
        raise InvalidArgument(f"no artifact at {artifact}")
    return target


def _pair(text: str, flag: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise InvalidArgument(f"{flag} {text!r}: expected KEY=VALUE")
    return key, value


def _metric(text: str) -> tuple[str, float]:
    key, value = _pair(text, "--metric")
    try:
        return key, float(value)
    except ValueError:
        raise InvalidArgument(f"--metric {text!r}: the value is not a number") from None


def _objective(text: str) -> common_pb2.Objective:
    metric, _, direction = text.partition(":")
    if not metric or direction not in _DIRECTIONS:
        raise InvalidArgument(f"--objective {text!r}: expected METRIC:minimize or METRIC:maximize")
    return common_pb2.Objective(metric=metric, direction=_DIRECTIONS[direction])


def _moment(text: str, flag: str) -> int | None:
    """An RFC 3339 timestamp with its zone, in µs since the epoch; None for ""."""
    if not text:
        return None
    from datetime import UTC, datetime, timedelta

    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(f"{flag} {text!r}: expected an RFC 3339 timestamp") from None
    if moment.tzinfo is None:
        raise InvalidArgument(f"{flag} {text!r} has no time zone: add Z for UTC")
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
