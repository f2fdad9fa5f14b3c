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
from shared import object_store
from shared.settings import KafkaSettings, ObjectStoreSettings, load_settings
from svc_transform.settings import TransformSettings

SERVICE = "svc_transform"


@dataclass(frozen=True)
class Epoch:
    """Where the last epoch was moved (a directory, or a URL on the object
    store), and where the new one starts."""

    archive: str
    starting_offsets: dict[str, dict[str, int]]


def transform_settings(stack: ServiceStack) -> TransformSettings:
    """svc_transform's settings as the stack starts it: its state directory,
    and its checkpoint and offline store on the stack's object store when
    the stack puts them there."""
    located = stack.storage_locations()
    update: dict[str, object] = {"common": stack.settings.infra.common}
    if "AISTACK_TRANSFORM_CHECKPOINT_DIR" in located:
        update["checkpoint_dir"] = located["AISTACK_TRANSFORM_CHECKPOINT_DIR"]
    if "AISTACK_TRANSFORM_OFFLINE_DIR" in located:
        update["offline_dir"] = located["AISTACK_TRANSFORM_OFFLINE_DIR"]
    if located:
        update["object_store"] = stack.object_store_settings()
    return load_settings(TransformSettings).model_copy(update=update)


def stored_watermark(
    checkpoint: Path | str, settings: ObjectStoreSettings | None = None
) -> datetime | None:
    """The latest watermark any query under ``checkpoint`` (a directory, or a
    URL on the object store ``settings`` describes) recorded (Spark's offset
    log), or None when none has one yet."""
    fs, root = object_store.filesystem(str(checkpoint), settings)
    found = 0
    for log in fs.glob(f"{root.rstrip('/')}/*/offsets"):
        batches = [p for p in fs.ls(log, detail=False) if p.rsplit("/", 1)[-1].isdigit()]
        if not batches:
            continue
        latest = max(batches, key=lambda p: int(p.rsplit("/", 1)[-1]))
        lines = fs.cat_file(latest).decode().splitlines()
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
    checkpoint = settings.checkpoint_path()
    if not object_store.is_object_url(checkpoint) and not Path(checkpoint).is_dir():
        return None  # no checkpoint yet
    watermark = stored_watermark(checkpoint, settings.object_store)
    return watermark if watermark is not None and watermark >= first_event else None


def begin_fresh_epoch(stack: ServiceStack, kafka: KafkaSettings) -> Epoch:
    """Stop svc_transform, move its checkpoint and offline store under
    ``transform/epochs/<time>/`` of the state directory (of the checkpoint's
    bucket, on the object store: an object store moves by copying), and
    start it again from the clean topic's end. Raises Unavailable when it
    does not come back."""
    settings = transform_settings(stack)
    relative = f"transform/epochs/{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}"
    stack.stop_service(SERVICE)
    # Read once it is stopped: every clean record before this end was the
    # old epoch's to window (or drop), none after it is.
    starting = {settings.source_topic: end_offsets(kafka, settings.source_topic)}
    archives = []
    for kind, location in (
        ("checkpoint", settings.checkpoint_path()),
        ("offline", settings.offline_path()),
    ):
        if object_store.is_object_url(location):
            fs, path = object_store.filesystem(location, settings.object_store)
            archive = f"s3://{path.split('/', 1)[0]}/{relative}"
            object_store.move_tree(fs, path, f"{archive.removeprefix('s3://')}/{kind}")
        else:
            archive = str(settings.common.state_dir / relative)
            Path(archive).mkdir(parents=True, exist_ok=True)
            if Path(location).exists():
                shutil.move(location, str(Path(archive) / kind))
        archives.append(archive)
    stack.start_service(SERVICE, env={"AISTACK_TRANSFORM_STARTING_OFFSETS": json.dumps(starting)})
    return Epoch(archives[0], starting)
