"""A grpc.aio server with what every aistack server has: the standard health
service, reflection, optional TLS, bearer-token auth and error mapping."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from shared.errors import ConfigError
from shared.log import get_logger
from shared.rpc.errors import REASON_METADATA_KEY, reason_for, status_for

log = get_logger(__name__)

HEALTH_METHODS = frozenset(
    {"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch", "/grpc.health.v1.Health/List"}
)


@dataclass(frozen=True)
class ServerOptions:
    address: str
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # When set, clients must present a certificate signed by this CA (mTLS).
    tls_client_ca_file: Path | None = None
    auth_token: str | None = None
    # Probes (kubelet, load balancers) carry no token.
    auth_exempt: frozenset[str] = field(default=HEALTH_METHODS)
    max_message_bytes: int = 64 * 1024 * 1024
    max_concurrent_rpcs: int | None = None

    def credentials(self) -> grpc.ServerCredentials | None:
        if self.tls_cert_file is None and self.tls_key_file is None:
            return None
        if self.tls_cert_file is None or self.tls_key_file is None:
            raise ConfigError("TLS needs both a certificate and a key file")
        chain = (self.tls_key_file.read_bytes(), self.tls_cert_file.read_bytes())
        client_ca = self.tls_client_ca_file.read_bytes() if self.tls_client_ca_file else None
        return grpc.ssl_server_credentials(
            [chain], root_certificates=client_ca, require_client_auth=client_ca is not None
        )


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without ``authorization: Bearer <token>`` (UNAUTHENTICATED)."""

    def __init__(self, token: str, exempt: Iterable[str]) -> None:
        self._expected = f"Bearer {token}".encode()
        self._exempt = frozenset(exempt)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if details.method in self._exempt:
            return await continuation(details)
        presented = dict(details.invocation_metadata or ()).get("authorization", "")
        if isinstance(presented, str):
            presented = presented.encode()
        if hmac.compare_digest(presented, self._expected):
            return await continuation(details)
        # What the operator reads; the token itself, right or wrong, never.
        log.warning(
            "rpc.unauthenticated",
            method=details.method,
            why="a wrong bearer token" if presented else "no bearer token",
        )
        handler = await continuation(details)
        return _refusing(handler, "missing or wrong bearer token")


def _refusing(handler: grpc.RpcMethodHandler | None, message: str) -> grpc.RpcMethodHandler:
    async def abort(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def abort_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - makes this an async generator

    if handler is None:
        return grpc.unary_unary_rpc_method_handler(abort)
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(abort, **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(abort_stream, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(abort, **kwargs)
    return grpc.stream_stream_rpc_method_handler(abort_stream, **kwargs)


def mapping_errors(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """``handler`` with AistackError (and anything unexpected) turned into a status code.

    The servicer raises domain errors; this maps them through
    ``shared.rpc.errors.STATUS_BY_ERROR`` and puts the reason in trailing
    metadata. Unexpected exceptions become INTERNAL and are logged.
    """
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(
            _wrap_unary(handler.unary_unary, method), **kwargs
        )
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(
            _wrap_unary(handler.stream_unary, method), **kwargs
        )
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            _wrap_stream(handler.unary_stream, method), **kwargs
        )
    return grpc.stream_stream_rpc_method_handler(
        _wrap_stream(handler.stream_stream, method), **kwargs
    )


class _ErrorMappingRegistrar:
    """The server as ``register`` and the health and reflection services see
    it: every handler they add maps errors (``mapping_errors``), wrapped once
    as it is added. An interceptor did this per call (an awaited hook and a
    handler built afresh): on a server answering ModelInfer with a constant,
    0.04 ms more server CPU and 0.05 ms more p50 a call (medians of six runs,
    grpc 1.81, 2 cores)."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_MappedGenericHandler(h) for h in handlers))

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        # grpc.aio (1.81) ignores these and serves the generic handlers that
        # generated code adds as well; mapped too, for a grpc that does not.
        self._server.add_registered_method_handlers(
            service, {name: mapping_errors(h, f"/{service}/{name}") for name, h in handlers.items()}
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class _MappedGenericHandler(grpc.GenericRpcHandler):
    """A generic handler whose method handlers map errors, each wrapped once."""

    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner
        self._mapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(details)
        if handler is None:
            return None
        method = details.method
        known = self._mapped.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        mapped = mapping_errors(handler, method)
        self._mapped[method] = (handler, mapped)
        return mapped


async def _abort_for(error: Exception, context: grpc.aio.ServicerContext, method: str) -> None:
    code = status_for(error)
    reason = reason_for(error)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("rpc.failed", method=method, reason=reason)
        message = "internal error"
    else:
        log.info("rpc.rejected", method=method, code=code.name, reason=reason, error=str(error))
        message = str(error)
    context.set_trailing_metadata(((REASON_METADATA_KEY, reason),))
    await context.abort(code, message)


def _wrap_unary(behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behaviour(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort_for(exc, context, method)

    return call


def _wrap_stream(behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            async for response in behaviour(request, context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort_for(exc, context, method)

    return call


@dataclass
class RunningServer:
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int

    async def stop(self, grace: float = 5.0) -> None:
        """Report NOT_SERVING, then let in-flight calls finish for ``grace`` s."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start_server(
    options: ServerOptions,
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
) -> RunningServer:
    """Build, register and start a server; returns it with its bound port.

    ``register`` adds the service's servicers; ``service_names`` are their full
    names, reported SERVING by the health service and listed by reflection.
    """
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if options.auth_token:
        interceptors.append(TokenAuthInterceptor(options.auth_token, options.auth_exempt))
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", options.max_message_bytes),
            ("grpc.max_send_message_length", options.max_message_bytes),
        ],
        maximum_concurrent_rpcs=options.max_concurrent_rpcs,
    )
    registrar: Any = _ErrorMappingRegistrar(server)
    register(registrar)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, registrar)
    # The asyncio servicer: enable_server_reflection picks it only for a grpc.aio.Server itself.
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection.aio.ReflectionServicer(
            [*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
        ),
        registrar,
    )
    credentials = options.credentials()
    if credentials is None:
        port = server.add_insecure_port(options.address)
    else:
        port = server.add_secure_port(options.address, credentials)
    if port == 0:
        raise ConfigError(f"cannot listen on {options.address}: address in use or invalid")
    await server.start()
    for name in (*service_names, ""):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    if options.auth_token and credentials is None:
        # Anyone on the path reads a bearer token sent in the clear, then replays it.
        log.warning(
            "grpc.token_in_clear",
            address=options.address,
            why="a bearer token is checked but the server has no TLS: set the TLS_CERT_FILE "
            "and TLS_KEY_FILE settings",
        )
    log.info(
        "grpc.listening",
        address=options.address,
        port=port,
        tls=credentials is not None,
        mutual_tls=options.tls_client_ca_file is not None,
    )
    return RunningServer(server=server, health=health_servicer, port=port)
