from __future__ import annotations

from compose.local import _kafka_cluster_id


def test_cluster_ids_never_look_like_an_option() -> None:
    # kafka-storage reads "-t -abc…" as a missing id: one start in 64 failed so.
    ids = {_kafka_cluster_id() for _ in range(5000)}
    assert len(ids) == 5000
    assert not any(found.startswith("-") for found in ids)
    assert all(len(found) == 22 for found in ids)
