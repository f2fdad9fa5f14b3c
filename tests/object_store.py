"""The tests' S3-compatible object store: the local stack's S3Proxy
(``compose.object_store.Standalone``) on a free port, over real HTTP with
signed requests, its objects files under a directory, so that it can be
stopped (an outage) and started again with its objects kept."""

from __future__ import annotations

from pathlib import Path

from compose.object_store import Standalone
from shared.settings import CommonSettings


class LocalObjectStore(Standalone):
    """``Standalone`` with the jars from this machine's cache."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, CommonSettings().cache_dir)
