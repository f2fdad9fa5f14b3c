"""Every malformed ModelInfer gets its status code and a message that says
what was wrong; arbitrary requests never crash the server; TLS and the
bearer token guard it when configured."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from shared.bus.topics import ensure_topics
from shared.contracts.inference import grpc_predict_v2_pb2 as pb
from shared.contracts.inference import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.infra import Infra
from tests.integration import model_support as ms
from tests.integration.test_grpc import _make_certificates

pytestmark = pytest.mark.integration

MODEL = "digits"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(infra: Infra, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ms.ServerThread]:
    root = tmp_path_factory.mktemp("model-requests")
    artifact = ms.export_torch(root / "torch")
    model_settings = ms.settings(infra, root, uuid.uuid4().hex[:12])
    ensure_topics(model_settings.kafka, model_settings.topic_specs())
    ms.publish(infra, model_settings.models_topic, ms.event(MODEL, 1, artifact))
    running = ms.ServerThread(model_settings)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stub(server: ms.ServerThread) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    yield from ms.stub(server.address)


def good() -> pb.ModelInferRequest:
    return ms.infer_request(MODEL, ms.digits(2))


def _edit(change: Callable[[pb.ModelInferRequest], None]) -> pb.ModelInferRequest:
    request = good()
    change(request)
    return request


def _typed_and_raw(r: pb.ModelInferRequest) -> None:
    r.raw_input_contents.append(np.zeros((2, 8, 8), "<f4").tobytes())


def _raw_length(r: pb.ModelInferRequest) -> None:
    r.inputs[0].ClearField("contents")
    r.raw_input_contents.append(b"\0" * 10)


def _wrong_datatype(r: pb.ModelInferRequest) -> None:
    r.inputs[0].datatype = "INT64"
    r.inputs[0].ClearField("contents")
    r.inputs[0].contents.int64_contents.extend([1] * 128)


def _wrong_count(r: pb.ModelInferRequest) -> None:
    del r.inputs[0].contents.fp32_contents[-5:]


def _entity_and_inputs(r: pb.ModelInferRequest) -> None:
    r.parameters["entity_id"].string_param = "sensor-1"


def _entity_not_a_string(r: pb.ModelInferRequest) -> None:
    del r.inputs[:]
    r.parameters["entity_id"].int64_param = 7


CASES: list[tuple[str, pb.ModelInferRequest, grpc.StatusCode, str]] = [
    ("unknown model", pb.ModelInferRequest(model_name="nope"), grpc.StatusCode.NOT_FOUND, "nope"),
    (
        "version not loaded",
        ms.infer_request(MODEL, ms.digits(1), version="7"),
        grpc.StatusCode.NOT_FOUND,
        "no version 7",
    ),
    (
        "version not a number",
        ms.infer_request(MODEL, ms.digits(1), version="latest"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "positive integer",
    ),
    ("wrong datatype", _edit(_wrong_datatype), grpc.StatusCode.INVALID_ARGUMENT, "FP32"),
    (
        "wrong shape",
        _edit(lambda r: r.inputs[0].shape.__setitem__(2, 7)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input",
    ),
    ("element count", _edit(_wrong_count), grpc.StatusCode.INVALID_ARGUMENT, "input"),
    ("raw and typed", _edit(_typed_and_raw), grpc.StatusCode.INVALID_ARGUMENT, "raw"),
    ("raw byte length", _edit(_raw_length), grpc.StatusCode.INVALID_ARGUMENT, "input"),
    (
        "missing input",
        _edit(lambda r: r.ClearField("inputs")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input",
    ),
    (
        "unknown input",
        _edit(lambda r: setattr(r.inputs[0], "name", "pixels")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "pixels",
    ),
    (
        "unknown output",
        _edit(lambda r: r.outputs.add(name="logits")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "logits",
    ),
    (
        "entity and inputs",
        _edit(_entity_and_inputs),
        grpc.StatusCode.INVALID_ARGUMENT,
        "entity_id",
    ),
    (
        "entity not a string",
        _edit(_entity_not_a_string),
        grpc.StatusCode.INVALID_ARGUMENT,
        "entity_id",
    ),
]


@pytest.mark.parametrize(
    ("request_", "code", "mentions"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_a_malformed_request_gets_its_status_code(
    stub: pb_grpc.GRPCInferenceServiceStub,
    request_: pb.ModelInferRequest,
    code: grpc.StatusCode,
    mentions: str,
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request_, timeout=30)
    assert refused.value.code() == code
    assert mentions in (refused.value.details() or "")
    # And the server still answers a good one.
    assert stub.ModelInfer(good(), timeout=30).model_version == "1"


def test_model_ready_and_metadata_name_unknown_models(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    assert stub.ModelReady(pb.ModelReadyRequest(name=MODEL)).ready
    assert not stub.ModelReady(pb.ModelReadyRequest(name=MODEL, version="9")).ready
    for call in (
        lambda: stub.ModelReady(pb.ModelReadyRequest(name="nope")),
        lambda: stub.ModelMetadata(pb.ModelMetadataRequest(name="nope")),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_response_echoes_the_request_id_and_mirrors_raw_contents(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    typed = good()
    typed.id = "req-42"
    response = stub.ModelInfer(typed)
    assert response.id == "req-42"
    assert response.parameters["request_id"].string_param == "req-42"
    assert response.outputs[0].contents.fp32_contents and not response.raw_output_contents
    raw = ms.infer_request(MODEL, ms.digits(2), raw=True)
    response = stub.ModelInfer(raw)
    assert response.raw_output_contents and not response.outputs[0].HasField("contents")
    np.testing.assert_allclose(
        ms.probabilities(response), ms.probabilities(stub.ModelInfer(good())), rtol=1e-6
    )


_DATATYPES = ["FP32", "FP64", "FP16", "INT64", "INT32", "INT8", "UINT8", "BOOL", "BYTES", "X"]
_FIELDS = {
    "fp32_contents": st.floats(width=32, allow_nan=True),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "bytes_contents": st.binary(max_size=8),
    "bool_contents": st.booleans(),
}


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(
        model_name=draw(st.sampled_from([MODEL, MODEL, MODEL, "", "other"])),
        model_version=draw(st.sampled_from(["", "", "1", "2", "0", "-1", "x"])),
        id=draw(st.text(max_size=8)),
    )
    for _ in range(draw(st.integers(0, 2))):
        tensor = request.inputs.add(
            name=draw(st.sampled_from(["input", "input", "other", ""])),
            datatype=draw(st.sampled_from(_DATATYPES)),
            shape=draw(st.lists(st.integers(-2, 9), max_size=4)),
        )
        if draw(st.booleans()):
            field = draw(st.sampled_from(sorted(_FIELDS)))
            getattr(tensor.contents, field).extend(draw(st.lists(_FIELDS[field], max_size=140)))
    for _ in range(draw(st.integers(0, 2))):
        request.raw_input_contents.append(draw(st.binary(max_size=600)))
    for _ in range(draw(st.integers(0, 1))):
        request.outputs.add(name=draw(st.sampled_from(["probabilities", "nope"])))
    if draw(st.booleans()):
        request.parameters["entity_id"].string_param = draw(st.text(max_size=5))
    return request


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=infer_requests())
def test_arbitrary_requests_never_crash_the_server(
    stub: pb_grpc.GRPCInferenceServiceStub, request: pb.ModelInferRequest
) -> None:
    try:
        stub.ModelInfer(request, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() in {
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.FAILED_PRECONDITION,
        }, (exc.code(), exc.details())
    assert stub.ServerLive(pb.ServerLiveRequest()).live


def test_tls_and_the_bearer_token_guard_the_server(
    infra: Infra, tmp_path: Path, server: ms.ServerThread
) -> None:
    ca_file, cert_file, key_file = _make_certificates(tmp_path)
    guarded = ms.ServerThread(
        server.settings.model_copy(
            update={
                "tls_cert_file": cert_file,
                "tls_key_file": key_file,
                "auth_token": SecretStr("s3cret"),
                "artifact_cache_dir": tmp_path / "cache",
            }
        )
    )
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca_file.read_bytes())
        with grpc.secure_channel(
            guarded.address.replace("127.0.0.1", "localhost"), credentials
        ) as channel:
            tls_stub = pb_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                tls_stub.ModelInfer(good(), timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            response = tls_stub.ModelInfer(
                good(), timeout=30, metadata=(("authorization", "Bearer s3cret"),)
            )
            assert response.model_version == "1"
    finally:
        guarded.stop()


def predict_command(target: str, *tls: str) -> subprocess.CompletedProcess[str]:
    """``aistack predict`` (tritonclient: a process of its own, which owns ``inference``)."""
    example = json.dumps(ms.digits(1).tolist())
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "aistack.cli",
            "predict",
            MODEL,
            "--input",
            example,
            "--url",
            target,
            "--token",
            "s3cret",
            *tls,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_mutual_tls_serves_the_client_with_a_certificate_and_refuses_one_without(
    infra: Infra, tmp_path: Path, server: ms.ServerThread
) -> None:
    ca_file, cert_file, key_file = _make_certificates(tmp_path / "server")
    clients_ca, client_cert, client_key = _make_certificates(tmp_path / "client", "clients CA")
    guarded = ms.ServerThread(
        server.settings.model_copy(
            update={
                "tls_cert_file": cert_file,
                "tls_key_file": key_file,
                "tls_client_ca_file": clients_ca,
                "auth_token": SecretStr("s3cret"),
                "artifact_cache_dir": tmp_path / "cache",
            }
        )
    )
    try:
        target = guarded.address.replace("127.0.0.1", "localhost")
        served = predict_command(
            target, "--tls-ca", str(ca_file), "--tls-cert", str(client_cert), "--tls-key",
            str(client_key),
        )  # fmt: skip
        assert served.returncode == 0, served.stderr
        assert f"model {MODEL} version 1" in served.stdout
        refused = predict_command(target, "--tls-ca", str(ca_file))
        assert refused.returncode != 0 and "UNAVAILABLE" in refused.stderr, refused.stderr
    finally:
        guarded.stop()
