"""A model artifact's format and signature, read from the artifact itself:
what registering a model trained elsewhere needs to say about it.

- A ``torch.export`` program (``*.pt2``) names its inputs and outputs and
  their shapes (a dynamic dimension reads -1);
- a TensorFlow SavedModel's ``serving_default`` signature does the same;
- a TorchScript file (``*.pt``) says neither: its signature must be given
  (``parse_tensor``: ``name:DATATYPE:d1,d2``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.artifacts import TORCH_EXPORT_FILE
from shared.contracts.aistack.v1 import models_pb2
from shared.errors import InvalidArgument
from shared.model_loading import SERVING_SIGNATURE, TORCHSCRIPT_FILE

_NUMPY_TO_PROTOCOL = {
    "float32": "FP32",
    "float64": "FP64",
    "float16": "FP16",
    "int64": "INT64",
    "int32": "INT32",
    "int16": "INT16",
    "int8": "INT8",
    "uint8": "UINT8",
    "bool": "BOOL",
}


def detect_format(path: Path) -> int:
    """The ``ArtifactFormat`` of a file or directory; InvalidArgument when
    it is none aistack serves."""
    # Before the suffixes: a missing model.pt would otherwise pass as
    # TorchScript and fail later, far from the name the user gave.
    if not path.exists():
        raise InvalidArgument(f"--artifact {path}: no such file or directory")
    if path.is_dir():
        if (path / "saved_model.pb").is_file():
            return models_pb2.ARTIFACT_FORMAT_TF_SAVED_MODEL
        if (path / TORCH_EXPORT_FILE).is_file() or list(path.glob("*.pt2")):
            return models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT
        if (path / TORCHSCRIPT_FILE).is_file() or list(path.glob("*.pt")):
            return models_pb2.ARTIFACT_FORMAT_TORCHSCRIPT
    elif path.suffix == ".pt2":
        return models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT
    elif path.suffix in (".pt", ".ts"):
        return models_pb2.ARTIFACT_FORMAT_TORCHSCRIPT
    raise InvalidArgument(
        f"--artifact {path}: not a torch.export program (.pt2), a TorchScript file (.pt) "
        "or a SavedModel directory (saved_model.pb)"
    )


def read(path: Path, fmt: int) -> tuple[list[models_pb2.TensorSpec], list[models_pb2.TensorSpec]]:
    """(inputs, outputs) of the artifact at ``path``; InvalidArgument when
    the format carries none (TorchScript) or it cannot be read."""
    try:
        if fmt == models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT:
            return _torch_export(_one(path, "*.pt2"))
        if fmt == models_pb2.ARTIFACT_FORMAT_TF_SAVED_MODEL:
            return _saved_model(path)
    except InvalidArgument:
        raise
    except Exception as exc:  # whatever the framework raises on what it cannot read
        raise InvalidArgument(
            f"{path}: cannot read its signature: {type(exc).__name__}: {exc}"
        ) from exc
    raise InvalidArgument(
        f"{path}: a TorchScript file does not say its signature: give --input and --output "
        "(name:DATATYPE:d1,d2, -1 for the batch)"
    )


def parse_tensor(text: str) -> models_pb2.TensorSpec:
    """``name:DATATYPE:d1,d2,...`` (e.g. ``input:FP32:-1,30``) as a TensorSpec."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0] or parts[1] not in _NUMPY_TO_PROTOCOL.values():
        raise InvalidArgument(
            f"{text!r}: expected name:DATATYPE:d1,d2 with DATATYPE one of "
            f"{', '.join(sorted(_NUMPY_TO_PROTOCOL.values()))}"
        )
    try:
        shape = [int(d) for d in parts[2].split(",") if d.strip()]
    except ValueError as exc:
        raise InvalidArgument(f"{text!r}: dimensions are whole numbers, -1 for any") from exc
    return models_pb2.TensorSpec(name=parts[0], datatype=parts[1], shape=shape)


def _one(path: Path, pattern: str) -> Path:
    if path.is_file():
        return path
    if (path / TORCH_EXPORT_FILE).is_file():
        return path / TORCH_EXPORT_FILE
    found = sorted(path.glob(pattern))
    if len(found) != 1:
        raise InvalidArgument(f"{path}: expected one {pattern} file, found {len(found)}")
    return found[0]


def _torch_export(path: Path) -> tuple[list[models_pb2.TensorSpec], list[models_pb2.TensorSpec]]:
    import torch

    program = torch.export.load(str(path))
    signature = program.graph_signature
    user_inputs = set(signature.user_inputs)
    user_outputs = list(signature.user_outputs)
    inputs = [
        _tensor(node.name, node.meta["val"])
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in user_inputs
    ]
    output_node = next(node for node in program.graph.nodes if node.op == "output")
    values = {getattr(arg, "name", str(i)): arg for i, arg in enumerate(output_node.args[0])}
    outputs = []
    for index, name in enumerate(user_outputs):
        node = values.get(name)
        if node is None:
            continue
        shown = "output" if len(user_outputs) == 1 else f"output_{index}"
        outputs.append(_tensor(shown, node.meta["val"]))
    return inputs, outputs


def _tensor(name: str, value: Any) -> models_pb2.TensorSpec:
    dims = [int(d) if isinstance(d, int) else -1 for d in value.shape]
    dtype = str(value.dtype).removeprefix("torch.")
    if dtype not in _NUMPY_TO_PROTOCOL:
        raise InvalidArgument(f"{name}: dtype {value.dtype} has no protocol datatype")
    return models_pb2.TensorSpec(name=name, datatype=_NUMPY_TO_PROTOCOL[dtype], shape=dims)


def _saved_model(path: Path) -> tuple[list[models_pb2.TensorSpec], list[models_pb2.TensorSpec]]:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))
    if SERVING_SIGNATURE not in loaded.signatures:
        raise InvalidArgument(f"{path}: the SavedModel has no {SERVING_SIGNATURE!r} signature")
    function = loaded.signatures[SERVING_SIGNATURE]
    _, named_inputs = function.structured_input_signature
    specs = [(name, spec) for name, spec in sorted(named_inputs.items())]
    outputs = sorted(function.structured_outputs.items())

    def tensor(name: str, spec: Any) -> models_pb2.TensorSpec:
        dims = [-1 if d is None else int(d) for d in spec.shape.as_list()]
        datatype = _NUMPY_TO_PROTOCOL.get(spec.dtype.name)
        if datatype is None:
            raise InvalidArgument(f"{name}: dtype {spec.dtype.name} has no protocol datatype")
        return models_pb2.TensorSpec(name=name, datatype=datatype, shape=dims)

    return [tensor(n, s) for n, s in specs], [tensor(n, s) for n, s in outputs]
