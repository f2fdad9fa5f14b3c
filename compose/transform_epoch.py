"""svc_transform's event-time epoch: where its watermark stands, and a fresh
start for a run of historical readings that it would drop as late.

Spark keeps each query's watermark in its checkpoint (``offsets/N``'s
``batchWatermarkMs``), and after a restart every event older than it is
late. A run that sends readings of the past hour (the demo does, each time
it runs) after an earlier run left the watermark at "a few minutes ago"
would see them dropped. Such a run begins a fresh epoch: svc_transform is
stopped, its checkpoint and offline store are moved aside (kept, never
deleted), and it starts again from the clean topic's current end, so that it
windows only what comes after and nothing twice.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from compose.stack import ServiceStack
from shared.settings import KafkaSettings, load_settings
from svc_transform.settings import TransformSettings

SERVICE = "svc_transform"


@dataclass(frozen=True)
class Epoch:
    """Where the last epoch was moved, and where the new one starts."""

    archive: Path
    starting_offsets: dict[str, dict[str, int]]


def transform_settings(stack: ServiceStack) -> TransformSettings:
    """svc_transform's settings as the stack starts it (its state directory)."""
    return load_settings(TransformSettings).model_copy(
        update={"common": stack.settings.infra.common}
    )


def stored_watermark(checkpoint: Path) -> datetime | None:
    """The latest watermark any query under ``checkpoint`` recorded (Spark's
    offset log), or None when none has one yet."""
    found = 0
    for log in checkpoint.glob("*/offsets"):
        batches = [p for p in log.iterdir() if p.name.isdigit()]
        if not batches:
            continue
        latest = max(batches, key=lambda p: int(p.name))
        lines = latest.read_text().splitlines()
        # "v1", then the batch's metadata, then one line per source.
        if len(lines) > 1:
            found = max(found, int(json.loads(lines[1]).get("batchWatermarkMs", 0)))
    return datetime.fromtimestamp(found / 1000, UTC) if found else None


def end_offsets(kafka: KafkaSettings, topic: str) -> dict[str, int]:
    """Each partition's end (the offset the next record gets), as Spark's
    ``startingOffsets`` JSON wants it."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**kafka.client_config(), "group.id": "aistack-epoch"})
    try:
        topics = consumer.list_topics(topic, timeout=30).topics
        partitions = sorted(topics[topic].partitions)
        return {
            str(p): int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1])
            for p in partitions
        }
    finally:
        consumer.close()


def needs_fresh_epoch(stack: ServiceStack, first_event: datetime) -> datetime | None:
    """The stored watermark when it is past ``first_event`` (the run's
    readings would be dropped as late), else None."""
    settings = transform_settings(stack)
    checkpoint = Path(settings.checkpoint_path())
    if not checkpoint.is_dir():  # a URL (s3a://…) or no checkpoint yet
        return None
    watermark = stored_watermark(checkpoint)
    return watermark if watermark is not None and watermark >= first_event else None


def begin_fresh_epoch(stack: ServiceStack, kafka: KafkaSettings) -> Epoch:
    """Stop svc_transform, move its checkpoint and offline store under
    ``transform/epochs/<time>/``, and start it again from the clean topic's
    end. Raises Unavailable when it does not come back."""
    settings = transform_settings(stack)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    archive = settings.common.state_dir / "transform" / "epochs" / stamp
    stack.stop_service(SERVICE)
    # Read once it is stopped: every clean record before this end was the
    # old epoch's to window (or drop), none after it is.
    starting = {settings.source_topic: end_offsets(kafka, settings.source_topic)}
    archive.mkdir(parents=True, exist_ok=True)
    for kind, location in (
        ("checkpoint", settings.checkpoint_path()),
        ("offline", settings.offline_path()),
    ):
        path = Path(location)
        if path.exists():
            shutil.move(str(path), str(archive / kind))
    stack.start_service(SERVICE, env={"AISTACK_TRANSFORM_STARTING_OFFSETS": json.dumps(starting)})
    return Epoch(archive, starting)
