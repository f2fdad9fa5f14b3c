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
