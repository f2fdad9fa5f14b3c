"""The one error hierarchy. Every error carries a machine-readable ``reason``.

Domain code raises these; transports map them in one place each
(``shared.rpc.errors`` for gRPC status codes, dead letters for the bus).
"""

from __future__ import annotations


class AistackError(Exception):
    """Root of every error aistack raises on purpose."""

    reason: str = "internal"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidArgument(AistackError):
    reason = "invalid_argument"


class NotFound(AistackError):
    reason = "not_found"


class AlreadyExists(AistackError):
    reason = "already_exists"


class FailedPrecondition(AistackError):
    reason = "failed_precondition"


class Unauthenticated(AistackError):
    reason = "unauthenticated"


class ResourceExhausted(AistackError):
    reason = "resource_exhausted"


class Unavailable(AistackError):
    """A dependency (broker, Redis, a peer) is down: retry with backoff."""

    reason = "unavailable"


class ConfigError(AistackError):
    """A setting is missing or wrong; start-up stops with one line naming it."""

    reason = "bad_setting"


class UndecodableRecord(InvalidArgument):
    """A Kafka record whose bytes or headers are not the topic's message.

    Carries where the record came from so that the service can dead-letter it
    with the original bytes and headers.
    """

    reason = "undecodable"

    def __init__(
        self,
        message: str,
        *,
        topic: str,
        partition: int,
        offset: int,
        value: bytes | None,
        key: bytes | None,
        headers: list[tuple[str, bytes]],
        reason: str | None = None,
    ) -> None:
        super().__init__(f"{message} (at {topic}[{partition}]@{offset})", reason=reason)
        self.detail = message
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.value = value
        self.key = key
        self.headers = headers
