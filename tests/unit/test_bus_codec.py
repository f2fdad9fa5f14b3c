from __future__ import annotations

import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.bus import envelope
from shared.bus.codec import decode, type_name
from shared.bus.deadletter import dead_letter_headers, from_undecodable
from shared.contracts.aistack.v1 import events_pb2, tuning_pb2
from shared.errors import UndecodableRecord
from tests.seeding import after_the_same_seed

TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-01$")


@given(
    headers=st.lists(
        st.tuples(
            st.sampled_from(["content-type", "traceparent", "ce_id", "x-other"]),
            st.none() | st.binary(max_size=12) | st.sampled_from([b"application/json"]),
        ),
        max_size=5,
    )
)
def test_content_type_and_trace_read_what_parse_headers_reads(
    headers: list[tuple[str, bytes | None]],
) -> None:
    found = envelope.parse_headers(headers)
    assert envelope.content_type_and_trace(headers) == (found.content_type, found.traceparent)


def test_headers_carry_the_envelope() -> None:
    template = envelope.HeaderTemplate(type_name(events_pb2.CleanEvent), "svc_ingest")
    headers = template.build("ev-1", "00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    parsed = envelope.parse_headers(headers)
    assert parsed == envelope.Envelope(
        content_type="application/x-protobuf",
        message_type="aistack.v1.CleanEvent",
        event_id="ev-1",
        source="svc_ingest",
        traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
    )
    assert ("ce_specversion", b"1.0") in headers


def test_traceparents_are_w3c() -> None:
    parent = envelope.new_traceparent()
    child = envelope.child_traceparent(parent)
    assert TRACEPARENT.match(parent) and TRACEPARENT.match(child)
    assert child.split("-")[1] == parent.split("-")[1]
    assert child.split("-")[2] != parent.split("-")[2]
    assert TRACEPARENT.match(envelope.child_traceparent("garbage"))


def test_a_traceparent_header_is_a_fresh_trace_or_the_parents_continued() -> None:
    fresh = envelope.traceparent_header("").decode()
    assert TRACEPARENT.match(fresh)
    assert envelope.traceparent_header("").decode() != fresh
    child = envelope.traceparent_header(fresh).decode()
    assert TRACEPARENT.match(child)
    assert child.split("-")[1] == fresh.split("-")[1] and child != fresh
    assert TRACEPARENT.match(envelope.traceparent_header("garbage").decode())


def test_a_fresh_traceparent_never_has_an_all_zero_id(monkeypatch: pytest.MonkeyPatch) -> None:
    # W3C forbids an all-zero trace or span id: such draws are drawn again.
    trace_id, span_id = 0x0123456789ABCDEF0123456789ABCDEF, 0xFEDCBA9876543210
    draws = iter([span_id, trace_id << 64, (trace_id << 64) | span_id])
    monkeypatch.setattr(envelope, "_bits", lambda bits: next(draws))
    assert envelope.traceparent_header("") == f"00-{trace_id:032x}-{span_id:016x}-01".encode()


def test_encoded_headers_are_the_text_ones_encoded() -> None:
    template = envelope.HeaderTemplate("aistack.v1.CleanEvent", "svc_ingest")
    trace = envelope.new_traceparent()
    assert template.build_encoded(b"id-1", trace.encode()) == template.build("id-1", trace)


def test_ids_do_not_follow_a_seed_given_to_the_random_module() -> None:
    # A user's code (or Keras' set_random_seed) seeding the random module in
    # a process that publishes must not make its event ids repeat.
    first, second = after_the_same_seed(
        lambda: (envelope.new_event_id(), envelope.new_traceparent())
    )
    assert first[0] != second[0] and first[1] != second[1]


def test_a_forked_child_draws_other_ids_than_its_parent() -> None:
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, then out at once
        try:
            os.write(writing, envelope.new_event_id().encode())
        finally:
            os._exit(0)
    os.close(writing)
    parents = envelope.new_event_id()
    with os.fdopen(reading, "rb") as pipe:
        childs = pipe.read().decode()
    os.waitpid(pid, 0)
    assert len(childs) == 32 and childs != parents


def _decode(value: bytes | None, headers: list[tuple[str, bytes]]) -> events_pb2.CleanEvent:
    return decode(
        events_pb2.CleanEvent, value, headers, topic="t", partition=2, offset=41, key=b"k"
    )


def test_decode_returns_the_message() -> None:
    event = events_pb2.CleanEvent(event_id="e", entity_id="dev-1")
    headers = envelope.HeaderTemplate(type_name(events_pb2.CleanEvent), "x").build("e", "tp")
    assert _decode(event.SerializeToString(), headers) == event


@pytest.mark.parametrize(
    ("value", "headers", "reason"),
    [
        (b"\xff\xff\xff", [], "invalid_protobuf"),
        (None, [], "no_value"),
        (b"", [("ce_type", b"aistack.v1.TrialReport")], "wrong_message_type"),
        (b"{}", [("content-type", b"application/json")], "wrong_content_type"),
    ],
)
def test_undecodable_record_is_one_typed_error_with_its_position(
    value: bytes | None, headers: list[tuple[str, bytes]], reason: str
) -> None:
    with pytest.raises(UndecodableRecord) as caught:
        _decode(value, headers)
    error = caught.value
    assert (error.topic, error.partition, error.offset, error.reason) == ("t", 2, 41, reason)
    assert error.value == value and error.headers == headers and error.key == b"k"
    assert "t[2]@41" in str(error)


def test_dead_letter_keeps_original_bytes_headers_and_position() -> None:
    with pytest.raises(UndecodableRecord) as caught:
        _decode(b"\xff\x01", [("ce_id", b"x1")])
    letter = from_undecodable(caught.value, service="svc_test")
    assert letter.original_value == b"\xff\x01"
    assert letter.original_key == b"k"
    assert [(h.key, h.value) for h in letter.original_headers] == [("ce_id", b"x1")]
    assert (letter.source.topic, letter.source.partition, letter.source.offset) == ("t", 2, 41)
    assert letter.reason == "invalid_protobuf" and letter.service == "svc_test"
    assert dead_letter_headers(letter) == [("error", b"invalid_protobuf"), ("source", b"t/2/41")]


def test_unknown_fields_from_a_newer_producer_are_accepted() -> None:
    newer = tuning_pb2.TrialControl(trial_id="t").SerializeToString() + b"\xa0\x06\x01"  # field 100
    parsed = decode(tuning_pb2.TrialControl, newer, [], topic="c", partition=0, offset=0)
    assert parsed.trial_id == "t"


def test_fresh_headers_have_a_new_event_id_and_trace() -> None:
    template = envelope.HeaderTemplate("aistack.v1.TrialReport", "svc_trainer")
    first_id, first = template.build_fresh()
    second_id, _ = template.build_fresh()
    parsed = envelope.parse_headers(first)
    assert parsed.event_id == first_id and len(first_id) == 32 and first_id != second_id
    assert TRACEPARENT.match(parsed.traceparent)
    assert parsed.message_type == "aistack.v1.TrialReport" and parsed.source == "svc_trainer"


def test_fresh_headers_formatted_at_once_are_the_same_envelope() -> None:
    template = envelope.HeaderTemplate("aistack.v1.PredictionLogged", "svc_model")
    first, second = (
        envelope.parse_headers(template.fresh()),
        envelope.parse_headers(template.fresh()),
    )
    _, built = template.build_fresh()
    assert [key for key, _ in template.fresh()] == [key for key, _ in built]
    assert re.fullmatch("[0-9a-f]{32}", first.event_id) and first.event_id != second.event_id
    assert TRACEPARENT.match(first.traceparent) and first.traceparent != second.traceparent
    assert first.message_type == "aistack.v1.PredictionLogged" and first.source == "svc_model"
