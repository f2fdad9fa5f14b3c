"""From a model-ready event to something that computes: fetch, verify, load.

The model server and batch scoring (svc_score) both load models through this
one module, so a model scores the same wherever it runs. The artifact is
copied into the reader's own cache and its sha256 is checked
on that copy, which is the one loaded: bytes changed in the store after the
check are never run. Formats are the ones that hold no pickle — a
``torch.export`` program, TorchScript, a TensorFlow SavedModel.
"""

from __future__ import annotations

import shutil
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shared.artifacts import TORCH_EXPORT_FILE, ArtifactStore, digest, local_path
from shared.contracts.aistack.v1 import models_pb2
from shared.errors import AistackError
from shared.settings import ObjectStoreSettings

#: What svc_trainer writes inside a torch.export artifact directory.
TORCHSCRIPT_FILE = "model.pt"
SERVING_SIGNATURE = "serving_default"

Arrays = Mapping[str, NDArray[Any]]


@dataclass(frozen=True)
class TensorSig:
    """One model input or output in Open Inference Protocol terms."""

    name: str
    datatype: str  # "FP32", "INT64", "BYTES", ...
    shape: tuple[int, ...]  # -1 = any size; batch dim first when batched


class ArtifactRejected(AistackError):
    """A model-ready event whose artifact cannot be served; the reason names why."""

    reason = "artifact_rejected"


CHECKSUM_MISMATCH = "checksum_mismatch"
ARTIFACT_MISSING = "artifact_missing"
UNLOADABLE = "unloadable"
UNSUPPORTED_FORMAT = "unsupported_format"
BAD_SIGNATURE = "bad_signature"


@dataclass(frozen=True)
class Runner:
    """A loaded model: ``run`` maps input arrays by name to output arrays by name."""

    inputs: tuple[TensorSig, ...]
    outputs: tuple[TensorSig, ...]
    run: Callable[[Arrays], dict[str, NDArray[Any]]]
    platform: str
    #: How ``run`` computes when that is not the artifact's own runtime
    #: (``traced``: a torch.export program run as TorchScript traced from it).
    runtime: str = ""

    @property
    def batched(self) -> bool:
        """Whether every input and output has a leading batch dimension."""
        return _batched(self.inputs, self.outputs)


def _batched(inputs: Sequence[TensorSig], outputs: Sequence[TensorSig]) -> bool:
    return all(sig.shape[:1] == (-1,) for sig in (*inputs, *outputs))


def signature(specs: Sequence[models_pb2.TensorSpec]) -> tuple[TensorSig, ...]:
    return tuple(TensorSig(s.name, s.datatype, tuple(int(d) for d in s.shape)) for s in specs)


def fetch(
    event: models_pb2.ModelReady,
    cache_dir: Path,
    object_store: ObjectStoreSettings | None = None,
) -> Path:
    """A private copy of the event's artifact whose sha256 matches the event's.
    ``object_store``: how to reach an ``s3://`` artifact (None: the
    environment's settings, for a command or an executor).

    Raises ArtifactRejected (artifact_missing, checksum_mismatch)."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in event.model_name) or "_"
    target = cache_dir / name / f"{event.version}-{event.sha256[:16]}"
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    try:
        _copy(event.artifact_uri, staging, object_store)
    except (OSError, AistackError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise ArtifactRejected(
            f"artifact {event.artifact_uri} cannot be read: {exc}", reason=ARTIFACT_MISSING
        ) from exc
    sha, _ = digest(staging)
    if sha != event.sha256.lower():
        shutil.rmtree(staging, ignore_errors=True)
        raise ArtifactRejected(
            f"artifact {event.artifact_uri} has sha256 {sha}, the event says {event.sha256}",
            reason=CHECKSUM_MISMATCH,
        )
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _copy(uri: str, destination: Path, settings: ObjectStoreSettings | None) -> None:
    if "://" not in uri or uri.startswith("file://"):
        source = local_path(uri)
        if source.is_dir():
            shutil.copytree(source, destination)
        elif source.is_file():
            destination.mkdir(parents=True)
            shutil.copy2(source, destination / source.name)
        else:
            raise FileNotFoundError(f"no such file or directory: {source}")
        return
    root, _, key = uri.rstrip("/").rpartition("/")
    store = ArtifactStore(root, settings or ObjectStoreSettings())
    if not store.get_dir(key, destination):
        raise FileNotFoundError(f"no such artifact: {uri}")


def load(
    event: models_pb2.ModelReady,
    directory: Path,
    intra_op_threads: int = 0,
    *,
    trace_exported: bool = False,
) -> Runner:
    """The runner for a verified artifact directory (check it with
    ``smoke_test`` before serving it). Raises ArtifactRejected.

    ``trace_exported``: run a torch.export program with a batch dimension as
    TorchScript traced from it (``traced_program``), where that computes the
    same; a model called a row or a few at a time then skips the Python
    dispatch of each of its ops (``bench.serving`` with it on and off)."""
    inputs, outputs = signature(event.inputs), signature(event.outputs)
    if not inputs or not outputs:
        raise ArtifactRejected("the event lists no inputs or no outputs", reason=BAD_SIGNATURE)
    fmt = event.format
    try:
        with _framework_lock:
            run, platform, runtime = _load(
                fmt, directory, inputs, outputs, intra_op_threads, trace_exported
            )
    except ArtifactRejected:
        raise
    except Exception as exc:  # whatever the framework raises on bad bytes
        raise ArtifactRejected(
            f"{directory.name}: the framework cannot load it: {type(exc).__name__}: {exc}",
            reason=UNLOADABLE,
        ) from exc
    return Runner(inputs=inputs, outputs=outputs, run=run, platform=platform, runtime=runtime)


def _load(
    fmt: int,
    directory: Path,
    inputs: tuple[TensorSig, ...],
    outputs: tuple[TensorSig, ...],
    intra_op_threads: int,
    trace_exported: bool,
) -> tuple[Callable[[Arrays], dict[str, NDArray[Any]]], str, str]:
    """The model's run, its platform and, when it differs, its runtime."""
    if fmt == models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT:
        run, runtime = _torch_export(directory, inputs, outputs, intra_op_threads, trace_exported)
        return run, "pytorch_export", runtime
    if fmt == models_pb2.ARTIFACT_FORMAT_TORCHSCRIPT:
        return _torchscript(directory, inputs, outputs, intra_op_threads), "pytorch_libtorch", ""
    if fmt == models_pb2.ARTIFACT_FORMAT_TF_SAVED_MODEL:
        run = _saved_model(directory, inputs, outputs, intra_op_threads)
        return run, "tensorflow_savedmodel", ""
    name = models_pb2.ArtifactFormat.Name(fmt) if fmt in _FORMATS else str(fmt)
    raise ArtifactRejected(f"cannot serve format {name}", reason=UNSUPPORTED_FORMAT)


_FORMATS = set(models_pb2.ArtifactFormat.values())


def _one_row(runner: Runner) -> dict[str, NDArray[Any]] | None:
    """One row of zeros in the model's signature; None where an input is not numeric."""
    example = {
        sig.name: np.zeros([1 if d < 0 else d for d in sig.shape], NUMPY_TYPES[sig.datatype])
        for sig in runner.inputs
        if sig.datatype in NUMPY_TYPES
    }
    return example if len(example) == len(runner.inputs) else None


def call_seconds(runner: Runner, calls: int = 5) -> float | None:
    """The median time of ``calls`` one-row calls (after one to warm up), or
    None where the signature has an input that is not numeric."""
    example = _one_row(runner)
    if example is None:
        return None
    runner.run(example)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        runner.run(example)
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def smoke_test(runner: Runner) -> None:
    """One row of zeros through the model: a program that loads but cannot run
    its own signature is refused now (ArtifactRejected), not on the first
    client's request. Call it on the thread that will serve the model."""
    example = _one_row(runner)
    if example is None:
        return
    try:
        out = runner.run(example)
    except Exception as exc:
        raise ArtifactRejected(
            f"the model fails on its own signature: {type(exc).__name__}: {exc}",
            reason=BAD_SIGNATURE,
        ) from exc
    missing = [sig.name for sig in runner.outputs if sig.name not in out]
    if missing:
        raise ArtifactRejected(
            f"the model does not produce the outputs {missing} its event lists",
            reason=BAD_SIGNATURE,
        )


#: numpy's dtype for each numeric Open Inference Protocol datatype.
NUMPY_TYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}

_torch_threads_lock = threading.Lock()
# torch.export.load keeps its deserializer in a global: loads run one at a time.
_framework_lock = threading.Lock()


def _torch_threads(intra_op_threads: int) -> Any:
    import torch

    with _torch_threads_lock:
        if intra_op_threads and torch.get_num_threads() != intra_op_threads:
            torch.set_num_threads(intra_op_threads)
    return torch


def _torch_call(
    module: Any, inputs: tuple[TensorSig, ...], outputs: tuple[TensorSig, ...]
) -> Callable[[Arrays], dict[str, NDArray[Any]]]:
    import torch

    names = [sig.name for sig in inputs]
    out_names = [sig.name for sig in outputs]

    def run(arrays: Arrays) -> dict[str, NDArray[Any]]:
        with torch.inference_mode():
            result = module(*(torch.from_numpy(_writable(arrays[n])) for n in names))
        if isinstance(result, torch.Tensor):
            result = (result,)
        elif isinstance(result, Mapping):
            return {k: v.numpy() for k, v in result.items()}
        return {name: tensor.numpy() for name, tensor in zip(out_names, result, strict=True)}

    return run


def _writable(array: NDArray[Any]) -> NDArray[Any]:
    # Raw request contents are read-only views of the request's bytes; torch
    # wants memory it may write (it does not, but warns): copy those only.
    if array.flags.writeable and array.flags.c_contiguous:
        return array
    return np.array(array, order="C", copy=True)


def _torch_export(
    directory: Path,
    inputs: tuple[TensorSig, ...],
    outputs: tuple[TensorSig, ...],
    intra_op_threads: int,
    trace: bool,
) -> tuple[Callable[[Arrays], dict[str, NDArray[Any]]], str]:
    """The program's run, traced (runtime ``traced``) where ``trace`` asks
    and ``traced_program`` gives a trace."""
    torch = _torch_threads(intra_op_threads)
    path = _one_file(directory, TORCH_EXPORT_FILE, ".pt2")
    # torch.export.load reads a zip of the program and its tensors: no pickle.
    program = torch.export.load(str(path)).module()
    traced = traced_program(program, inputs) if trace and _batched(inputs, outputs) else None
    if traced is None:
        return _torch_call(program, inputs, outputs), ""
    return _torch_call(traced, inputs, outputs), "traced"


#: Batch sizes a traced program must compute as its program does: the one it
#: is traced at, and one below and one above (a size the trace baked in fails).
TRACE_ROWS = (2, 1, 5)


def traced_program(program: Any, inputs: tuple[TensorSig, ...]) -> Any | None:
    """TorchScript traced from an unlifted torch.export program, or None where
    a trace may compute otherwise: a graph with control flow (``torch.cond``
    and the other higher-order operators: a trace keeps one branch), an input
    that is not a plain number, or outputs that differ from the program's at
    any of ``TRACE_ROWS`` (the trace may have fixed a size the program took
    from its input). The program carries no data-dependent Python: export
    allows none, so a trace that matches at these sizes follows every input."""
    import torch

    types = [NUMPY_TYPES.get(sig.datatype) for sig in inputs]
    if any(t is None for t in types) or _has_control_flow(program):
        return None
    generator = np.random.default_rng(0)

    def example(rows: int) -> tuple[Any, ...]:
        made = []
        for sig, numpy_type in zip(inputs, types, strict=True):
            shape = [rows, *(d if d > 0 else 1 for d in sig.shape[1:])]
            if np.issubdtype(numpy_type, np.floating):
                array = generator.standard_normal(shape).astype(numpy_type)
            else:  # indices, flags: zero is valid for every one
                array = np.zeros(shape, numpy_type)
            made.append(torch.from_numpy(array))
        return tuple(made)

    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on constants
            trace: Any = torch.jit.trace  # untyped in torch's stubs
            traced = trace(program, example(TRACE_ROWS[0]), check_trace=False)
            for rows in TRACE_ROWS:
                given = example(rows)
                if not _same_outputs(program(*given), traced(*given)):
                    return None
    except Exception:  # whatever a trace of this graph cannot do: run the program
        return None
    return traced


def _has_control_flow(program: Any) -> bool:
    from torch._ops import HigherOrderOperator

    return any(
        isinstance(node.target, HigherOrderOperator)
        for module in program.modules()
        if hasattr(module, "graph")
        for node in module.graph.nodes
    )


def _same_outputs(expected: Any, got: Any) -> bool:
    import torch

    if isinstance(expected, torch.Tensor):
        expected = (expected,)
        got = got if isinstance(got, tuple | list) else (got,)
    if isinstance(expected, Mapping):
        if not isinstance(got, Mapping) or set(got) != set(expected):
            return False
        expected, got = [expected[k] for k in sorted(expected)], [got[k] for k in sorted(expected)]
    if not isinstance(got, tuple | list) or len(got) != len(expected):
        return False
    return all(
        isinstance(g, torch.Tensor)
        and g.shape == e.shape
        and g.dtype == e.dtype
        and torch.allclose(g, e, rtol=1e-5, atol=1e-6, equal_nan=True)
        for e, g in zip(expected, got, strict=True)
    )


def _torchscript(
    directory: Path,
    inputs: tuple[TensorSig, ...],
    outputs: tuple[TensorSig, ...],
    intra_op_threads: int,
) -> Callable[[Arrays], dict[str, NDArray[Any]]]:
    torch = _torch_threads(intra_op_threads)
    path = _one_file(directory, TORCHSCRIPT_FILE, ".pt")
    return _torch_call(torch.jit.load(str(path), map_location="cpu").eval(), inputs, outputs)


def _one_file(directory: Path, preferred: str, suffix: str) -> Path:
    if (directory / preferred).is_file():
        return directory / preferred
    found = sorted(directory.glob(f"*{suffix}"))
    if len(found) != 1:
        raise ArtifactRejected(
            f"expected {preferred} (or one *{suffix} file) in the artifact", reason=UNLOADABLE
        )
    return found[0]


def _saved_model(
    directory: Path,
    inputs: tuple[TensorSig, ...],
    outputs: tuple[TensorSig, ...],
    intra_op_threads: int,
) -> Callable[[Arrays], dict[str, NDArray[Any]]]:
    import tensorflow as tf

    if intra_op_threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
        except RuntimeError:
            pass  # already initialised: the first setting stands
    loaded = tf.saved_model.load(str(directory))
    signatures = getattr(loaded, "signatures", {})
    if SERVING_SIGNATURE not in signatures:
        raise ArtifactRejected(
            f"the SavedModel has no {SERVING_SIGNATURE!r} signature", reason=BAD_SIGNATURE
        )
    function = signatures[SERVING_SIGNATURE]
    names = [sig.name for sig in inputs]

    def run(arrays: Arrays) -> dict[str, NDArray[Any]]:
        result = function(**{n: tf.constant(arrays[n]) for n in names})
        return {k: v.numpy() for k, v in result.items()}

    # The loaded object owns the variables the function reads: keep it alive.
    run.__dict__["saved_model"] = loaded
    return run
