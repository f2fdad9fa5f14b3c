from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numpy.typing import NDArray

from shared.contracts.inference import grpc_predict_v2_pb2 as pb
from shared.errors import InvalidArgument
from shared.model_loading import TensorSig
from svc_model.tensors import (
    DATATYPES,
    SignatureMismatch,
    batch_rows,
    datatype_of,
    decode_inputs,
    encode_outputs,
)

Input = pb.ModelInferRequest.InferInputTensor
Requested = pb.ModelInferRequest.InferRequestedOutputTensor

FIELDS = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _inp(name: str, datatype: str, shape: tuple[int, ...], **contents: Any) -> Input:
    return Input(
        name=name, datatype=datatype, shape=shape, contents=pb.InferTensorContents(**contents)
    )


def _req(*inputs: Input, raw: list[bytes] | None = None) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(inputs=inputs, raw_input_contents=raw or [])


def _objects(elements: list[bytes]) -> NDArray[Any]:
    array = np.empty(len(elements), object)
    array[:] = elements
    return array


def _as_request(response: pb.ModelInferResponse) -> pb.ModelInferRequest:
    """The response's outputs sent back as a request's inputs."""
    request = pb.ModelInferRequest(raw_input_contents=response.raw_output_contents)
    for out in response.outputs:
        request.inputs.add(
            name=out.name, datatype=out.datatype, shape=out.shape, contents=out.contents
        )
    return request


def _encode(
    outputs: dict[str, NDArray[Any]],
    sigs: list[TensorSig],
    requested: list[Requested] | None = None,
    *,
    raw: bool = False,
) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse()
    encode_outputs(outputs, sigs, requested or [], response, raw=raw)
    return response


def _arrays(datatype: str) -> st.SearchStrategy[NDArray[Any]]:
    shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4)
    if datatype != "BYTES":
        return hnp.arrays(DATATYPES[datatype], shapes)
    return shapes.flatmap(
        lambda shape: st.lists(
            st.binary(max_size=6), min_size=math.prod(shape), max_size=math.prod(shape)
        ).map(lambda elements: _objects(elements).reshape(shape))
    )


# --- round trips --------------------------------------------------------------


@pytest.mark.parametrize("raw", [False, True], ids=["typed", "raw"])
@pytest.mark.parametrize("datatype", sorted(DATATYPES))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_datatype_round_trips(datatype: str, raw: bool, data: st.DataObject) -> None:
    array = data.draw(_arrays(datatype))
    sig = TensorSig("t", datatype, (-1, *array.shape[1:]))
    response = _encode({"t": array}, [sig], raw=raw)

    (out,) = response.outputs
    assert (out.name, out.datatype, tuple(out.shape)) == ("t", datatype, array.shape)
    # FP16 has no typed field, so its responses are raw whatever was asked.
    is_raw = raw or datatype == "FP16"
    assert len(response.raw_output_contents) == (1 if is_raw else 0)
    if not is_raw and array.size:
        # What protobuf itself reads from the typed field is the array.
        values = list(getattr(out.contents, FIELDS[datatype]))
        np.testing.assert_array_equal(np.array(values, DATATYPES[datatype]), array.ravel())

    decoded = decode_inputs(_as_request(response), [sig])["t"]
    assert decoded.dtype == DATATYPES[datatype]
    assert decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)


@pytest.mark.parametrize("raw", [False, True], ids=["typed", "raw"])
def test_many_inputs_round_trip_together(raw: bool) -> None:
    rng = np.random.default_rng(7)
    arrays: dict[str, NDArray[Any]] = {
        name.lower(): rng.integers(0, 100, (3, 2)).astype(dtype)
        for name, dtype in DATATYPES.items()
        if name != "BYTES"
    }
    arrays["bytes"] = _objects([b"a", b"", b"ccc", b"\x00", b"e", b"ff"]).reshape(3, 2)
    sigs = [TensorSig(name.lower(), name, (-1, 2)) for name in DATATYPES]

    decoded = decode_inputs(_as_request(_encode(arrays, sigs, raw=raw)), sigs)

    assert decoded.keys() == arrays.keys()
    for name, array in arrays.items():
        assert decoded[name].dtype == array.dtype
        np.testing.assert_array_equal(decoded[name], array)
    assert batch_rows(decoded) == 3


TYPED_VALUES = [
    ("INT8", [-128, 127, 0, 5]),
    ("INT16", [-32768, 32767, 300]),
    ("INT32", [-(2**31), 2**31 - 1, 1]),
    ("INT64", [-(2**63), 2**63 - 1, -1]),
    ("UINT8", [0, 255, 128]),
    ("UINT16", [0, 65535, 200]),
    ("UINT32", [0, 2**32 - 1]),
    ("UINT64", [0, 2**64 - 1, 2**63]),
    ("BOOL", [True, False, True]),
    ("FP32", [0.5, -(2.0**100), float("inf")]),
    ("FP64", [1e300, -0.0, 2.5]),
    ("BYTES", [b"", b"ab", b"\xff" * 200]),
]


@pytest.mark.parametrize("datatype, values", TYPED_VALUES, ids=[row[0] for row in TYPED_VALUES])
def test_typed_contents_built_by_any_client_decode(datatype: str, values: list[Any]) -> None:
    request = _req(_inp("x", datatype, (len(values),), **{FIELDS[datatype]: values}))
    decoded = decode_inputs(request, [TensorSig("x", datatype, (-1,))])["x"]
    assert decoded.dtype == DATATYPES[datatype]
    assert decoded.tolist() == values


def test_typed_contents_with_unknown_fields_still_decode() -> None:
    request = _req(_inp("x", "FP32", (2,), fp32_contents=[1.0, 2.0]))
    request.inputs[0].contents.MergeFromString(b"\x48\x01")  # field 9: not in the protocol
    decoded = decode_inputs(request, [TensorSig("x", "FP32", (2,))])["x"]
    assert decoded.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("datatype", ["FP32", "FP64", "BOOL", "INT64", "BYTES"])
def test_typed_encoding_is_what_protobuf_would_write(datatype: str) -> None:
    array = np.array([1, 0, 3, 0], DATATYPES[datatype])
    if datatype == "BYTES":
        array = _objects([b"1", b"", b"3", b""])
    (out,) = _encode({"y": array}, [TensorSig("y", datatype, (4,))]).outputs
    reference = pb.InferTensorContents(**{FIELDS[datatype]: array.tolist()})
    assert out.contents == reference
    assert out.contents.SerializeToString() == reference.SerializeToString()


# --- the raw wire format ------------------------------------------------------


def test_bytes_raw_is_length_prefixed() -> None:
    array = _objects([b"ab", b"", b"xyz"])
    response = _encode({"s": array}, [TensorSig("s", "BYTES", (-1,))], raw=True)
    assert response.raw_output_contents[0] == (
        b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x03\x00\x00\x00xyz"
    )


def test_bytes_outputs_accept_str_and_fixed_width_strings() -> None:
    sig = TensorSig("s", "BYTES", (-1,))
    for array in (np.array(["é", "b"]), np.array([b"\xc3\xa9", b"b"]), _objects(["é", b"b"])):  # type: ignore[list-item]
        (out,) = _encode({"s": array}, [sig]).outputs
        assert list(out.contents.bytes_contents) == [b"\xc3\xa9", b"b"]


def test_bool_raw_is_one_byte_per_element_and_nonzero_is_true() -> None:
    sig = TensorSig("b", "BOOL", (-1,))
    response = _encode({"b": np.array([True, False, True])}, [sig], raw=True)
    assert response.raw_output_contents[0] == b"\x01\x00\x01"
    request = _req(_inp("b", "BOOL", (3,)), raw=[b"\x00\x02\xff"])
    assert decode_inputs(request, [sig])["b"].tolist() == [False, True, True]


def test_raw_numbers_are_little_endian_row_major() -> None:
    sig = TensorSig("x", "FP32", (-1, 2))
    request = _req(_inp("x", "FP32", (2, 2)), raw=[struct.pack("<4f", 1, 2, 3, 4)])
    assert decode_inputs(request, [sig])["x"].tolist() == [[1, 2], [3, 4]]
    big_endian = np.array([[1, 2], [3, 4]], ">f4")
    response = _encode({"x": big_endian}, [sig], raw=True)
    assert response.raw_output_contents[0] == struct.pack("<4f", 1, 2, 3, 4)


@pytest.mark.parametrize("raw", [False, True], ids=["typed", "raw"])
def test_any_size_dimension_accepts_zero(raw: bool) -> None:
    sig = TensorSig("x", "FP32", (-1, 2))
    request = _req(_inp("x", "FP32", (0, 2)), raw=[b""] if raw else None)
    decoded = decode_inputs(request, [sig])["x"]
    assert decoded.shape == (0, 2) and decoded.dtype == np.float32


# --- malformed requests -------------------------------------------------------

X = TensorSig("x", "FP32", (-1, 2))
S = TensorSig("s", "BYTES", (-1,))


def _x(shape: tuple[int, ...] = (1, 2), **contents: Any) -> Input:
    return _inp("x", "FP32", shape, **contents)


def _s(shape: tuple[int, ...] = (1,)) -> Input:
    return _inp("s", "BYTES", shape)


BAD_REQUESTS = [
    pytest.param([X], _req(_inp("q", "FP32", (1, 2))), "'q': not an input", id="unknown-input"),
    pytest.param(
        [X],
        _req(_x(fp32_contents=[1, 2]), _x(fp32_contents=[1, 2])),
        "'x': given more than once",
        id="duplicate-input",
    ),
    pytest.param([X, S], _req(_x(fp32_contents=[1, 2])), "'s': missing", id="missing-input"),
    pytest.param(
        [X],
        _req(_inp("x", "INT64", (1, 2), int64_contents=[1, 2])),
        "'x': expected FP32, got INT64",
        id="wrong-datatype",
    ),
    pytest.param(
        [X], _req(_inp("x", "", (1, 2))), "'x': expected FP32, got no datatype", id="no-datatype"
    ),
    pytest.param(
        [X],
        _req(_x((2,), fp32_contents=[1, 2])),
        "'x': expected shape [-1, 2] (-1: any size), got [2]",
        id="wrong-rank",
    ),
    pytest.param(
        [X],
        _req(_x((1, 3), fp32_contents=[1, 2, 3])),
        "'x': expected shape [-1, 2] (-1: any size), got [1, 3]",
        id="wrong-fixed-dim",
    ),
    pytest.param([X], _req(_x((-1, 2))), "'x': shape [-1, 2] has a negative", id="negative-dim"),
    pytest.param(
        [X],
        _req(_x((2, 2), fp32_contents=[1, 2, 3])),
        "'x': expected 4 elements in fp32_contents, got 3",
        id="typed-count",
    ),
    pytest.param(
        [X],
        _req(_x()),
        "'x': expected 2 elements in fp32_contents, got no contents",
        id="no-contents",
    ),
    pytest.param(
        [X],
        _req(_x(fp64_contents=[1, 2])),
        "'x': expected FP32 in fp32_contents, got fp64_contents",
        id="wrong-field",
    ),
    pytest.param(
        [X],
        _req(_x(fp32_contents=[1, 2], int_contents=[1])),
        "'x': expected FP32 in fp32_contents, got int_contents, fp32_contents",
        id="two-fields",
    ),
    pytest.param(
        [X],
        _req(_x(fp32_contents=[1, 2]), raw=[b"\x00" * 8]),
        "'x': typed contents given together with raw_input_contents",
        id="raw-and-typed",
    ),
    pytest.param(
        [X, S],
        _req(_x(), _s(), raw=[b"\x00" * 8]),
        "raw_input_contents has 1 entries for 2 inputs",
        id="raw-count",
    ),
    pytest.param(
        [X],
        _req(_x(), raw=[b"\x00" * 7]),
        "'x': expected 8 bytes of raw FP32 for 2 elements, got 7",
        id="raw-length",
    ),
    pytest.param(
        [S],
        _req(_s(), raw=[b"\x01\x00"]),
        "'s': BYTES element 0 has a truncated length prefix",
        id="bytes-truncated-prefix",
    ),
    pytest.param(
        [S],
        _req(_s(), raw=[b"\x05\x00\x00\x00ab"]),
        "'s': BYTES element 0 claims 5 bytes, expected at most the 2 left",
        id="bytes-overrun",
    ),
    pytest.param(
        [S],
        _req(_s((2,)), raw=[b"\x01\x00\x00\x00a"]),
        "'s': expected 2 length-prefixed BYTES elements, got 1",
        id="bytes-too-few",
    ),
    pytest.param(
        [S],
        _req(_s((1,)), raw=[b"\x01\x00\x00\x00a\x01\x00\x00\x00b"]),
        "'s': expected 1 length-prefixed BYTES elements, got 1 and trailing bytes",
        id="bytes-too-many",
    ),
    pytest.param(
        [TensorSig("h", "FP16", (-1,))],
        _req(_inp("h", "FP16", (1,), fp32_contents=[1.0])),
        "'h': FP16 has no typed contents field; expected it in raw_input_contents",
        id="fp16-typed",
    ),
    pytest.param(
        [TensorSig("h", "FP16", (-1,))],
        _req(_inp("h", "FP16", (1,))),
        "'h': FP16 has no typed contents field; expected it in raw_input_contents",
        id="fp16-no-contents",
    ),
    pytest.param(
        [TensorSig("i", "INT8", (-1,))],
        _req(_inp("i", "INT8", (2,), int_contents=[1, -129])),
        "'i': value -129 out of range; expected INT8 (-128..127)",
        id="int8-range",
    ),
    pytest.param(
        [TensorSig("u", "UINT16", (-1,))],
        _req(_inp("u", "UINT16", (1,), uint_contents=[65536])),
        "'u': value 65536 out of range; expected UINT16 (0..65535)",
        id="uint16-range",
    ),
    pytest.param(
        [TensorSig("z", "FP32", (-1, -1))],
        _req(_inp("z", "FP32", (0, 2**62))),
        "'z': shape [0, 4611686018427387904] is not allocatable",
        id="unallocatable-shape",
    ),
]


@pytest.mark.parametrize("sigs, request_, message", BAD_REQUESTS)
def test_malformed_requests_are_invalid_arguments(
    sigs: list[TensorSig], request_: pb.ModelInferRequest, message: str
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        decode_inputs(request_, sigs)
    assert message in str(raised.value)


def test_a_signature_datatype_outside_the_protocol_is_the_servers_fault() -> None:
    with pytest.raises(SignatureMismatch, match="'x': FP8 is not a protocol datatype"):
        decode_inputs(_req(_inp("x", "FP8", (1,))), [TensorSig("x", "FP8", (-1,))])


# --- outputs ------------------------------------------------------------------

Y = TensorSig("y", "FP32", (-1, 2))
Z = TensorSig("z", "INT64", (-1,))
OUTPUTS = {"y": np.ones((1, 2), np.float32), "z": np.array([7])}


def test_all_outputs_in_signature_order_when_none_requested() -> None:
    response = _encode(OUTPUTS, [Z, Y])
    assert [out.name for out in response.outputs] == ["z", "y"]
    assert not response.raw_output_contents


def test_requested_outputs_in_request_order() -> None:
    response = _encode(OUTPUTS, [Y, Z], [Requested(name="z")])
    assert [out.name for out in response.outputs] == ["z"]
    assert list(response.outputs[0].contents.int64_contents) == [7]


@pytest.mark.parametrize("flag, raw", [(True, True), (False, False)], ids=["true", "false"])
def test_binary_data_on_a_requested_output_makes_the_response_raw(flag: bool, raw: bool) -> None:
    binary = {"binary_data": pb.InferParameter(bool_param=flag)}
    requested = [Requested(name="y"), Requested(name="z", parameters=binary)]
    response = _encode(OUTPUTS, [Y, Z], requested)
    assert len(response.raw_output_contents) == (2 if raw else 0)


def test_fp16_makes_the_response_raw() -> None:
    sigs = [Y, TensorSig("h", "FP16", (-1,))]
    response = _encode({**OUTPUTS, "h": np.array([0.5], np.float16)}, sigs)
    assert response.raw_output_contents[1] == np.array([0.5], "<f2").tobytes()
    assert len(response.raw_output_contents) == 2


@pytest.mark.parametrize(
    "requested, message",
    [
        pytest.param(["y", "w"], "output 'w': not an output of this model", id="unknown"),
        pytest.param(["y", "y"], "output 'y': requested more than once", id="duplicate"),
    ],
)
def test_bad_requested_outputs_are_invalid_arguments(requested: list[str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        _encode(OUTPUTS, [Y, Z], [Requested(name=name) for name in requested])


@pytest.mark.parametrize(
    "outputs, message",
    [
        pytest.param({"z": OUTPUTS["z"]}, "'y': the model did not produce it", id="missing"),
        pytest.param(
            {**OUTPUTS, "y": np.ones((1, 2))},
            "'y': the model produced FP64, the signature says FP32",
            id="dtype",
        ),
        pytest.param(
            {**OUTPUTS, "y": np.ones((1, 3), np.float32)},
            r"'y': expected shape \[-1, 2\]",
            id="shape",
        ),
        pytest.param(
            {**OUTPUTS, "y": np.ones((1, 2), np.complex64)},
            "'y': dtype complex64 has no Open Inference Protocol datatype",
            id="no-protocol-dtype",
        ),
    ],
)
def test_outputs_breaking_the_signature_are_the_servers_fault(
    outputs: dict[str, NDArray[Any]], message: str
) -> None:
    with pytest.raises(SignatureMismatch, match=message):
        _encode(outputs, [Y, Z])


def test_bytes_output_elements_must_be_bytes_or_str() -> None:
    with pytest.raises(SignatureMismatch, match="'s': BYTES element 1 is int"):
        _encode({"s": _objects([b"a", 3])}, [TensorSig("s", "BYTES", (-1,))])  # type: ignore[list-item]


# --- datatype_of and batch_rows ------------------------------------------------


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_datatype_of_names_every_protocol_dtype(datatype: str) -> None:
    assert datatype_of(np.zeros(1, DATATYPES[datatype])) == datatype


def test_datatype_of_ignores_byte_order_and_maps_strings_to_bytes() -> None:
    assert datatype_of(np.zeros(1, ">i8")) == "INT64"
    assert datatype_of(np.array([b"a"])) == "BYTES"
    assert datatype_of(np.array(["a"])) == "BYTES"


def test_batch_rows_is_the_shared_first_dimension() -> None:
    assert batch_rows({"a": np.zeros((3, 2)), "b": np.zeros(3)}) == 3


@pytest.mark.parametrize(
    "arrays, message",
    [
        pytest.param(
            {"a": np.zeros((3, 2)), "b": np.zeros((4, 2))},
            "input 'b': batch dimension is 4, expected 3 as input 'a' has",
            id="disagree",
        ),
        pytest.param({"a": np.zeros(())}, "input 'a': a scalar", id="scalar"),
        pytest.param({}, "no inputs", id="empty"),
    ],
)
def test_batch_rows_refuses(arrays: dict[str, NDArray[Any]], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        batch_rows(arrays)


# --- fuzz: whatever arrives, only InvalidArgument comes out ---------------------
# Requests are built mostly right (name, datatype, shape, contents each right
# three times in four), so that the fuzz gets past the name checks and into the
# decoders, where a wrong byte count or a bad length prefix could crash them.

FUZZ_SIGS = [
    TensorSig(name.lower(), name, (-1,) if index % 2 else (-1, 2))
    for index, name in enumerate(sorted(DATATYPES))
]
_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=4),
}
_mostly = st.integers(0, 3).map(bool)
_any_name = st.text(max_size=3)
_any_datatype = st.sampled_from(sorted(DATATYPES)) | st.text(max_size=4)
_any_shape = st.lists(
    st.integers(-2, 4) | st.sampled_from([2**62, 2**63 - 1, -(2**63)]), max_size=3
).map(tuple)
_any_contents = st.dictionaries(
    st.sampled_from(sorted(_VALUES)), st.just(None), max_size=2
).flatmap(
    lambda fields: st.fixed_dictionaries(
        {field: st.lists(_VALUES[field], max_size=6) for field in fields}
    )
)
_any_raw = st.binary(max_size=24)


def _prefixed(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(element)) + element for element in elements)


def _exact_typed(datatype: str, count: int) -> st.SearchStrategy[dict[str, list[Any]]]:
    field = FIELDS.get(datatype, "fp32_contents")  # FP16 has none: any is wrong
    values = st.lists(_VALUES[field], min_size=count, max_size=count)
    return values.map(lambda values: {field: values})


def _exact_raw(datatype: str, count: int) -> st.SearchStrategy[bytes]:
    if datatype == "BYTES":
        return st.lists(st.binary(max_size=3), min_size=count, max_size=count).map(_prefixed)
    size = count * DATATYPES[datatype].itemsize
    return st.binary(min_size=size, max_size=size)


@st.composite
def _requests(draw: st.DrawFn, expected: list[TensorSig]) -> pb.ModelInferRequest:
    raw = draw(st.booleans())
    tensors: list[tuple[Input, bytes]] = []
    for sig in expected:
        if not draw(_mostly) and not draw(_mostly):
            continue  # missing
        name = sig.name if draw(_mostly) else draw(_any_name)
        datatype = sig.datatype if draw(_mostly) else draw(_any_datatype)
        fitting = st.tuples(*(st.integers(0, 3) if dim < 0 else st.just(dim) for dim in sig.shape))
        shape = draw(fitting if draw(_mostly) else _any_shape)
        count = math.prod(shape) if all(0 <= dim <= 4 for dim in shape) else -1
        exact = count >= 0 and draw(_mostly)
        if raw:
            contents = {} if draw(_mostly) else draw(_any_contents)
            entry = draw(_exact_raw(sig.datatype, count) if exact else _any_raw)
        else:
            contents = draw(_exact_typed(sig.datatype, count) if exact else _any_contents)
            entry = b""
        tensors.append((_inp(name, datatype, shape, **contents), entry))
    if not draw(_mostly) and not draw(_mostly):  # an unknown or duplicate input
        name = draw(st.sampled_from([sig.name for sig in expected]) | _any_name)
        extra = _inp(name, draw(_any_datatype), draw(_any_shape), **draw(_any_contents))
        tensors.append((extra, draw(_any_raw)))
    tensors = draw(st.permutations(tensors))
    entries = [entry for _, entry in tensors] if raw else []
    if entries and not draw(_mostly):
        entries = entries[: draw(st.integers(0, len(entries) - 1))] + draw(st.lists(_any_raw))
    return _req(*(tensor for tensor, _ in tensors), raw=entries)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_arbitrary_requests_only_ever_raise_invalid_argument(data: st.DataObject) -> None:
    unique_names = st.lists(
        st.sampled_from(FUZZ_SIGS), min_size=1, max_size=3, unique_by=lambda sig: sig.name
    )
    expected = data.draw(unique_names)
    request = data.draw(_requests(expected))
    try:
        arrays = decode_inputs(request, expected)
    except InvalidArgument:
        return
    for tensor in request.inputs:
        assert arrays[tensor.name].shape == tuple(tensor.shape)
        assert arrays[tensor.name].dtype == DATATYPES[tensor.datatype]
