"""Secure mode in compose (``compose/docker-compose.secure.yml``).

``python -m compose.secure_compose material DIR`` (the one-shot ``secrets``
service, as root) makes the material into DIR, the ``secrets`` volume, as
the local launcher does into its state directory, for the containers' host
names; then it writes the broker's ``server.properties`` and start script and
Redis's ACL file, each readable by the user its server runs as.

``python -m compose.secure_compose grant DIR`` (the one-shot ``grants``
service, once Kafka answers) sets every principal's SCRAM credential and its
ACLs and creates aistack's topics, as the admin.

``python -m compose.secure_compose exec PRINCIPAL -- COMMAND…`` (each aistack
service's command) runs COMMAND with PRINCIPAL's credentials in its
environment, read from DIR (``AISTACK_SECRETS_DIR``, default ``/secrets``)
when the container starts: no secret is in the compose file or an image.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from compose.grants import grant_principals, redis_acl
from compose.secure import ADMIN, PRINCIPALS, SecureMaterial, ensure_material, write_private
from compose.secure_config import SCRAM, admin_scram, broker_properties, service_env

#: Where every container mounts the ``secrets`` volume.
SECRETS_DIR = Path("/secrets")
#: The names the servers' certificate covers: compose's service names.
HOSTS = ("kafka", "redis", "svc_tuner", "svc_model")
#: Kafka inside the compose network and from this host.
INTERNAL_BOOTSTRAP = "kafka:29092"
#: Redis inside the compose network, over TLS.
REDIS_URL = "rediss://redis:6379/0"
#: The users the official images run their servers as.
KAFKA_UID, REDIS_UID, AISTACK_UID = 1000, 999, 10001
#: The KRaft cluster's id: fixed, as the official image's own default is.
CLUSTER_ID = "4L6g3nShT-eMCtK--X86sw"


def broker_config(material: SecureMaterial, files: Path) -> str:
    """The single-node broker's ``server.properties`` in secure mode: the
    listeners of the plaintext compose file (INTERNAL for containers,
    EXTERNAL published on this host's loopback), each SASL_SSL."""
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            "controller.quorum.voters=1@kafka:9093",
            "listeners=INTERNAL://:29092,EXTERNAL://:9092,CONTROLLER://:9093",
            "advertised.listeners=INTERNAL://kafka:29092,EXTERNAL://localhost:9092",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=INTERNAL",
            *broker_properties(material, ["INTERNAL", "EXTERNAL"], files=files),
            "log.dirs=/var/lib/kafka/data",
            # One node: internal topics cannot have more replicas.
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "",
        ]
    )


def broker_start_script(material: SecureMaterial, config: Path) -> str:
    """Format the storage once (with the admin's SCRAM credential), then run
    the broker: the official image's own Kafka, our configuration."""
    bin_dir = "/opt/kafka/bin"
    return "\n".join(
        [
            "#!/bin/bash",
            "set -euo pipefail",
            f"{bin_dir}/kafka-storage.sh format --ignore-formatted "
            f"--cluster-id {CLUSTER_ID} --config {shlex.quote(str(config))} "
            f"--add-scram {shlex.quote(admin_scram(material))}",
            f"exec {bin_dir}/kafka-server-start.sh {shlex.quote(str(config))}",
            "",
        ]
    )


def write_material(directory: Path) -> SecureMaterial:
    """The material, the broker's files under ``kafka/`` and Redis's under
    ``redis/``, each owned by its server's user when run as root."""
    material = ensure_material(directory, HOSTS)
    kafka, redis = directory / "kafka", directory / "redis"
    for sub in (kafka, redis):
        sub.mkdir(exist_ok=True)
        sub.chmod(0o700)
    config = kafka / "server.properties"
    write_private(config, broker_config(material, kafka).encode())
    write_private(kafka / "start.sh", broker_start_script(material, config).encode())
    (kafka / "start.sh").chmod(0o700)
    write_private(redis / "users.acl", redis_acl(material.passwords()).encode())
    # Redis's health check authenticates as the admin.
    write_private(redis / "admin.password", material.password(ADMIN).get_secret_value().encode())
    # Each server reads its key and certificate from its own directory.
    for sub in (kafka, redis):
        for source in (material.server_cert, material.server_key, material.server_pem):
            write_private(sub / source.name, source.read_bytes())
        (sub / material.ca_cert.name).write_bytes(material.ca_cert.read_bytes())
    if os.geteuid() == 0:
        _own(kafka, KAFKA_UID)
        _own(redis, REDIS_UID)
        # The services read the passwords and tokens; the CA key stays root's.
        for path in (directory, material.credentials, material.tokens, material.server_key):
            os.chown(path, AISTACK_UID, AISTACK_UID)
    # The CA certificate is public: every client checks the servers with it;
    # each server may pass through to its own directory, list nothing.
    material.ca_cert.chmod(0o644)
    directory.chmod(0o711)
    return material


def _own(directory: Path, uid: int) -> None:
    os.chown(directory, uid, uid)
    for path in directory.iterdir():
        os.chown(path, uid, uid)


def container_env(directory: Path, principal: str) -> dict[str, str]:
    """``principal``'s environment in its container: the servers by their
    compose names, its credentials, and for a gRPC server its certificate
    and token."""
    return {
        "AISTACK_KAFKA_BOOTSTRAP": INTERNAL_BOOTSTRAP,
        "AISTACK_REDIS_URL": REDIS_URL,
        **service_env(SecureMaterial(directory), principal),
    }


def grant(directory: Path) -> None:
    """As the admin: every principal's credential and ACLs, and the topics."""
    from shared.bus.topics import TOPICS, ensure_topics
    from shared.settings import KafkaSettings

    material = SecureMaterial(directory)
    env = container_env(directory, ADMIN)
    admin = KafkaSettings(
        bootstrap=env["AISTACK_KAFKA_BOOTSTRAP"],
        security_protocol="SASL_SSL",
        sasl_mechanism=SCRAM,
        sasl_username=ADMIN,
        sasl_password=material.password(ADMIN),
        ssl_cafile=material.ca_cert,
        client_id=ADMIN,
    )
    grant_principals(admin, material.passwords())
    ensure_topics(admin, TOPICS)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compose.secure_compose", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("material", "grant"):
        command = commands.add_parser(name)
        command.add_argument("directory", type=Path, nargs="?", default=SECRETS_DIR)
    run = commands.add_parser("exec")
    run.add_argument("principal", choices=[p for p in PRINCIPALS if p != ADMIN])
    run.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    if args.command == "material":
        write_material(args.directory)
        print(f"secure mode's material is in {args.directory}")
        return 0
    if args.command == "grant":
        grant(args.directory)
        print("every principal's credentials and ACLs are set; the topics are there")
        return 0
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        parser.error("exec: name the command to run after --")
    directory = Path(os.environ.get("AISTACK_SECRETS_DIR", str(SECRETS_DIR)))
    env = {**os.environ, **container_env(directory, args.principal)}
    sys.stdout.flush()
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    raise SystemExit(main())
