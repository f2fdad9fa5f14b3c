"""Who may do what in secure mode: each principal's Kafka ACLs and Redis ACL rules.

One table per server, read from the code as it stands (the topics each
service reads and writes, its consumer groups, svc_ingest's transactions and
Faust's own topics; the Redis keys and commands each service uses). Topics
are the launcher's to create (``aistack up`` creates them as the admin
before any service starts); a service may describe the configs of the
topics it touches, so that its own start-up check passes, and only
svc_ingest creates topics: Faust's changelog and assignor topics under its
app id. The names are the defaults: a deployment that renames a topic, a
group or a key prefix grants its own.

Nothing is granted that no line here names (the broker runs with
``allow.everyone.if.no.acl.found=false``; Redis's default user is off).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from pydantic import SecretStr

from compose.secure import ADMIN
from shared.bus.topics import (
    EVENTS_CLEAN,
    EVENTS_DLQ,
    EVENTS_RAW,
    FEATURES_WINDOWS,
    LABELS,
    MODELS_DECISIONS,
    MODELS_READY,
    MONITORING_DRIFT,
    MONITORING_PERFORMANCE,
    PREDICTIONS,
    PREDICTIONS_BATCH,
    PREDICTIONS_JOINED,
    TUNING_CONTROL,
    TUNING_REPORTS,
    TUNING_RESULTS,
    TUNING_TRIALS,
)
from shared.errors import Unavailable
from shared.settings import KafkaSettings

READ, WRITE = AclOperation.READ, AclOperation.WRITE
# In confluent-kafka since 2.x; its type stubs (types-confluent-kafka) predate it.
TRANSACTIONAL_ID: ResourceType = ResourceType.TRANSACTIONAL_ID  # type: ignore[attr-defined]
#: Group ids of the assign-only readers (BusTail): librdkafka still looks up their coordinator.
TAIL_GROUPS = "aistack-tail-"
INGEST_APP_ID = "aistack-ingest"
SCRAM_ITERATIONS = 8192


@dataclass(frozen=True)
class Grant:
    """Operations on one Kafka resource, by literal name or by prefix."""

    resource: ResourceType
    name: str
    operations: tuple[AclOperation, ...]
    prefixed: bool = False


def _topics(operations: AclOperation, *names: str) -> list[Grant]:
    return [
        Grant(ResourceType.TOPIC, name, (operations, AclOperation.DESCRIBE_CONFIGS))
        for name in names
    ]


def _group(name: str, operation: AclOperation = READ, *, prefixed: bool = False) -> Grant:
    return Grant(ResourceType.GROUP, name, (operation,), prefixed)


_TAIL = _group(TAIL_GROUPS, AclOperation.DESCRIBE, prefixed=True)

#: Each principal's Kafka grants. ``admin`` is a super user and needs none.
KAFKA_GRANTS: Mapping[str, tuple[Grant, ...]] = {
    "svc_ingest": (
        *_topics(READ, EVENTS_RAW),
        *_topics(WRITE, EVENTS_CLEAN, EVENTS_DLQ),
        # Faust's dedup changelog and assignor topics, which it creates itself.
        Grant(
            ResourceType.TOPIC,
            f"{INGEST_APP_ID}-",
            (AclOperation.CREATE, READ, WRITE, AclOperation.DESCRIBE_CONFIGS),
            prefixed=True,
        ),
        _group(INGEST_APP_ID),
        # exactly_once: one transactional producer per source partition.
        Grant(TRANSACTIONAL_ID, f"{INGEST_APP_ID}-", (WRITE,), prefixed=True),
    ),
    "svc_transform": (
        *_topics(READ, EVENTS_CLEAN),
        *_topics(WRITE, FEATURES_WINDOWS, EVENTS_DLQ),
    ),
    "svc_tuner": (
        *_topics(READ, TUNING_REPORTS, MONITORING_DRIFT),
        *_topics(WRITE, TUNING_TRIALS, TUNING_CONTROL, TUNING_RESULTS, EVENTS_DLQ),
        _group("svc_tuner"),
        _group("svc_tuner.drift"),
        # Whose partition of the trials topic is whose (svc_tuner.dispatch).
        _group("svc_trainer", AclOperation.DESCRIBE),
    ),
    "svc_trainer": (
        *_topics(READ, TUNING_TRIALS, TUNING_CONTROL),
        *_topics(WRITE, TUNING_REPORTS, MODELS_READY, EVENTS_DLQ),
        _group("svc_trainer"),
        _TAIL,
    ),
    "svc_model": (
        *_topics(READ, MODELS_READY),
        *_topics(WRITE, EVENTS_DLQ, PREDICTIONS),
        _TAIL,
    ),
    "svc_monitor": (
        *_topics(
            READ,
            MODELS_READY,
            FEATURES_WINDOWS,
            MONITORING_DRIFT,
            PREDICTIONS,
            LABELS,
            PREDICTIONS_JOINED,
            MODELS_DECISIONS,
        ),
        *_topics(
            WRITE,
            MONITORING_DRIFT,
            PREDICTIONS_JOINED,
            MONITORING_PERFORMANCE,
            MODELS_DECISIONS,
            # A decision's chosen version, labelled (svc_monitor.deciding).
            MODELS_READY,
            EVENTS_DLQ,
        ),
        _TAIL,
    ),
    # The user's CLI and client: sends raw events, registers models trained
    # elsewhere, publishes batch predictions; reads what the demo and lineage show.
    "client": (
        *_topics(WRITE, EVENTS_RAW, MODELS_READY, PREDICTIONS_BATCH, LABELS),
        *_topics(
            READ,
            EVENTS_RAW,
            EVENTS_CLEAN,
            EVENTS_DLQ,
            FEATURES_WINDOWS,
            MONITORING_DRIFT,
            TUNING_RESULTS,
            MODELS_READY,
            PREDICTIONS,
            PREDICTIONS_JOINED,
            MONITORING_PERFORMANCE,
            MODELS_DECISIONS,
        ),
        _TAIL,
        _group("aistack-lineage", AclOperation.DESCRIBE),
        _group("aistack-epoch", AclOperation.DESCRIBE),
    ),
}


def acl_bindings(grants: Mapping[str, Iterable[Grant]] = KAFKA_GRANTS) -> list[AclBinding]:
    """Every grant as an ALLOW binding for ``User:<principal>`` from any host,
    each once (a topic read and written has its configs described once)."""
    unique = {
        (principal, grant.resource, grant.name, grant.prefixed, operation): None
        for principal, principal_grants in grants.items()
        for grant in principal_grants
        for operation in grant.operations
    }
    return [
        AclBinding(
            resource,
            name,
            ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL,
            f"User:{principal}",
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for principal, resource, name, prefixed, operation in unique
    ]


def grant_principals(admin: KafkaSettings, passwords: Mapping[str, SecretStr]) -> None:
    """As the admin: every principal's SCRAM credential (set again, so a
    password file and the broker never disagree) and every ACL (creating an
    existing one is a no-op). Raises Unavailable naming what failed."""
    client = AdminClient(admin.client_config())
    upserts = [
        UserScramCredentialUpsertion(
            principal,
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
            password.get_secret_value().encode(),
        )
        for principal, password in passwords.items()
        if principal != ADMIN
    ]
    # The stubs type the list as the base class only.
    alterations = cast(list[Any], upserts)
    for principal, future in client.alter_user_scram_credentials(alterations).items():
        try:
            future.result(timeout=30)
        except Exception as exc:
            raise Unavailable(f"setting {principal}'s SCRAM credential failed: {exc}") from exc
    for binding, future in client.create_acls(acl_bindings()).items():
        try:
            future.result(timeout=30)
        except Exception as exc:
            raise Unavailable(f"creating the ACL {binding} failed: {exc}") from exc


#: Each principal's Redis ACL rules (after ``on >password``); a principal not
#: named here cannot log in. Lua scripts' commands are checked against the
#: caller, so each script's HGET/HSET/EXPIRE/SET… is granted too.
REDIS_RULES: Mapping[str, str] = {
    ADMIN: "~* &* +@all",
    # Closed and open windows: EVALSHA of scripts that HGET/HSET/EXPIRE one key.
    "svc_transform": (
        "resetchannels ~aistack:features:* -@all +ping +hget +hset +expire "
        "+evalsha +eval +script|load +script|exists"
    ),
    # Optuna's journal: GET/MGET, an append script (SETNX, INCR, SET), the snapshot.
    "svc_tuner": (
        "resetchannels ~aistack:tuner:* -@all +ping +get +mget +set +setnx +incr "
        "+evalsha +eval +script|load +script|exists"
    ),
    # Online features, read only.
    "svc_model": "resetchannels %R~aistack:features:* -@all +ping +hget",
    # The demo's look at the online store.
    "client": "resetchannels %R~aistack:features:* -@all +ping +scan +hget",
}


def redis_acl(passwords: Mapping[str, SecretStr]) -> str:
    """An ACL file: the default user off, each principal of ``REDIS_RULES``
    on with its password and rules."""
    lines = ["user default off resetkeys resetchannels -@all"]
    for principal, rules in REDIS_RULES.items():
        password = passwords[principal].get_secret_value()
        lines.append(f"user {principal} on >{password} {rules}")
    return "\n".join(lines) + "\n"
