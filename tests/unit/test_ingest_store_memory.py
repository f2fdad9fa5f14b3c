"""svc_ingest's dedup table keeps its RocksDB memory small: a steady stream
of writes no longer grows the process by Faust's 64 MiB memtables, nor
RocksDB's threads by a malloc arena each."""

from __future__ import annotations

import os
import platform
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from shared.settings import CommonSettings, KafkaSettings

rocksdict = pytest.importorskip("rocksdict")

MIB = 1024 * 1024


def dedup_store(tmp_path: Path) -> Any:
    from svc_ingest.app import DEDUP_TABLE, create_app
    from svc_ingest.metrics import IngestMetrics
    from svc_ingest.settings import IngestSettings

    settings = IngestSettings(
        kafka=KafkaSettings(bootstrap="127.0.0.1:1"),
        store="rocksdb",
        common=CommonSettings(state_dir=tmp_path / "state"),
    )
    app = create_app(settings, IngestMetrics.create(CollectorRegistry()), partitions=1)
    table: Any = app.tables[DEDUP_TABLE]
    return table.data


def test_half_an_hour_of_dedup_entries_keeps_the_memtables_small(tmp_path: Path) -> None:
    store = dedup_store(tmp_path)
    db = rocksdict.Rdict(str(tmp_path / "db"), store.rocksdb_options.as_options())
    try:
        # As svc_ingest writes at 2,000 events/s: one entry of 200 packed ids
        # per batch of 0.1 s, each dropped 600 s later (the dedup window).
        window = 6_000
        largest = 0
        for batch in range(18_000):
            ids = (os.urandom(16).hex().encode() for _ in range(200))
            db[f"0/{batch}".encode()] = b"".join(struct.pack(">QH", batch, 32) + i for i in ids)
            if batch >= window:
                del db[f"0/{batch - window}".encode()]
            if batch % 500 == 0:
                size = int(db.property_value("rocksdb.cur-size-all-mem-tables") or 0)
                largest = max(largest, size)
        # Two memtables of 8 MiB at most; Faust's defaults reach 64 MiB here.
        assert 0 < largest <= 17 * MIB
    finally:
        db.close()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the arena cap is glibc's mallopt")
def test_the_worker_caps_glibcs_malloc_arenas() -> None:
    # A process of its own: the cap holds for the whole process.
    code = (
        "from svc_ingest.__main__ import MALLOC_ARENAS; from shared.malloc import limit_arenas; "
        "print(limit_arenas(MALLOC_ARENAS))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "True"
