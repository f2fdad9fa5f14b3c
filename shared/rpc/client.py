"""Client channels that match the servers: TLS and the bearer token."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from shared.errors import ConfigError


class _BearerToken:
    # An interceptor rather than call credentials: those need TLS, and a
    # token on a plaintext loopback channel is still wanted in tests and demos.
    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(*self._header)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _UnaryUnaryToken(_BearerToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return await continuation(self._with_token(details), request)


class _UnaryStreamToken(_BearerToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return await continuation(self._with_token(details), request)


class _StreamUnaryToken(_BearerToken, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Callable[..., Any], details: Any, requests: Any
    ) -> Any:
        return await continuation(self._with_token(details), requests)


class _StreamStreamToken(_BearerToken, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: Any, requests: Any
    ) -> Any:
        return await continuation(self._with_token(details), requests)


def _token_interceptors(token: str) -> list[Any]:
    """One interceptor per kind of call: grpc.aio files an interceptor under
    the first kind it implements only (an ``elif`` chain), so one object for
    all four would send the token on unary-unary calls alone."""
    kinds = (_UnaryUnaryToken, _UnaryStreamToken, _StreamUnaryToken, _StreamStreamToken)
    return [kind(token) for kind in kinds]


def open_channel(
    target: str,
    *,
    tls_ca_file: Path | None = None,
    tls_server_name: str | None = None,
    tls_cert_file: Path | None = None,
    tls_key_file: Path | None = None,
    token: str | None = None,
    max_message_bytes: int = 64 * 1024 * 1024,
) -> grpc.aio.Channel:
    """An aio channel to ``target``; TLS when a CA file is given, presenting
    ``tls_cert_file`` and its key to a server that asks for a client
    certificate (mutual TLS)."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
    if tls_server_name:
        options.append(("grpc.ssl_target_name_override", tls_server_name))
    interceptors = _token_interceptors(token) if token else None
    if tls_ca_file is None:
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    credentials = _credentials(tls_ca_file, tls_cert_file, tls_key_file)
    return grpc.aio.secure_channel(target, credentials, options=options, interceptors=interceptors)


class _SyncBearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        return _CallDetails(
            details.method,
            details.timeout,
            [*(details.metadata or ()), self._header],
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return continuation(self._with_token(details), request)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(
        self,
        method: str,
        timeout: float | None,
        metadata: Any,
        credentials: Any,
        wait_for_ready: Any,
        compression: Any,
    ) -> None:
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression


def _credentials(
    ca_file: Path, cert_file: Path | None, key_file: Path | None
) -> grpc.ChannelCredentials:
    if (cert_file is None) != (key_file is None):
        raise ConfigError("a client certificate needs both its certificate and its key file")
    return grpc.ssl_channel_credentials(
        root_certificates=ca_file.read_bytes(),
        private_key=key_file.read_bytes() if key_file else None,
        certificate_chain=cert_file.read_bytes() if cert_file else None,
    )


def open_sync_channel(
    target: str,
    *,
    tls_ca_file: Path | None = None,
    tls_cert_file: Path | None = None,
    tls_key_file: Path | None = None,
    token: str | None = None,
    max_message_bytes: int = 64 * 1024 * 1024,
) -> grpc.Channel:
    """A blocking channel to ``target`` (for scripts and notebooks, where an
    event loop may already run); TLS when a CA file is given."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
    if tls_ca_file is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        credentials = _credentials(tls_ca_file, tls_cert_file, tls_key_file)
        channel = grpc.secure_channel(target, credentials, options=options)
    if token:
        return grpc.intercept_channel(channel, _SyncBearerToken(token))
    return channel


@dataclass(frozen=True)
class Endpoint:
    """Where a gRPC server answers and how to reach it: its CA (TLS) and token."""

    target: str
    tls_ca_file: Path | None = None
    token: str | None = None

    def open(self) -> grpc.aio.Channel:
        return open_channel(self.target, tls_ca_file=self.tls_ca_file, token=self.token)

    def open_sync(self) -> grpc.Channel:
        return open_sync_channel(self.target, tls_ca_file=self.tls_ca_file, token=self.token)
