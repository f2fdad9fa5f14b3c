"""Which member of a consumer group holds which partitions of a topic, as
the group's coordinator says now.

A producer that picks partitions for its records (the tuner places each
trial where a trainer is free, ``svc_tuner.dispatch``) needs to know whose
partition is whose before any of the group's members has said anything.
Members are named by their ``client.id``: a member that sets it to its own
name (a trainer sets its trainer id) is known by the same name here as in
what it publishes.
"""

from __future__ import annotations

from typing import cast

from confluent_kafka import ConsumerGroupState, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConsumerGroupDescription

from shared.errors import Unavailable

# The group's coordinator is moving or loading (a group just formed, a broker
# restarted): not settled yet, as a rebalance is.
_MOVING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)


def partition_owners(
    admin: AdminClient, group: str, topic: str, *, timeout: float = 2.0
) -> dict[int, str] | None:
    """``topic``'s partitions held in ``group``, each to its member's client
    id; None while the group is rebalancing or its coordinator moving (its
    assignment is not settled) or it has no members. Raises Unavailable when
    the coordinator does not answer within ``timeout`` seconds or refuses
    (no DESCRIBE on the group)."""
    try:
        future = admin.describe_consumer_groups([group], request_timeout=timeout)[group]
        # A ConsumerGroupDescription (types-confluent-kafka says a dict of them).
        described = cast(ConsumerGroupDescription, future.result(timeout=timeout + 1.0))
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and (error.code() in _MOVING or error.retriable()):
            return None
        raise Unavailable(f"consumer group {group!r} could not be described: {exc}") from exc
    except TimeoutError as exc:
        raise Unavailable(f"consumer group {group!r} was not described in {timeout} s") from exc
    if described.state != ConsumerGroupState.STABLE:
        return None
    owners: dict[int, str] = {}
    for member in described.members:
        assignment = member.assignment
        for held in assignment.topic_partitions if assignment is not None else ():
            if held.topic == topic:
                owners[held.partition] = member.client_id
    return owners
