"""Open Inference Protocol tensors to numpy arrays and back: every request's codec.

Pure: no gRPC server, no model, no logging. Raw contents are little-endian,
row-major; a BYTES element on the raw wire is a 4-byte little-endian length
then its bytes. Numeric arrays decoded from raw contents are read-only views
over the request's bytes (no copy), and FP32 and FP64 arrays decoded from
typed contents are read-only too: copy before writing in place.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shared.contracts.inference import grpc_predict_v2_pb2 as pb
from shared.errors import AistackError, InvalidArgument
from shared.model_loading import TensorSig

RequestedOutput = pb.ModelInferRequest.InferRequestedOutputTensor

_LENGTH = struct.Struct("<I")
_LENGTH_DELIMITED = 2  # the protobuf wire type of a packed repeated field


class SignatureMismatch(AistackError):
    """The model or its signature broke the contract (an output missing, of
    another datatype or shape, a dtype with no protocol name): the server's
    fault, never the client's, so it maps to INTERNAL."""

    reason = "signature_mismatch"


@dataclass(frozen=True)
class _Codec:
    dtype: np.dtype[Any]  # of decoded arrays; little-endian on the raw wire
    field: str | None  # the typed contents field; None: raw only (FP16)
    field_dtype: np.dtype[Any]  # what the typed field holds (int32 for INT8, ...)
    number: int  # the field's number in InferTensorContents
    fixed: bool  # packed payload is the little-endian values themselves


def _codec(dtype: Any, field: str | None, field_dtype: Any = None) -> _Codec:
    number = pb.InferTensorContents.DESCRIPTOR.fields_by_name[field].number if field else 0
    wire = np.dtype(dtype).newbyteorder("<")
    fixed = field in ("fp32_contents", "fp64_contents")
    return _Codec(wire, field, np.dtype(field_dtype or dtype), number, fixed)


_CODECS: Mapping[str, _Codec] = MappingProxyType(
    {
        "BOOL": _codec(np.bool_, "bool_contents"),
        "UINT8": _codec(np.uint8, "uint_contents", np.uint32),
        "UINT16": _codec(np.uint16, "uint_contents", np.uint32),
        "UINT32": _codec(np.uint32, "uint_contents"),
        "UINT64": _codec(np.uint64, "uint64_contents"),
        "INT8": _codec(np.int8, "int_contents", np.int32),
        "INT16": _codec(np.int16, "int_contents", np.int32),
        "INT32": _codec(np.int32, "int_contents"),
        "INT64": _codec(np.int64, "int64_contents"),
        "FP16": _codec(np.float16, None),
        "FP32": _codec(np.float32, "fp32_contents"),
        "FP64": _codec(np.float64, "fp64_contents"),
        "BYTES": _codec(np.object_, "bytes_contents"),
    }
)

#: numpy dtype of each protocol datatype; BYTES arrays hold ``bytes`` objects.
DATATYPES: Mapping[str, np.dtype[Any]] = MappingProxyType(
    {name: codec.dtype for name, codec in _CODECS.items()}
)

# By (kind, itemsize), so that either byte order finds its name.
_DATATYPE_BY_KIND = {(c.dtype.kind, c.dtype.itemsize): n for n, c in _CODECS.items()}


def datatype_of(array: NDArray[Any]) -> str:
    """The protocol datatype of ``array``'s dtype; object, ``S`` and ``U``
    arrays are BYTES. Raises SignatureMismatch for a dtype with no protocol
    name (complex, datetime, ...)."""
    kind = array.dtype.kind
    if kind in "OSU":
        return "BYTES"
    name = _DATATYPE_BY_KIND.get((kind, array.dtype.itemsize))
    if name is None:
        raise SignatureMismatch(f"dtype {array.dtype} has no Open Inference Protocol datatype")
    return name


def decode_inputs(
    request: pb.ModelInferRequest, expected: Sequence[TensorSig]
) -> dict[str, NDArray[Any]]:
    """Arrays by input name, shaped as the request says.

    Raises InvalidArgument, its message naming the input and what was
    expected, for: an unknown, duplicate or missing input; a datatype other
    than the signature's; a negative dimension, a rank or fixed dimension
    other than the signature's (-1 there accepts any size); raw and typed
    contents mixed, or not one raw entry per input; contents in a field that
    is not the datatype's (FP16 has none: raw only); an element count or raw
    byte length that does not match the shape; an INT8/16 or UINT8/16 value out
    of range; malformed BYTES length prefixes. Raises SignatureMismatch when a
    signature's datatype is not a protocol datatype.
    """
    by_name = {sig.name: sig for sig in expected}
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgument(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
            "expected one per input, in the order of the inputs"
        )
    arrays: dict[str, NDArray[Any]] = {}
    for index, tensor in enumerate(request.inputs):
        name = tensor.name
        sig = by_name.get(name)
        if sig is None:
            raise InvalidArgument(
                f"input {name!r}: not an input of this model (expected {_names(expected)})"
            )
        if name in arrays:
            raise InvalidArgument(f"input {name!r}: given more than once")
        if tensor.datatype != sig.datatype:
            raise InvalidArgument(
                f"input {name!r}: expected {sig.datatype}, got {tensor.datatype or 'no datatype'}"
            )
        codec = _CODECS.get(sig.datatype)
        if codec is None:
            raise SignatureMismatch(f"input {name!r}: {sig.datatype} is not a protocol datatype")
        shape = tuple(tensor.shape)
        problem = _shape_problem(sig.shape, shape)
        if problem:
            raise InvalidArgument(f"input {name!r}: {problem}")
        if raw:
            if tensor.HasField("contents") and tensor.contents.ListFields():
                raise InvalidArgument(
                    f"input {name!r}: typed contents given together with raw_input_contents; "
                    "expected one or the other for the whole request"
                )
            flat = _from_raw(name, sig.datatype, codec, math.prod(shape), raw[index])
        else:
            flat = _from_typed(name, sig.datatype, codec, math.prod(shape), tensor.contents)
        try:
            arrays[name] = flat.reshape(shape)
        except ValueError as exc:  # a zero-size shape with absurd other dims
            raise InvalidArgument(
                f"input {name!r}: shape {list(shape)} is not allocatable"
            ) from exc
    missing = [sig.name for sig in expected if sig.name not in arrays]
    if missing:
        raise InvalidArgument(f"input {missing[0]!r}: missing (expected {_names(expected)})")
    return arrays


def encode_outputs(
    outputs: Mapping[str, NDArray[Any]],
    expected: Sequence[TensorSig],
    requested: Sequence[RequestedOutput],
    response: pb.ModelInferResponse,
    *,
    raw: bool,
) -> None:
    """Append the requested outputs (all, in signature order, when none are
    requested) to ``response``, as typed contents or as raw_output_contents.

    The protocol's raw_output_contents covers all outputs or none, so the whole
    response is raw when ``raw``, when any requested output has the
    ``binary_data`` parameter set true (Triton's flag), or when an output is
    FP16 (which has no typed field).

    Raises InvalidArgument for a requested output that the model does not have
    or that is requested twice; SignatureMismatch when ``outputs`` lacks one
    or its dtype or shape breaks the signature.
    """
    by_name = {sig.name: sig for sig in expected}
    sigs: list[TensorSig] = []
    for wanted in requested:
        sig = by_name.get(wanted.name)
        if sig is None:
            raise InvalidArgument(
                f"output {wanted.name!r}: not an output of this model (expected {_names(expected)})"
            )
        if sig in sigs:
            raise InvalidArgument(f"output {wanted.name!r}: requested more than once")
        sigs.append(sig)
        if "binary_data" in wanted.parameters and wanted.parameters["binary_data"].bool_param:
            raw = True
    if not requested:
        sigs = list(expected)
    arrays = [_checked_output(sig, outputs) for sig in sigs]
    raw = raw or any(sig.datatype == "FP16" for sig in sigs)
    for sig, array in zip(sigs, arrays, strict=True):
        codec = _CODECS[sig.datatype]
        tensor = response.outputs.add(name=sig.name, datatype=sig.datatype, shape=array.shape)
        if raw:
            response.raw_output_contents.append(_to_raw(sig.name, codec, array))
        elif array.size:
            _to_typed(sig.name, codec, array, tensor.contents)


def raw_bytes(name: str, datatype: str, array: NDArray[Any]) -> bytes:
    """``array`` in the protocol's raw encoding for ``datatype`` (what
    ``raw_input_contents`` would carry). Raises SignatureMismatch for a
    datatype that is not the protocol's, or BYTES elements that are not bytes."""
    codec = _CODECS.get(datatype)
    if codec is None:
        raise SignatureMismatch(f"tensor {name!r}: {datatype} is not a protocol datatype")
    return _to_raw(name, codec, array)


def batch_rows(arrays: Mapping[str, NDArray[Any]]) -> int:
    """The size of the batch (first) dimension, which every array shares.

    Raises InvalidArgument when there are no arrays, one is a scalar, or two
    disagree on it."""
    rows: int | None = None
    first = ""
    for name, array in arrays.items():
        if array.ndim == 0:
            raise InvalidArgument(f"input {name!r}: a scalar; expected a batch dimension first")
        if rows is None:
            rows, first = array.shape[0], name
        elif array.shape[0] != rows:
            raise InvalidArgument(
                f"input {name!r}: batch dimension is {array.shape[0]}, "
                f"expected {rows} as input {first!r} has"
            )
    if rows is None:
        raise InvalidArgument("no inputs: expected at least one to give the batch dimension")
    return rows


def _names(sigs: Sequence[TensorSig]) -> str:
    return ", ".join(repr(sig.name) for sig in sigs) or "none"


def _shape_problem(signature: tuple[int, ...], shape: tuple[int, ...]) -> str:
    """What is wrong with ``shape`` against ``signature``; "" if nothing."""
    if len(shape) == len(signature):
        for got, want in zip(shape, signature, strict=True):
            if got < 0 or (got != want and want >= 0):
                break
        else:
            return ""
    if min(shape, default=0) < 0:
        return f"shape {list(shape)} has a negative dimension; expected sizes >= 0"
    return f"expected shape {list(signature)} (-1: any size), got {list(shape)}"


def _from_raw(name: str, datatype: str, codec: _Codec, count: int, data: bytes) -> NDArray[Any]:
    if datatype == "BYTES":
        return _objects(_split_bytes(name, data, count))
    size = count * codec.dtype.itemsize
    if len(data) != size:
        raise InvalidArgument(
            f"input {name!r}: expected {size} bytes of raw {datatype} for {count} elements, "
            f"got {len(data)}"
        )
    if datatype == "BOOL":  # one byte per element; any non-zero byte is true
        return np.frombuffer(data, np.uint8).astype(np.bool_)
    return np.frombuffer(data, codec.dtype)


def _split_bytes(name: str, data: bytes, count: int) -> list[bytes]:
    elements: list[bytes] = []
    offset, end = 0, len(data)
    while offset < end and len(elements) < count:
        if end - offset < 4:
            raise InvalidArgument(
                f"input {name!r}: BYTES element {len(elements)} has a truncated length prefix; "
                "expected 4 bytes"
            )
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += 4
        if length > end - offset:
            raise InvalidArgument(
                f"input {name!r}: BYTES element {len(elements)} claims {length} bytes, "
                f"expected at most the {end - offset} left"
            )
        elements.append(data[offset : offset + length])
        offset += length
    if len(elements) != count or offset != end:
        raise InvalidArgument(
            f"input {name!r}: expected {count} length-prefixed BYTES elements, "
            f"got {len(elements)}{' and trailing bytes' if offset != end else ''}"
        )
    return elements


def _from_typed(
    name: str, datatype: str, codec: _Codec, count: int, contents: pb.InferTensorContents
) -> NDArray[Any]:
    fields = contents.ListFields()
    if not fields:
        if count and codec.field is None:
            raise InvalidArgument(
                f"input {name!r}: {datatype} has no typed contents field; "
                "expected it in raw_input_contents"
            )
        if count:
            raise InvalidArgument(
                f"input {name!r}: expected {count} elements in {codec.field}, got no contents"
            )
        return np.empty(0, codec.dtype)
    given = ", ".join(field.name for field, _ in fields)
    if codec.field is None:
        raise InvalidArgument(
            f"input {name!r}: {datatype} has no typed contents field; expected it in "
            f"raw_input_contents, got {given}"
        )
    if len(fields) > 1 or fields[0][0].name != codec.field:
        raise InvalidArgument(f"input {name!r}: expected {datatype} in {codec.field}, got {given}")
    values = fields[0][1]
    if len(values) != count:
        raise InvalidArgument(
            f"input {name!r}: expected {count} elements in {codec.field}, got {len(values)}"
        )
    if datatype == "BYTES":
        return _objects(list(values))
    # Iterating a repeated field costs ~70 ns an element. Proto3 serialises it
    # packed, so for floats, and for varints that all fit in one byte (bools,
    # small ints), the payload already is the array: ~50x faster.
    payload = _packed_payload(codec.number, contents.SerializeToString())
    if payload is not None and codec.fixed:
        return np.frombuffer(payload, codec.dtype)
    if payload is not None and len(payload) == count:
        return np.frombuffer(payload, np.uint8).astype(codec.dtype)
    flat = np.asarray(values, codec.field_dtype)
    if codec.field_dtype != codec.dtype:
        limits = np.iinfo(codec.dtype)
        low, high = flat.min(), flat.max()
        if low < limits.min or high > limits.max:
            bad = low if low < limits.min else high
            raise InvalidArgument(
                f"input {name!r}: value {bad} out of range; expected {datatype} "
                f"({limits.min}..{limits.max})"
            )
        flat = flat.astype(codec.dtype)
    return flat


def _packed_payload(number: int, message: bytes) -> memoryview | None:
    """The payload of ``message`` when it is exactly one packed field ``number``."""
    tag, offset = _read_varint(message, 0)
    if tag != (number << 3) | _LENGTH_DELIMITED:
        return None
    length, offset = _read_varint(message, offset)
    if offset + length != len(message):
        return None
    return memoryview(message)[offset:]


def _read_varint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while offset < len(data):
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, offset
        shift += 7
    return -1, offset


def _write_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _objects(elements: list[bytes]) -> NDArray[Any]:
    # np.array(elements, object) would turn equal-length bytes into a 2-D array.
    array = np.empty(len(elements), object)
    array[:] = elements
    return array


def _checked_output(sig: TensorSig, outputs: Mapping[str, NDArray[Any]]) -> NDArray[Any]:
    array = outputs.get(sig.name)
    if array is None:
        raise SignatureMismatch(f"output {sig.name!r}: the model did not produce it")
    try:
        datatype = datatype_of(array)
    except SignatureMismatch as exc:
        raise SignatureMismatch(f"output {sig.name!r}: {exc}") from exc
    if datatype != sig.datatype:
        raise SignatureMismatch(
            f"output {sig.name!r}: the model produced {datatype}, the signature says {sig.datatype}"
        )
    problem = _shape_problem(sig.shape, array.shape)
    if problem:
        raise SignatureMismatch(f"output {sig.name!r}: {problem}")
    return array


def _byte_elements(name: str, array: NDArray[Any]) -> list[bytes]:
    elements = array.ravel().tolist()
    for index, element in enumerate(elements):
        if isinstance(element, str):
            elements[index] = element.encode()
        elif not isinstance(element, bytes):
            raise SignatureMismatch(
                f"output {name!r}: BYTES element {index} is {type(element).__name__}, "
                "expected bytes or str"
            )
    return elements


def _to_raw(name: str, codec: _Codec, array: NDArray[Any]) -> bytes:
    if codec.field == "bytes_contents":
        parts: list[bytes] = []
        for element in _byte_elements(name, array):
            parts += (_LENGTH.pack(len(element)), element)
        return b"".join(parts)
    return array.astype(codec.dtype, copy=False).tobytes()


def _to_typed(
    name: str, codec: _Codec, array: NDArray[Any], contents: pb.InferTensorContents
) -> None:
    assert codec.field is not None  # FP16 responses are always raw
    if codec.field == "bytes_contents":
        contents.bytes_contents.extend(_byte_elements(name, array))
    elif codec.fixed or codec.dtype == np.bool_:
        # The same packed-payload shortcut as decoding: bools are 0/1 varints.
        payload = array.astype(codec.dtype, copy=False).tobytes()
        header = _write_varint((codec.number << 3) | _LENGTH_DELIMITED)
        contents.MergeFromString(header + _write_varint(len(payload)) + payload)
    else:
        getattr(contents, codec.field).extend(array.ravel().tolist())
