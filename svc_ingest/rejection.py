"""Why a raw record is not accepted: a reason code and a message for people."""

from __future__ import annotations

from shared.errors import AistackError

# Every reason code svc_ingest writes on a dead letter (DeadLetter.reason and
# the ``error`` header). Producers and dashboards may rely on these names.
REASONS = frozenset(
    {
        "empty",  # a zero-length value
        "null_value",  # no value at all: a tombstone
        "too_large",  # over AISTACK_INGEST_MAX_PAYLOAD_BYTES
        "invalid_utf8",
        "byte_order_mark",  # JSON must not start with a BOM (RFC 8259 §8.1)
        "unsupported_content_type",
        "invalid_json",
        "duplicate_key",  # the same key twice in one JSON object
        "not_an_object",  # JSON that is an array, string, number…
        "too_deep",  # nesting over AISTACK_INGEST_MAX_NESTING_DEPTH
        "non_finite",  # NaN or ±Infinity
        "invalid_protobuf",
        "malformed_log_line",  # text that is neither an access-log line nor line protocol
        "malformed_line_protocol",  # InfluxDB line protocol that does not parse
        "unknown_event_kind",  # neither a sensor reading nor a web request
        "missing_field",
        "invalid_type",
        "invalid_field",  # right type, impossible value (bad IP, status 700…)
        "invalid_timestamp",
        "future_timestamp",
        "unknown_unit",
        "unit_mismatch",
        "out_of_range",
    }
)


class RecordRejected(AistackError):
    """A raw record cannot be accepted; it becomes a dead letter with ``reason``.

    Not ``shared.bus.codec.Rejected`` (an envelope the bus cannot decode): this
    one is a record the cleaner refuses, and takes its reason code first.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, reason=reason)
