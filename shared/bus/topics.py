"""Every topic in DESIGN.md, the message it carries, and idempotent creation."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ClusterMetadata,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from google.protobuf.message import Message

from shared.contracts.aistack.v1 import (
    events_pb2,
    features_pb2,
    models_pb2,
    monitoring_pb2,
    predictions_pb2,
    tuning_pb2,
)
from shared.errors import FailedPrecondition, NotFound, Unavailable
from shared.settings import KafkaSettings

EVENTS_RAW = "aistack.events.raw"
EVENTS_CLEAN = "aistack.events.clean"
EVENTS_DLQ = "aistack.events.dlq"
FEATURES_WINDOWS = "aistack.features.windows"
TUNING_TRIALS = "aistack.tuning.trials"
TUNING_REPORTS = "aistack.tuning.reports"
TUNING_CONTROL = "aistack.tuning.control"
TUNING_RESULTS = "aistack.tuning.results"
MODELS_READY = "aistack.models.ready"
PREDICTIONS = "aistack.predictions"
PREDICTIONS_BATCH = "aistack.predictions.batch"
MONITORING_DRIFT = "aistack.monitoring.drift"
LABELS = "aistack.labels"
PREDICTIONS_JOINED = "aistack.predictions.joined"
MONITORING_PERFORMANCE = "aistack.monitoring.performance"
MODELS_DECISIONS = "aistack.models.decisions"

# Raw records over svc_ingest's payload limit must still reach it, to become
# dead letters with a reason rather than producer errors nobody sees; their
# dead letters carry the original bytes, so the dead-letter topic takes them too.
RAW_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
_LARGE = {"max.message.bytes": str(RAW_MAX_MESSAGE_BYTES)}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    # None for aistack.events.raw: producers outside aistack send JSON, log
    # lines or protobuf there, so only svc_ingest decides what a record is.
    message_type: type[Message] | None
    compacted: bool = False
    config: Mapping[str, str] = field(default_factory=dict)

    def named(self, name: str) -> TopicSpec:
        """This topic's spec under another name (a test's or a deployment's own topic)."""
        return replace(self, name=name)

    def topic_config(self) -> dict[str, str]:
        return {"cleanup.policy": "compact" if self.compacted else "delete", **self.config}


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(EVENTS_RAW, None, config=_LARGE),
    TopicSpec(EVENTS_CLEAN, events_pb2.CleanEvent),
    TopicSpec(EVENTS_DLQ, events_pb2.DeadLetter, config=_LARGE),
    TopicSpec(FEATURES_WINDOWS, features_pb2.FeatureWindow),
    TopicSpec(TUNING_TRIALS, tuning_pb2.TrialRequested),
    TopicSpec(TUNING_REPORTS, tuning_pb2.TrialReport),
    TopicSpec(TUNING_CONTROL, tuning_pb2.TrialControl),
    # One result per study: the latest is the one that counts.
    TopicSpec(TUNING_RESULTS, tuning_pb2.StudyResult, compacted=True),
    # The model registry is the log: keep the latest record per model name.
    TopicSpec(
        MODELS_READY,
        models_pb2.ModelReady,
        compacted=True,
        config={"min.cleanable.dirty.ratio": "0.1", "segment.ms": "3600000"},
    ),
    # svc_model's prediction log, and `aistack score --publish`'s rows.
    TopicSpec(PREDICTIONS, predictions_pb2.PredictionLogged),
    TopicSpec(PREDICTIONS_BATCH, predictions_pb2.BatchPrediction),
    # The drift monitor's findings; svc_tuner starts re-tunes from them.
    TopicSpec(MONITORING_DRIFT, monitoring_pb2.DriftDetected),
    # The truth of predictions not fed windows, published by users.
    TopicSpec(LABELS, predictions_pb2.Label),
    # svc_monitor's joiner: each logged prediction settled with its truth
    # (it reads them back at start), and each version's live error.
    TopicSpec(PREDICTIONS_JOINED, predictions_pb2.PredictionJoined),
    TopicSpec(MONITORING_PERFORMANCE, monitoring_pb2.LivePerformance),
    # The champion rule's judgements on live traffic (svc_monitor.champion).
    TopicSpec(MODELS_DECISIONS, monitoring_pb2.ChampionDecision),
)
TOPICS_BY_NAME: Mapping[str, TopicSpec] = {spec.name: spec for spec in TOPICS}

Outcome = Literal["created", "exists", "updated"]


def ensure_topics(
    kafka: KafkaSettings,
    specs: Iterable[TopicSpec] = TOPICS,
    *,
    partitions: int | None = None,
    replication_factor: int | None = None,
    timeout: float = 30.0,
) -> dict[str, Outcome]:
    """Create missing topics and bring existing ones to the spec; safe to repeat.

    An existing topic with fewer partitions is grown (Kafka cannot shrink one:
    more partitions than asked are left alone); its cleanup policy and other
    configured entries are set. Raises Unavailable when the broker does not
    answer within ``timeout``.
    """
    specs = list(specs)
    partitions = partitions or kafka.topic_partitions
    replication_factor = replication_factor or kafka.topic_replication_factor
    admin = AdminClient(kafka.client_config())
    existing = cluster_metadata(admin, timeout, bootstrap=kafka.bootstrap).topics

    outcome: dict[str, Outcome] = {}
    to_create = [
        NewTopic(
            spec.name,
            num_partitions=partitions,
            replication_factor=replication_factor,
            config={**spec.topic_config(), **_insync(kafka, replication_factor)},
        )
        for spec in specs
        if spec.name not in existing
    ]
    if to_create:
        outcome.update(_create(admin, to_create, timeout))

    for spec in specs:
        if spec.name in outcome:
            continue
        replicas = _replicas(existing[spec.name]) or replication_factor
        wanted = {**spec.topic_config(), **_insync(kafka, replicas)}
        outcome[spec.name] = _reconcile(
            admin, spec.name, wanted, existing[spec.name], partitions, timeout
        )
    _await_listed(admin, [spec.name for spec in specs], timeout)
    return outcome


# A request that dies with its connection may or may not have reached the
# controller: on a cluster just started, librdkafka drops the bootstrap
# connection an admin request went out on once it has learned the brokers
# (_DESTROY_BROKER), and a controller may move. Asking again is safe, since a
# topic the lost request did create answers TOPIC_ALREADY_EXISTS.
_TRANSIENT = frozenset(
    {
        KafkaError._DESTROY_BROKER,  # type: ignore[attr-defined]  # not in the stubs
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.NOT_CONTROLLER,
        KafkaError.REQUEST_TIMED_OUT,
    }
)


def _create(admin: AdminClient, topics: list[NewTopic], timeout: float) -> dict[str, Outcome]:
    outcome: dict[str, Outcome] = {}
    deadline = time.monotonic() + timeout
    pending = topics
    while pending:
        retry: list[NewTopic] = []
        results = admin.create_topics(pending, request_timeout=timeout)
        for topic in pending:
            name = topic.topic
            try:
                results[name].result()
                outcome[name] = "created"
            except KafkaException as exc:
                error = exc.args[0]
                code = error.code() if isinstance(error, KafkaError) else None
                if code == KafkaError.TOPIC_ALREADY_EXISTS:
                    outcome[name] = "exists"  # another process (or our lost try) won
                elif isinstance(error, KafkaError) and (code in _TRANSIENT or error.retriable()):
                    if time.monotonic() > deadline:
                        raise Unavailable(f"cannot create topic {name} in time: {exc}") from exc
                    retry.append(topic)
                else:
                    raise FailedPrecondition(f"cannot create topic {name}: {exc}") from exc
        if retry:
            time.sleep(0.2)
        pending = retry
    return outcome


def _await_listed(admin: AdminClient, names: list[str], timeout: float) -> None:
    # A topic just created (by us or by a process racing us) takes a moment
    # to reach the metadata every broker answers with: return only when the
    # caller's next lookup will find them all.
    deadline = time.monotonic() + timeout
    while True:
        listed = cluster_metadata(admin, timeout).topics
        missing = [
            n
            for n in names
            if n not in listed or listed[n].error is not None or not listed[n].partitions
        ]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise Unavailable(f"topics {missing} were created but are not listed yet")
        time.sleep(0.1)


def cluster_metadata(
    client: AdminClient | Consumer,
    timeout: float,
    topic: str | None = None,
    *,
    bootstrap: str = "",
) -> ClusterMetadata:
    """The cluster's metadata (``topic``'s alone when given). Raises
    Unavailable, naming ``bootstrap`` where given, when Kafka does not answer
    within ``timeout`` seconds.

    A broker away (restarting, not up yet) fails the call at once with a
    transport error, long before the timeout: the call is made again until
    the timeout, so that a service started meanwhile waits for the broker
    rather than exiting (svc_monitor and svc_ingest, restarted just before
    it, did)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            left = max(deadline - time.monotonic(), 0.1)
            return client.list_topics(topic, timeout=left)
        except KafkaException as exc:
            if time.monotonic() > deadline:
                where = f" at {bootstrap}" if bootstrap else ""
                raise Unavailable(
                    f"Kafka{where} did not answer within {timeout:g} s: {exc}"
                ) from exc
            time.sleep(0.2)


def partition_count(
    kafka: KafkaSettings, topic: str, *, timeout: float = 30.0, settle: float = 10.0
) -> int:
    """How many partitions ``topic`` has; raises NotFound if it does not exist.

    On a cluster the broker that answers may not have heard of a topic just
    created elsewhere: a missing topic is asked about again for ``settle``
    seconds before it counts as missing."""
    admin = AdminClient(kafka.client_config())
    deadline = time.monotonic() + settle
    while True:
        found = cluster_metadata(admin, timeout, topic, bootstrap=kafka.bootstrap).topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            return len(found.partitions)
        if time.monotonic() > deadline:
            raise NotFound(f"topic {topic} does not exist")
        time.sleep(0.2)


def _insync(kafka: KafkaSettings, replicas: int) -> dict[str, str]:
    # Never more than the topic's replicas (a test's topic of one, a topic made
    # before the setting grew): such a topic would refuse every acks=all write.
    return {"min.insync.replicas": str(min(kafka.topic_min_insync_replicas, replicas))}


def _replicas(metadata: object) -> int:
    partitions = getattr(metadata, "partitions", {})
    return min((len(p.replicas) for p in partitions.values()), default=0)


def _reconcile(
    admin: AdminClient,
    name: str,
    wanted: Mapping[str, str],
    metadata: object,
    partitions: int,
    timeout: float,
) -> Outcome:
    changed = False
    current_partitions = len(getattr(metadata, "partitions", {}))
    if current_partitions < partitions:
        admin.create_partitions([NewPartitions(name, partitions)], request_timeout=timeout)[
            name
        ].result()
        _await_partitions(admin, name, partitions, timeout)
        changed = True

    different = _differing(admin, name, wanted, timeout)
    if different:
        resource = ConfigResource(
            ConfigResource.Type.TOPIC,
            name,
            incremental_configs=[
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                for k, v in different.items()
            ],
        )
        admin.incremental_alter_configs([resource])[resource].result()
        _await_configured(admin, name, different, timeout)
        changed = True
    return "updated" if changed else "exists"


def _await_partitions(admin: AdminClient, name: str, partitions: int, timeout: float) -> None:
    # As with configs: the new partitions reach the answering broker's metadata
    # a moment after the controller has committed them.
    def grown() -> bool:
        found = cluster_metadata(admin, timeout, name).topics.get(name)
        return found is not None and len(found.partitions) >= partitions

    _wait_until(grown, timeout, f"topic {name} was grown to {partitions} partitions but is not yet")


def _await_configured(
    admin: AdminClient, name: str, wanted: Mapping[str, str], timeout: float
) -> None:
    # The controller acknowledges a change once it has committed it; the broker
    # that answers describe_configs applies the metadata record a moment later.
    # Return only when the caller's next look sees the spec.
    _wait_until(
        lambda: not _differing(admin, name, wanted, timeout),
        timeout,
        f"topic {name}: {sorted(wanted)} were set but are not in effect yet",
    )


def _differing(
    admin: AdminClient, name: str, wanted: Mapping[str, str], timeout: float
) -> dict[str, str]:
    """The entries of ``wanted`` the topic's configs do not hold (yet)."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    current = admin.describe_configs([resource], request_timeout=timeout)[resource].result()
    return {k: v for k, v in wanted.items() if k not in current or current[k].value != v}


def _wait_until(done: Callable[[], bool], timeout: float, failure: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise Unavailable(failure)
        time.sleep(0.1)
