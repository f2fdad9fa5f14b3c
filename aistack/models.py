"""Models in the registry as a user handles them: fetch a version's verified
artifact, or register a model trained elsewhere, as MLflow's
``register_model`` does.

A registered model is a new version of its name on ``aistack.models.ready``
like any trained one: its artifact copied into the artifact store with its
sha256, its signature read from the artifact (a ``torch.export`` program, a
SavedModel) or given (TorchScript), and what the user says of it (its
metrics and objective, which decide whether it takes the champion's place;
its labels; the feature and training windows it read, which the drift
monitor watches). The model server serves it, ``aistack score`` scores with
it, the monitor watches it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.timestamp_pb2 import Timestamp

from aistack.settings import ClientSettings
from shared import model_registry, model_signatures
from shared.artifacts import ArtifactStore, digest
from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import common_pb2, models_pb2
from shared.errors import InvalidArgument
from shared.feature_store import FEATURE_LABEL
from shared.model_loading import fetch as fetch_artifact

#: The label that marks a version registered from outside.
REGISTERED = "registered"


@dataclass(frozen=True)
class Registration:
    """What a user says of a model trained elsewhere."""

    name: str
    artifact: Path
    inputs: Sequence[models_pb2.TensorSpec] = ()
    outputs: Sequence[models_pb2.TensorSpec] = ()
    metrics: Mapping[str, float] = field(default_factory=dict)
    # The metric the model's versions compete on, and which way is better.
    objective: common_pb2.Objective | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    # Free text for the lineage: where its training data came from.
    dataset: str = ""
    # The online-store field it reads by entity, and the distribution of its
    # training windows (the drift monitor compares live windows with it).
    training_distribution: models_pb2.TrainingDistribution | None = None


def register(settings: ClientSettings, registration: Registration) -> models_pb2.ModelReady:
    """Publish ``registration`` as the next version of its model; returns the
    event. Raises InvalidArgument for an artifact aistack cannot serve or a
    signature it cannot read, Unavailable when Kafka does not answer."""
    lineage = settings.lineage
    source = registration.artifact.expanduser().resolve()
    fmt = model_signatures.detect_format(source)
    inputs, outputs = list(registration.inputs), list(registration.outputs)
    if not inputs or not outputs:
        read_inputs, read_outputs = model_signatures.read(source, fmt)
        inputs, outputs = inputs or read_inputs, outputs or read_outputs
    registry = model_registry.read(lineage.kafka, lineage.models_topic, lineage.timeout_seconds)
    version = registry.next_version(registration.name)
    with tempfile.TemporaryDirectory(prefix="aistack-register-") as scratch:
        staged = Path(scratch) / "model"
        if source.is_dir():
            shutil.copytree(source, staged)
        else:
            staged.mkdir()
            shutil.copy2(source, staged / _file_name(source, fmt))
        sha, size = digest(staged)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in registration.name)
        uri = ArtifactStore(settings.artifact_root()).put_dir(staged, f"models/{safe}/{version}")
    created = Timestamp()
    created.GetCurrentTime()
    event = models_pb2.ModelReady(
        model_name=registration.name,
        version=version,
        framework=_framework(fmt),
        format=fmt,  # type: ignore[arg-type]
        artifact_uri=uri,
        sha256=sha,
        size_bytes=size,
        inputs=inputs,
        outputs=outputs,
        metrics=dict(registration.metrics),
        lineage=models_pb2.ModelLineage(
            data=models_pb2.DataLineage(dataset=registration.dataset or f"registered from {source}")
        ),
        created_time=created,
        labels={**registration.labels, REGISTERED: str(source)},
    )
    if registration.objective is not None:
        event.objective.CopyFrom(registration.objective)
        if registration.objective.metric and registration.objective.metric not in event.metrics:
            raise InvalidArgument(
                f"the objective {registration.objective.metric!r} has no value: give it "
                "among the metrics"
            )
    if registration.training_distribution is not None:
        event.training_distribution.CopyFrom(registration.training_distribution)
        event.labels[FEATURE_LABEL] = registration.training_distribution.feature
    producer = BusProducer(lineage.kafka, source="aistack-client")
    producer.publish(lineage.models_topic, event, key=f"{registration.name}/{version}")
    producer.flush()
    return event


def challenge(
    settings: ClientSettings, name: str, version: str, on: bool = True
) -> models_pb2.ModelReady:
    """Mark a version a challenger (``on``), or no longer one: the version's
    event again with ``shared.model_registry.CHALLENGER_LABEL`` set or
    removed (the last event of a version wins). The model server then runs
    it in its serving version's shadow (``AISTACK_MODEL_CHALLENGERS``).
    Raises NotFound (no such version), InvalidArgument (it is the serving
    version), Unavailable when Kafka does not answer."""
    lineage = settings.lineage
    registry = model_registry.read(lineage.kafka, lineage.models_topic, lineage.timeout_seconds)
    event = models_pb2.ModelReady()
    event.CopyFrom(registry.version(name, version))
    serving = registry.serving(name, lineage.serving.policy)
    if on and serving is not None and serving.version == event.version:
        raise InvalidArgument(f"{name}@{version} is the version that serves: it cannot challenge")
    if on:
        event.labels[model_registry.CHALLENGER_LABEL] = "true"
    else:
        event.labels.pop(model_registry.CHALLENGER_LABEL, None)
    producer = BusProducer(lineage.kafka, source="aistack-client")
    producer.publish(lineage.models_topic, event, key=f"{name}/{event.version}")
    producer.flush()
    return event


def fetch(settings: ClientSettings, name: str, version: str, into: Path) -> Path:
    """A verified copy of a version's artifact (for "", the one the model
    server serves) in ``into``; its directory. Raises NotFound, ArtifactRejected."""
    lineage = settings.lineage
    registry = model_registry.read(lineage.kafka, lineage.models_topic, lineage.timeout_seconds)
    return fetch_artifact(registry.version(name, version, lineage.serving.policy), into)


def _file_name(source: Path, fmt: int) -> str:
    from shared.artifacts import TORCH_EXPORT_FILE
    from shared.model_loading import TORCHSCRIPT_FILE

    if fmt == models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT:
        return TORCH_EXPORT_FILE
    if fmt == models_pb2.ARTIFACT_FORMAT_TORCHSCRIPT:
        return TORCHSCRIPT_FILE
    return source.name


def _framework(fmt: int) -> common_pb2.Framework:
    if fmt == models_pb2.ARTIFACT_FORMAT_TF_SAVED_MODEL:
        return common_pb2.FRAMEWORK_TENSORFLOW
    return common_pb2.FRAMEWORK_TORCH
