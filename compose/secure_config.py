"""What secure mode's material becomes, for the local launcher and for
compose alike: a principal's environment (its Kafka and Redis credentials, a
gRPC server's certificate and token), a broker's security properties and
Redis's TLS options.

The launcher runs everything on one host (``compose.local``,
``compose.stack``); compose runs each in its own container, with the
material on a volume that ``python -m compose.secure_compose`` fills
(``compose/docker-compose.secure.yml``). Both read it from here, so the two
cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from compose.secure import ADMIN, SERVER_COMMON_NAME, SecureMaterial

SCRAM: Literal["SCRAM-SHA-512"] = "SCRAM-SHA-512"

#: The environment prefix of each gRPC server's TLS and token settings.
GRPC_SERVER_PREFIX = {"svc_tuner": "AISTACK_TUNER_", "svc_model": "AISTACK_MODEL_"}


def principal_env(material: SecureMaterial, principal: str) -> dict[str, str]:
    """``principal``'s Kafka (SASL_SSL, SCRAM) and Redis (ACL user, TLS)
    credentials as ``AISTACK_*`` variables; where the servers are is the
    caller's to add."""
    password = material.password(principal).get_secret_value()
    ca = str(material.ca_cert)
    return {
        "AISTACK_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "AISTACK_KAFKA_SASL_MECHANISM": SCRAM,
        "AISTACK_KAFKA_SASL_USERNAME": principal,
        "AISTACK_KAFKA_SASL_PASSWORD": password,
        "AISTACK_KAFKA_SSL_CAFILE": ca,
        "AISTACK_REDIS_USERNAME": principal,
        "AISTACK_REDIS_PASSWORD": password,
        "AISTACK_REDIS_SSL_CA_CERTS": ca,
    }


def grpc_server_env(material: SecureMaterial, principal: str) -> dict[str, str]:
    """For svc_tuner and svc_model: the servers' certificate and their own
    bearer token; nothing for any other principal."""
    prefix = GRPC_SERVER_PREFIX.get(principal)
    if prefix is None:
        return {}
    return {
        f"{prefix}TLS_CERT_FILE": str(material.server_cert),
        f"{prefix}TLS_KEY_FILE": str(material.server_key),
        f"{prefix}AUTH_TOKEN": material.token(principal).get_secret_value(),
    }


def service_env(material: SecureMaterial, principal: str) -> dict[str, str]:
    """What a service started as ``principal`` gets in secure mode."""
    return {**principal_env(material, principal), **grpc_server_env(material, principal)}


def broker_properties(
    material: SecureMaterial, listeners: Iterable[str], *, files: Path | None = None
) -> list[str]:
    """A broker's security: TLS and SCRAM on each of ``listeners`` (their
    names, all SASL_SSL, between brokers too), mutual TLS on the controller
    listener, and ACLs: nothing is allowed that no ACL grants. The key store
    and CA are read from ``files`` when the broker has its own copies there."""
    admin = material.password(ADMIN).get_secret_value()
    own = SecureMaterial(files) if files is not None else material
    names = list(listeners)
    protocol_map = ",".join([*(f"{name}:SASL_SSL" for name in names), "CONTROLLER:SSL"])
    return [
        f"listener.security.protocol.map={protocol_map}",
        f"sasl.enabled.mechanisms={SCRAM}",
        f"sasl.mechanism.inter.broker.protocol={SCRAM}",
        *(
            f"listener.name.{name.lower()}.{SCRAM.lower()}.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{ADMIN}" password="{admin}";'
            for name in names
        ),
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={own.server_pem}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={own.ca_cert}",
        "listener.name.controller.ssl.client.auth=required",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        f"super.users=User:{ADMIN};User:CN={SERVER_COMMON_NAME}",
        "allow.everyone.if.no.acl.found=false",
    ]


def admin_scram(material: SecureMaterial) -> str:
    """``kafka-storage format --add-scram``'s argument: the admin's SCRAM
    credential, in the metadata before the broker first starts (its ACLs
    and the other principals' credentials are granted through it)."""
    admin = material.password(ADMIN).get_secret_value()
    return f"{SCRAM}=[name={ADMIN},password={admin}]"


def redis_options(material: SecureMaterial, port: int, acl_file: Path) -> list[str]:
    """redis-server's options: TLS only (no plaintext port) and the ACL
    users in ``acl_file`` (the default user is off there)."""
    return [
        "--port",
        "0",
        "--tls-port",
        str(port),
        "--tls-cert-file",
        str(material.server_cert),
        "--tls-key-file",
        str(material.server_key),
        "--tls-ca-cert-file",
        str(material.ca_cert),
        "--tls-auth-clients",
        "no",
        "--aclfile",
        str(acl_file),
    ]
