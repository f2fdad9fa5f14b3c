from __future__ import annotations

import grpc

from shared.errors import (
    AistackError,
    ConfigError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    UndecodableRecord,
)
from shared.rpc.errors import reason_for, status_for


class InvalidTensor(InvalidArgument):
    reason = "invalid_tensor"


def test_errors_map_through_their_nearest_class() -> None:
    assert status_for(InvalidTensor("expected FP32")) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_for(NotFound("no model")) == grpc.StatusCode.NOT_FOUND
    assert status_for(ResourceExhausted("busy")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_for(Unavailable("down")) == grpc.StatusCode.UNAVAILABLE
    assert status_for(ConfigError("x")) == grpc.StatusCode.FAILED_PRECONDITION
    assert status_for(AistackError("?")) == grpc.StatusCode.INTERNAL
    assert status_for(ValueError("bug")) == grpc.StatusCode.INTERNAL


def test_every_error_has_a_reason() -> None:
    assert reason_for(InvalidTensor("x")) == "invalid_tensor"
    assert reason_for(NotFound("x", reason="model_not_found")) == "model_not_found"
    assert reason_for(KeyError("x")) == "internal"
    record = UndecodableRecord(
        "bad", topic="t", partition=0, offset=1, value=b"", key=None, headers=[]
    )
    assert status_for(record) == grpc.StatusCode.INVALID_ARGUMENT
