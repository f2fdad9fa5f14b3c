"""Registering a model trained elsewhere: its format and signature read from
the artifact (a torch.export program, a SavedModel) or given (TorchScript,
``parse_tensor``), and what is not a model refused in one line naming it
(``shared.model_signatures``); ``aistack.models.register`` with them, its
registry and producer stood in for, so no broker."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from aistack import models
from aistack.settings import ArtifactClientSettings, ClientSettings
from shared import model_registry
from shared.artifacts import digest, local_path
from shared.contracts.aistack.v1 import common_pb2, models_pb2
from shared.errors import InvalidArgument
from shared.model_signatures import detect_format, parse_tensor, read

TORCH_EXPORT = models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT
TORCHSCRIPT = models_pb2.ARTIFACT_FORMAT_TORCHSCRIPT
SAVED_MODEL = models_pb2.ARTIFACT_FORMAT_TF_SAVED_MODEL


def spec(name: str, datatype: str, *shape: int) -> models_pb2.TensorSpec:
    return models_pb2.TensorSpec(name=name, datatype=datatype, shape=shape)


def tiny_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Softmax(-1)).eval()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A torch.export program, a TorchScript file and a Keras SavedModel of
    one tiny classifier (4 features, 3 classes), made once for the module."""
    root = tmp_path_factory.mktemp("artifacts")
    batch = torch.export.Dim("batch")
    program = torch.export.export(tiny_net(), (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(root / "net.pt2"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # TorchScript is deprecated, still served
        torch.jit.save(torch.jit.script(tiny_net()), str(root / "net.pt"))

    import keras

    features = keras.Input((4,), name="features", dtype="int32")
    scores = keras.layers.Dense(3, name="dense")(keras.ops.cast(features, "float32"))
    label = keras.ops.cast(keras.ops.argmax(scores, -1), "int64")
    outputs = {"scores": scores, "label": label}
    keras.Model(features, outputs).export(str(root / "saved"), verbose=False)
    return root


# ---- reading a signature ----


def test_a_torch_export_program_names_its_input_and_output_with_a_dynamic_batch(
    artifacts: Path,
) -> None:
    path = artifacts / "net.pt2"
    assert detect_format(path) == TORCH_EXPORT
    inputs, outputs = read(path, TORCH_EXPORT)
    assert inputs == [spec("input", "FP32", -1, 4)]
    assert outputs == [spec("output", "FP32", -1, 3)]


def test_a_directory_holding_one_program_under_any_name_reads_as_that_program(
    artifacts: Path, tmp_path: Path
) -> None:
    (tmp_path / "mine.pt2").write_bytes((artifacts / "net.pt2").read_bytes())
    assert detect_format(tmp_path) == TORCH_EXPORT
    assert read(tmp_path, TORCH_EXPORT) == read(artifacts / "net.pt2", TORCH_EXPORT)
    (tmp_path / "other.pt2").write_bytes(b"")
    with pytest.raises(InvalidArgument, match=r"expected one \*\.pt2 file, found 2"):
        read(tmp_path, TORCH_EXPORT)


def test_a_keras_saved_model_names_its_inputs_and_outputs_with_their_datatypes(
    artifacts: Path,
) -> None:
    path = artifacts / "saved"
    assert detect_format(path) == SAVED_MODEL
    inputs, outputs = read(path, SAVED_MODEL)
    assert inputs == [spec("features", "INT32", -1, 4)]
    # A dict of outputs keeps the model's names, sorted.
    assert outputs == [spec("label", "INT64", -1), spec("scores", "FP32", -1, 3)]


def test_a_saved_model_without_a_serving_signature_says_which_it_lacks(tmp_path: Path) -> None:
    import tensorflow as tf

    tf.saved_model.save(tf.Module(), str(tmp_path))
    assert detect_format(tmp_path) == SAVED_MODEL
    with pytest.raises(InvalidArgument, match="has no 'serving_default' signature"):
        read(tmp_path, SAVED_MODEL)


# ---- TorchScript: the signature is given ----


def test_a_torchscript_file_carries_no_signature_and_reading_one_asks_for_it(
    artifacts: Path, tmp_path: Path
) -> None:
    path = artifacts / "net.pt"
    assert detect_format(path) == TORCHSCRIPT
    (tmp_path / "net.ts").write_bytes(path.read_bytes())
    assert detect_format(tmp_path / "net.ts") == TORCHSCRIPT
    with pytest.raises(InvalidArgument) as refused:
        read(path, TORCHSCRIPT)
    assert "does not say its signature: give --input and --output" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_given_tensor_reads_name_datatype_and_dims() -> None:
    assert parse_tensor("input:FP32:-1,30") == spec("input", "FP32", -1, 30)
    assert parse_tensor("label:INT64:-1") == spec("label", "INT64", -1)
    assert parse_tensor("scalar:BOOL:") == spec("scalar", "BOOL")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("input:FP32", "expected name:DATATYPE:d1,d2"),
        (":FP32:-1,4", "expected name:DATATYPE:d1,d2"),
        ("input:float32:-1,4", "DATATYPE one of BOOL, FP16, FP32"),
        ("input:FP32:-1,four", "dimensions are whole numbers"),
    ],
)
def test_a_malformed_given_tensor_is_refused_naming_the_form(text: str, said: str) -> None:
    with pytest.raises(InvalidArgument, match=said):
        parse_tensor(text)


# ---- what is not a model ----


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda d: d / "missing.pt", "no such file or directory"),
        (lambda d: d / "missing.pt2", "no such file or directory"),
        (lambda d: d / "missing", "no such file or directory"),
        (lambda d: _file(d / "model.onnx", b"onnx"), "not a torch.export program (.pt2)"),
        (lambda d: _file(d / "notes" / "README.md", b"hi").parent, "or a SavedModel directory"),
        (lambda d: d, "or a SavedModel directory (saved_model.pb)"),
    ],
    ids=["missing-pt", "missing-pt2", "missing-dir", "unknown-file", "other-dir", "empty-dir"],
)
def test_what_is_not_a_model_is_refused_in_one_line_naming_it(
    tmp_path: Path, make: Any, said: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(InvalidArgument) as refused:
        detect_format(path)
    message = str(refused.value)
    assert said in message and str(path) in message and "\n" not in message


def test_a_file_that_only_looks_like_a_program_cannot_be_read_and_says_why(
    tmp_path: Path,
) -> None:
    path = _file(tmp_path / "net.pt2", b"not a zip archive")
    assert detect_format(path) == TORCH_EXPORT
    with pytest.raises(InvalidArgument, match=r"net\.pt2: cannot read its signature: "):
        read(path, TORCH_EXPORT)


def _file(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ---- register: the event a registration publishes ----


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[models_pb2.ModelReady]]:
    """The registry reads empty and what register publishes is kept."""
    published: list[models_pb2.ModelReady] = []

    class Producer:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def publish(self, topic: str, event: models_pb2.ModelReady, *, key: str) -> str:
            published.append(event)
            return key

        def flush(self) -> None:
            pass

    monkeypatch.setattr(model_registry, "read", lambda *args: model_registry.Registry())
    monkeypatch.setattr(models, "BusProducer", Producer)
    yield published


def client_settings(store: Path) -> ClientSettings:
    return ClientSettings(artifacts=ArtifactClientSettings(artifact_root=str(store)))


def test_a_torchscript_registration_with_half_a_signature_is_refused_before_kafka(
    artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(*args: object) -> None:
        raise AssertionError("the registry was read for a registration that cannot succeed")

    monkeypatch.setattr(model_registry, "read", unreachable)
    registration = models.Registration(
        "net", artifacts / "net.pt", inputs=[parse_tensor("input:FP32:-1,4")]
    )
    with pytest.raises(InvalidArgument, match="give --input and --output"):
        models.register(client_settings(tmp_path), registration)


def test_a_torchscript_file_registers_with_its_given_signature_as_the_servers_file_name(
    artifacts: Path, tmp_path: Path, no_broker: list[models_pb2.ModelReady]
) -> None:
    inputs, outputs = [spec("input", "FP32", -1, 4)], [spec("output", "FP32", -1, 3)]
    registration = models.Registration("net", artifacts / "net.pt", inputs, outputs)
    event = models.register(client_settings(tmp_path / "store"), registration)
    assert no_broker == [event]
    assert (event.format, event.framework) == (TORCHSCRIPT, common_pb2.FRAMEWORK_TORCH)
    assert (list(event.inputs), list(event.outputs), event.version) == (inputs, outputs, "1")
    stored = local_path(event.artifact_uri)
    assert [p.name for p in stored.iterdir()] == ["model.pt"]
    assert (stored / "model.pt").read_bytes() == (artifacts / "net.pt").read_bytes()
    assert digest(stored) == (event.sha256, event.size_bytes)


def test_a_saved_model_registers_with_the_signature_it_carries(
    artifacts: Path, tmp_path: Path, no_broker: list[models_pb2.ModelReady]
) -> None:
    registration = models.Registration("scorer", artifacts / "saved")
    event = models.register(client_settings(tmp_path / "store"), registration)
    assert (event.format, event.framework) == (SAVED_MODEL, common_pb2.FRAMEWORK_TENSORFLOW)
    assert list(event.inputs) == [spec("features", "INT32", -1, 4)]
    assert [o.name for o in event.outputs] == ["label", "scores"]
    assert (local_path(event.artifact_uri) / "saved_model.pb").is_file()
    assert digest(local_path(event.artifact_uri)) == (event.sha256, event.size_bytes)
