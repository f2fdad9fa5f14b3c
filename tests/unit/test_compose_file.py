from __future__ import annotations

from pathlib import Path

import yaml

from compose import kafka_dist

COMPOSE = Path(__file__).resolve().parents[2] / "compose" / "docker-compose.yml"


def test_compose_file_parses_and_names_kafka_and_redis() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    assert {"kafka", "redis"} <= set(services)

    kafka = services["kafka"]
    assert kafka["image"] == f"apache/kafka:{kafka_dist.KAFKA_VERSION}"
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 1
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == 1
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == 1
    assert "9092:9092" in kafka["ports"]

    redis = services["redis"]
    assert redis["image"].startswith("redis:")
    assert "6379:6379" in redis["ports"]
    for name in ("kafka", "redis"):
        assert services[name]["healthcheck"]["test"]
    volumes = set(spec["volumes"])
    for service in services.values():
        for mount in service.get("volumes", []):
            assert mount.split(":")[0] in volumes
