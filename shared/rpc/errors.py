"""The one table from aistack errors to gRPC status codes."""

from __future__ import annotations

import grpc

from shared.errors import (
    AistackError,
    AlreadyExists,
    ConfigError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

STATUS_BY_ERROR: dict[type[AistackError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    ConfigError: grpc.StatusCode.FAILED_PRECONDITION,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
}

# Trailing metadata key carrying the error's machine-readable reason.
REASON_METADATA_KEY = "aistack-reason"


def status_for(error: BaseException) -> grpc.StatusCode:
    """The status code for ``error``: its nearest class in the table, else INTERNAL."""
    for cls in type(error).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return grpc.StatusCode.INTERNAL


def reason_for(error: BaseException) -> str:
    return error.reason if isinstance(error, AistackError) else "internal"


def error_for(status: grpc.StatusCode, details: str) -> AistackError:
    """The aistack error a client raises for a call that failed with
    ``status``: the table read backwards (the first class of a code wins),
    AistackError for a code it does not list."""
    for cls, code in STATUS_BY_ERROR.items():
        if code == status:
            return cls(details)
    return AistackError(f"{status.name}: {details}")


def raise_for_status(error: grpc.RpcError) -> None:
    """Raise ``error_for`` a failed blocking call (a ``grpc.RpcError`` that
    is also a ``grpc.Call``)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    raise error_for(code, details or code.name) from error
