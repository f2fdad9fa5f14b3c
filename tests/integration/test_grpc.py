"""The shared gRPC server and client against each other over real sockets."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from shared.errors import InvalidArgument
from shared.rpc.client import open_channel, open_sync_channel
from shared.rpc.errors import REASON_METADATA_KEY
from shared.rpc.server import ServerOptions, start_server

ECHO = "/aistack.test.Echo/Say"


class BadTensor(InvalidArgument):
    reason = "bad_tensor"


async def _say(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    if request == b"bad":
        raise BadTensor("expected FP32, got INT8")
    if request == b"bug":
        raise KeyError("a bug")
    return b"echo:" + request


async def _count(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for i in range(3):
        yield request + str(i).encode()
    if request == b"bad":
        raise BadTensor("the stream's fourth item is INT8")


def _register(server: grpc.aio.Server) -> None:
    handler = grpc.method_handlers_generic_handler(
        "aistack.test.Echo",
        {
            "Say": grpc.unary_unary_rpc_method_handler(_say),
            "Count": grpc.unary_stream_rpc_method_handler(_count),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    # As generated code registers a service (grpc >= 1.62): both ways.
    registered = {"Say": grpc.unary_unary_rpc_method_handler(_say)}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("aistack.test.Registered", registered),)
    )
    server.add_registered_method_handlers("aistack.test.Registered", registered)


def run(options: ServerOptions, client: Callable[[str], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        server = await start_server(options, _register, ["aistack.test.Echo"])
        try:
            return await client(f"localhost:{server.port}")
        finally:
            await server.stop(0)

    return asyncio.run(main())


async def _call(channel: grpc.aio.Channel, payload: bytes) -> bytes:
    say = channel.unary_unary(ECHO)
    return bytes(await say(payload, timeout=10))


def test_health_reports_serving() -> None:
    async def client(target: str) -> list[int]:
        async with open_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            overall = await stub.Check(health_pb2.HealthCheckRequest(service=""))
            echo = await stub.Check(health_pb2.HealthCheckRequest(service="aistack.test.Echo"))
            return [overall.status, echo.status]

    serving = health_pb2.HealthCheckResponse.SERVING
    assert run(ServerOptions(address="127.0.0.1:0"), client) == [serving, serving]


def test_call_without_token_is_refused_and_with_it_passes() -> None:
    async def client(target: str) -> tuple[grpc.StatusCode, bytes, grpc.StatusCode, int]:
        async with open_channel(target) as anonymous:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _call(anonymous, b"hi")
            # Probes carry no token: health stays open.
            health = await health_pb2_grpc.HealthStub(anonymous).Check(
                health_pb2.HealthCheckRequest()
            )
        async with open_channel(target, token="wrong") as wrong:
            with pytest.raises(grpc.aio.AioRpcError) as wrong_token:
                await _call(wrong, b"hi")
        async with open_channel(target, token="s3cret") as authorised:
            answer = await _call(authorised, b"hi")
        return refused.value.code(), answer, wrong_token.value.code(), health.status

    with capture_logs() as logged:
        code, answer, wrong_code, health = run(
            ServerOptions(address="127.0.0.1:0", auth_token="s3cret"), client
        )
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert wrong_code == grpc.StatusCode.UNAUTHENTICATED
    # The server says why, and shows no token.
    refusals = [e for e in logged if e["event"] == "rpc.unauthenticated"]
    assert [(e["log_level"], e["why"]) for e in refusals] == [
        ("warning", "no bearer token"),
        ("warning", "a wrong bearer token"),
    ]
    assert all(e["method"] == ECHO for e in refusals), refusals
    assert "wrong" not in str(refusals).replace("a wrong bearer token", "")
    assert answer == b"echo:hi"
    assert health == health_pb2.HealthCheckResponse.SERVING


def test_domain_errors_map_to_status_codes_with_a_reason() -> None:
    async def client(target: str) -> list[tuple[grpc.StatusCode, str, str | None]]:
        out = []
        async with open_channel(target) as channel:
            for payload in (b"bad", b"bug"):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await _call(channel, payload)
                error = caught.value
                trailing = dict(error.trailing_metadata() or ())
                out.append((error.code(), error.details(), trailing.get(REASON_METADATA_KEY)))
        return out

    bad, bug = run(ServerOptions(address="127.0.0.1:0"), client)
    assert bad == (grpc.StatusCode.INVALID_ARGUMENT, "expected FP32, got INT8", "bad_tensor")
    assert bug == (grpc.StatusCode.INTERNAL, "internal error", "internal")


def test_errors_map_on_a_service_registered_as_generated_code_does_and_in_streams() -> None:
    async def client(target: str) -> tuple[Any, ...]:
        async with open_channel(target) as channel:
            say = channel.unary_unary("/aistack.test.Registered/Say")
            answer = bytes(await say(b"hi", timeout=10))
            with pytest.raises(grpc.aio.AioRpcError) as unary:
                await say(b"bad", timeout=10)
            count = channel.unary_stream("/aistack.test.Echo/Count")
            items = []
            with pytest.raises(grpc.aio.AioRpcError) as stream:
                async for item in count(b"bad", timeout=10):
                    items.append(bytes(item))
        return answer, unary.value, items, stream.value

    answer, unary, items, stream = run(ServerOptions(address="127.0.0.1:0"), client)
    assert answer == b"echo:hi"
    assert unary.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(unary.trailing_metadata() or ())[REASON_METADATA_KEY] == "bad_tensor"
    assert items == [b"bad0", b"bad1", b"bad2"]
    assert (stream.code(), stream.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "the stream's fourth item is INT8",
    )


def _make_certificates(directory: Path, ca: str = "aistack test CA") -> tuple[Path, Path, Path]:
    """A CA and a certificate for localhost signed by it (a server's or a client's)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca)])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_file, cert_file, key_file = (
        directory / "ca.pem",
        directory / "cert.pem",
        directory / "cert.key",
    )
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_file, cert_file, key_file


def test_a_streaming_call_carries_the_token_on_both_kinds_of_channel() -> None:
    """grpc.aio files a client interceptor under the first kind of call it
    implements: the token once reached unary-unary calls only, and a watched
    study (a server stream) was refused."""

    async def client(target: str) -> tuple[list[bytes], list[bytes]]:
        async with open_channel(target, token="s3cret") as channel:
            streamed = [m async for m in channel.unary_stream("/aistack.test.Echo/Count")(b"a")]
        with open_sync_channel(target, token="s3cret") as sync_channel:
            count = sync_channel.unary_stream("/aistack.test.Echo/Count")
            synced = list(await asyncio.to_thread(lambda: list(count(b"b", timeout=10))))
        return streamed, synced

    streamed, synced = run(ServerOptions(address="127.0.0.1:0", auth_token="s3cret"), client)
    assert streamed == [b"a0", b"a1", b"a2"]
    assert synced == [b"b0", b"b1", b"b2"]


def test_tls_with_a_generated_certificate(tmp_path: Path) -> None:
    ca_file, cert_file, key_file = _make_certificates(tmp_path)

    async def client(target: str) -> tuple[bytes, grpc.StatusCode]:
        async with open_channel(target, tls_ca_file=ca_file, token="t0ken") as channel:
            answer = await _call(channel, b"over tls")
        # A plaintext client cannot talk to the TLS port.
        async with open_channel(target, token="t0ken") as plaintext:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _call(plaintext, b"hi")
        return answer, caught.value.code()

    options = ServerOptions(
        address="127.0.0.1:0", tls_cert_file=cert_file, tls_key_file=key_file, auth_token="t0ken"
    )
    answer, plaintext_code = run(options, client)
    assert answer == b"echo:over tls"
    assert plaintext_code == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_serves_a_client_with_a_certificate_of_its_ca_and_refuses_others(
    tmp_path: Path,
) -> None:
    ca_file, cert_file, key_file = _make_certificates(tmp_path / "server")
    client_ca, client_cert, client_key = _make_certificates(tmp_path / "clients", "clients CA")
    _, stranger_cert, stranger_key = _make_certificates(tmp_path / "stranger", "another CA")

    def blocking_call(target: str) -> bytes:  # aistack.Client's channel
        with open_sync_channel(
            target, tls_ca_file=ca_file, tls_cert_file=client_cert, tls_key_file=client_key
        ) as channel:
            return bytes(channel.unary_unary(ECHO)(b"sync", timeout=10))

    async def client(target: str) -> tuple[bytes, grpc.StatusCode, grpc.StatusCode]:
        async with open_channel(
            target, tls_ca_file=ca_file, tls_cert_file=client_cert, tls_key_file=client_key
        ) as trusted:
            answer = await _call(trusted, b"mutual")
        assert await asyncio.to_thread(blocking_call, target) == b"echo:sync"
        async with open_channel(target, tls_ca_file=ca_file) as anonymous:
            with pytest.raises(grpc.aio.AioRpcError) as no_certificate:
                await _call(anonymous, b"hi")
        async with open_channel(
            target, tls_ca_file=ca_file, tls_cert_file=stranger_cert, tls_key_file=stranger_key
        ) as stranger:
            with pytest.raises(grpc.aio.AioRpcError) as foreign:
                await _call(stranger, b"hi")
        return answer, no_certificate.value.code(), foreign.value.code()

    options = ServerOptions(
        address="127.0.0.1:0",
        tls_cert_file=cert_file,
        tls_key_file=key_file,
        tls_client_ca_file=client_ca,
    )
    answer, without, foreign = run(options, client)
    assert answer == b"echo:mutual"
    # The handshake fails: the client sees the server as unreachable, never a response.
    assert without == foreign == grpc.StatusCode.UNAVAILABLE


def test_a_token_checked_over_plaintext_is_warned_about() -> None:
    async def client(target: str) -> bytes:
        async with open_channel(target, token="s3cret") as channel:
            return await _call(channel, b"hi")

    with capture_logs() as logged:
        assert run(ServerOptions(address="127.0.0.1:0", auth_token="s3cret"), client) == b"echo:hi"
    (warning,) = [e for e in logged if e["event"] == "grpc.token_in_clear"]
    assert warning["log_level"] == "warning" and "TLS_CERT_FILE" in warning["why"]
    with capture_logs() as quiet:
        run(ServerOptions(address="127.0.0.1:0"), client)
    assert not [e for e in quiet if e["event"] == "grpc.token_in_clear"]


def test_reflection_lists_the_services() -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async def client(target: str) -> set[str]:
        async with open_channel(target) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            async for response in stub.ServerReflectionInfo(iter([request])):
                return {s.name for s in response.list_services_response.service}
        return set()

    names = run(ServerOptions(address="127.0.0.1:0"), client)
    assert {"aistack.test.Echo", "grpc.health.v1.Health"} <= names
