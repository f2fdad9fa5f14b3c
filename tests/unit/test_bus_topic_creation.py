"""Topic creation asks again when a request dies with its connection.

librdkafka drops the bootstrap connection an admin request went out on once
it has learned a fresh cluster's brokers; the request then fails with
_DESTROY_BROKER although the topic may or may not exist (CI saw this on a
three-broker cluster). The admin below answers as librdkafka did there.
"""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from shared.bus import topics
from shared.errors import FailedPrecondition, Unavailable


class ScriptedAdmin:
    """Answers each create_topics call with the next round of errors (None: created)."""

    def __init__(self, rounds: list[dict[str, int | None]]) -> None:
        self.rounds = rounds
        self.asked: list[list[str]] = []

    def create_topics(self, new: list[NewTopic], request_timeout: float) -> dict[str, Future]:
        self.asked.append([t.topic for t in new])
        answers = self.rounds.pop(0)
        futures: dict[str, Future] = {}
        for topic in new:
            future: Future = Future()
            code = answers.get(topic.topic)
            if code is None:
                future.set_result(None)
            else:
                future.set_exception(KafkaException(KafkaError(code)))
            futures[topic.topic] = future
        return futures


def _new(*names: str) -> list[NewTopic]:
    return [NewTopic(n, num_partitions=1, replication_factor=1) for n in names]


def test_a_request_lost_with_its_connection_is_asked_again_and_its_topic_counts() -> None:
    admin = ScriptedAdmin(
        [
            {"a": KafkaError._DESTROY_BROKER, "b": None},
            # the lost request had reached the controller after all
            {"a": KafkaError.TOPIC_ALREADY_EXISTS},
        ]
    )
    outcome = topics._create(admin, _new("a", "b"), timeout=5.0)  # type: ignore[arg-type]
    assert outcome == {"a": "exists", "b": "created"}
    assert admin.asked == [["a", "b"], ["a"]]


def test_a_lost_request_the_controller_never_saw_creates_on_the_next_try() -> None:
    admin = ScriptedAdmin([{"a": KafkaError.NOT_CONTROLLER}, {}])
    assert topics._create(admin, _new("a"), timeout=5.0) == {"a": "created"}  # type: ignore[arg-type]


def test_a_refusal_is_not_asked_again() -> None:
    admin = ScriptedAdmin([{"a": KafkaError.INVALID_REPLICATION_FACTOR}])
    with pytest.raises(FailedPrecondition, match="cannot create topic a"):
        topics._create(admin, _new("a"), timeout=5.0)  # type: ignore[arg-type]
    assert admin.asked == [["a"]]


def test_a_connection_that_keeps_dying_is_unavailable_after_the_timeout() -> None:
    admin = ScriptedAdmin([{"a": KafkaError._DESTROY_BROKER}] * 100)
    with pytest.raises(Unavailable, match="cannot create topic a in time"):
        topics._create(admin, _new("a"), timeout=0.3)  # type: ignore[arg-type]
    assert 1 < len(admin.asked) < 100
