from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf import descriptor_pool
from google.protobuf.message import Message

from compose import kafka_dist
from shared import hadoop_s3a
from shared.bus.topics import TOPICS, TOPICS_BY_NAME
from shared.contracts import codegen
from shared.contracts.aistack.v1 import (
    common_pb2,
    events_pb2,
    features_pb2,
    models_pb2,
    monitoring_pb2,
    predictions_pb2,
    tuner_service_pb2,
    tuning_pb2,
)
from svc_transform import jars as transform_jars

DESIGN_TOPICS = {
    "aistack.events.raw",
    "aistack.events.clean",
    "aistack.events.dlq",
    "aistack.features.windows",
    "aistack.tuning.trials",
    "aistack.tuning.reports",
    "aistack.tuning.control",
    "aistack.models.ready",
    "aistack.monitoring.drift",
}
# Ours beyond the design's list: where the tuner announces a study's result,
# svc_model's prediction log, and where `aistack score --publish` puts its
# predictions, the labels users publish, and svc_monitor's joined predictions
# and live errors.
EXTRA_TOPICS = {
    "aistack.tuning.results",
    "aistack.predictions",
    "aistack.predictions.batch",
    "aistack.labels",
    "aistack.predictions.joined",
    "aistack.monitoring.performance",
    "aistack.models.decisions",
}
AISTACK_FILES = [
    common_pb2,
    events_pb2,
    features_pb2,
    models_pb2,
    monitoring_pb2,
    predictions_pb2,
    tuner_service_pb2,
    tuning_pb2,
]


def test_generated_code_is_not_stale() -> None:
    assert codegen.stale_files() == []


def test_stale_check_notices_a_changed_module(tmp_path: Path) -> None:
    codegen.generate(tmp_path)
    module = tmp_path / "aistack" / "v1" / "events_pb2.py"
    module.write_text(module.read_text() + "\n# edited by hand\n")
    assert "aistack/v1/events_pb2.py" in codegen.stale_files(tmp_path)


def test_every_design_topic_has_a_spec_and_message() -> None:
    assert set(TOPICS_BY_NAME) == DESIGN_TOPICS | EXTRA_TOPICS
    assert TOPICS_BY_NAME["aistack.models.ready"].compacted
    compacted = [s.name for s in TOPICS if s.compacted]
    assert compacted == ["aistack.tuning.results", "aistack.models.ready"]
    assert TOPICS_BY_NAME["aistack.events.raw"].message_type is None
    assert TOPICS_BY_NAME["aistack.events.raw"].topic_config()["cleanup.policy"] == "delete"


@pytest.mark.parametrize("module", AISTACK_FILES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_enums_start_with_unspecified_and_package_is_versioned(module: object) -> None:
    file = module.DESCRIPTOR  # type: ignore[attr-defined]
    assert file.package == "aistack.v1"
    enums = list(file.enum_types_by_name.values())
    for message in file.message_types_by_name.values():
        enums.extend(message.enum_types)
    for enum in enums:
        zero = enum.values_by_number[0].name
        assert zero.endswith("_UNSPECIFIED"), f"{enum.full_name} zero value is {zero}"


def test_model_ready_carries_what_the_server_needs() -> None:
    fields = set(models_pb2.ModelReady.DESCRIPTOR.fields_by_name)
    assert {
        "model_name",
        "version",
        "framework",
        "format",
        "artifact_uri",
        "sha256",
        "inputs",
        "outputs",
        "metrics",
        "lineage",
    } <= fields
    lineage = models_pb2.ModelLineage.DESCRIPTOR.fields_by_name
    assert {"study_id", "trial_id", "data"} <= set(lineage)
    assert "offsets" in models_pb2.DataLineage.DESCRIPTOR.fields_by_name


def test_trial_report_is_intermediate_or_final() -> None:
    oneof = tuning_pb2.TrialReport.DESCRIPTOR.oneofs_by_name["event"]
    assert {f.name for f in oneof.fields} >= {"progress", "completed", "failed", "heartbeat"}
    report = tuning_pb2.TrialReport(
        trial_id="t", progress=tuning_pb2.TrialProgress(step=3, value=0.5)
    )
    again = tuning_pb2.TrialReport.FromString(report.SerializeToString())
    assert again.WhichOneof("event") == "progress" and again.progress.step == 3


def test_tuner_service_has_every_rpc() -> None:
    service = tuner_service_pb2.DESCRIPTOR.services_by_name["TunerService"]
    assert set(service.methods_by_name) == {
        "CreateStudy",
        "GetStudy",
        "ListTrials",
        "StopStudy",
        "GetBestTrial",
        "WatchStudy",
        "ReplayStudy",
    }
    assert service.methods_by_name["WatchStudy"].server_streaming


def test_open_inference_protocol_is_kserves() -> None:
    from shared.contracts.inference import grpc_predict_v2_pb2

    file = grpc_predict_v2_pb2.DESCRIPTOR
    assert file.name == "grpc_predict_v2.proto"
    assert file.package == "inference"
    service = file.services_by_name["GRPCInferenceService"]
    assert [m.name for m in service.methods] == [
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
    ]
    request = grpc_predict_v2_pb2.ModelInferRequest.DESCRIPTOR.fields_by_name
    assert request["raw_input_contents"].number == 7
    assert descriptor_pool.Default().FindServiceByName("inference.GRPCInferenceService")


def test_descriptor_set_for_spark_lists_every_message() -> None:
    from google.protobuf import descriptor_pb2

    data = (Path(codegen.CONTRACTS_DIR) / codegen.DESCRIPTOR_SET).read_bytes()
    names = {
        f"{f.package}.{m.name}"
        for f in descriptor_pb2.FileDescriptorSet.FromString(data).file
        for m in f.message_type
    }
    assert {
        "aistack.v1.CleanEvent",
        "aistack.v1.FeatureWindow",
        "google.protobuf.Timestamp",
    } <= names


def test_kafka_version_agrees_with_the_pom() -> None:
    pom = kafka_dist.POM.read_text()
    assert re.search(rf"<kafka.version>{re.escape(kafka_dist.KAFKA_VERSION)}</kafka.version>", pom)


def test_spark_connector_version_is_pyspark_s() -> None:
    version = re.escape(transform_jars.SPARK_VERSION)
    assert re.search(rf"<spark.version>{version}</spark.version>", transform_jars.POM.read_text())
    s3a = hadoop_s3a.POM.read_text()
    assert re.search(rf"<spark.version>{version}</spark.version>", s3a)
    hadoop = re.escape(hadoop_s3a.HADOOP_VERSION)
    assert re.search(rf"<hadoop.version>{hadoop}</hadoop.version>", s3a)
    # hadoop-aws must be the Hadoop pyspark ships.
    jars = transform_jars.pyspark_jars()
    assert any(jars.glob(f"hadoop-client-api-{hadoop_s3a.HADOOP_VERSION}.jar"))
    pyproject = (Path(transform_jars.POM).parents[2] / "pyproject.toml").read_text()
    assert re.search(rf'"pyspark=={version}"', pyproject)


def test_messages_round_trip_in_memory() -> None:
    messages: list[Message] = [
        events_pb2.RawEvent(event_id="e1", sensor_reading=events_pb2.SensorReading(device_id="d")),
        features_pb2.FeatureWindow(window_key="k", entity_id="d", metric="temperature", p95=1.5),
        tuning_pb2.TrialControl(trial_id="t", action=tuning_pb2.CONTROL_ACTION_PRUNE),
    ]
    for message in messages:
        assert type(message).FromString(message.SerializeToString()) == message
