"""Every producer of aistack writes with acks=all: on a replicated cluster a
write is confirmed only once every in-sync replica has it, so losing the
leader loses nothing that was confirmed."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from shared.bus.producer import PRODUCER_DEFAULTS
from shared.settings import CommonSettings, KafkaSettings

KAFKA = KafkaSettings(bootstrap="127.0.0.1:1")


def test_the_bus_producer_is_idempotent_and_waits_for_every_in_sync_replica() -> None:
    # BusProducer and svc_model's prediction log are built on these.
    assert PRODUCER_DEFAULTS["acks"] == "all"
    assert PRODUCER_DEFAULTS["enable.idempotence"] is True


def test_svc_ingests_faust_producer_waits_for_every_in_sync_replica(tmp_path: Path) -> None:
    from svc_ingest.app import create_app
    from svc_ingest.metrics import IngestMetrics
    from svc_ingest.settings import IngestSettings

    for guarantee in ("exactly_once", "at_least_once"):
        settings = IngestSettings(
            kafka=KAFKA,
            processing_guarantee=guarantee,
            common=CommonSettings(state_dir=tmp_path / guarantee),
        )
        app = create_app(settings, IngestMetrics.create(CollectorRegistry()), partitions=3)
        assert app.conf.producer_acks == -1


def test_svc_transforms_kafka_sinks_wait_for_every_in_sync_replica() -> None:
    from svc_transform.sinks import kafka_options, kafka_sink_options, kafka_source_options

    assert kafka_sink_options(KAFKA)["kafka.acks"] == "all"
    # The source's consumer is not handed a producer setting it would warn about.
    assert "kafka.acks" not in kafka_options(KAFKA)
    assert "kafka.acks" not in kafka_source_options(KAFKA)
    # Nor the producer a consumer's.
    assert "kafka.fetch.max.wait.ms" not in kafka_sink_options(KAFKA)


def test_svc_transforms_reads_do_not_wait_out_the_brokers_long_poll() -> None:
    from svc_transform.sinks import SOURCE_FETCH_WAIT_MS, kafka_source_options

    # The consumer's default is 500 ms, which a task that read to the end of the topic waited.
    assert kafka_source_options(KAFKA)["kafka.fetch.max.wait.ms"] == str(SOURCE_FETCH_WAIT_MS)
    assert SOURCE_FETCH_WAIT_MS < 500
