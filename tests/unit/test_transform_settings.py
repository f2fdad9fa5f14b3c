from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.errors import ConfigError
from shared.settings import KafkaSettings, SparkSettings, load_settings
from svc_transform.settings import TransformSettings


def test_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AISTACK_STATE_DIR", str(tmp_path))
    settings = load_settings(TransformSettings)
    assert settings.spark.master == "local[*]"
    assert settings.source_topic == "aistack.events.clean"
    assert settings.features_topic == "aistack.features.windows"
    assert (settings.tumbling_window_seconds, settings.watermark_seconds) == (60, 30)
    assert (settings.open_windows, settings.open_window_trigger_seconds) == ("tumbling", 0.0)
    assert settings.checkpoint_path().startswith(str(tmp_path))
    assert settings.offline_path().startswith(str(tmp_path))


@pytest.mark.parametrize(
    ("master", "partitions"),
    [("local[2]", 2), ("local[3,2]", 3), ("local", 1), ("local[*]", os.cpu_count() or 2)],
)
def test_shuffle_partitions_follow_the_cores(master: str, partitions: int) -> None:
    assert SparkSettings(master=master).partitions() == partitions
    assert SparkSettings(master=master, shuffle_partitions=7).partitions() == 7


@pytest.mark.parametrize(
    "master", ["spark://a:7077", "spark://a:7077,b:7077", "k8s://https://k:6443", "yarn"]
)
def test_cluster_masters_are_accepted(master: str) -> None:
    assert not SparkSettings(master=master).is_local()


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("AISTACK_SPARK_MASTER", "mesos://m:5050", "AISTACK_SPARK_MASTER"),
        ("AISTACK_SPARK_MASTER", "local[0]", "AISTACK_SPARK_MASTER"),
        ("AISTACK_SPARK_SHUFFLE_PARTITIONS", "-1", "AISTACK_SPARK_SHUFFLE_PARTITIONS"),
        ("AISTACK_TRANSFORM_WATERMARK_SECONDS", "soon", "AISTACK_TRANSFORM_WATERMARK_SECONDS"),
        ("AISTACK_TRANSFORM_TRIGGER_SECONDS", "120", "AISTACK_TRANSFORM_TRIGGER_SECONDS"),
        (
            "AISTACK_TRANSFORM_SLIDING_SLIDE_SECONDS",
            "70",
            "AISTACK_TRANSFORM_SLIDING_SLIDE_SECONDS",
        ),
        ("AISTACK_TRANSFORM_OPEN_WINDOWS", "some", "AISTACK_TRANSFORM_OPEN_WINDOWS"),
        (
            "AISTACK_TRANSFORM_OPEN_WINDOW_TRIGGER_SECONDS",
            "-1",
            "AISTACK_TRANSFORM_OPEN_WINDOW_TRIGGER_SECONDS",
        ),
    ],
)
def test_a_bad_setting_stops_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, named: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings(TransformSettings)
    message = str(caught.value)
    assert named in message and "\n" not in message


def test_java_client_config_carries_sasl_and_pem(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    kafka = KafkaSettings(
        bootstrap="k1:9093,k2:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="svc",
        sasl_password='p"w',
        ssl_cafile=ca,
    )
    config = kafka.java_client_config()
    assert config["bootstrap.servers"] == "k1:9093,k2:9093"
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="svc" password="p\\"w";'
    )
    assert (config["ssl.truststore.type"], config["ssl.truststore.location"]) == ("PEM", str(ca))
