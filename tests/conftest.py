from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.infra import Infra, provide_infra


@pytest.fixture(scope="session")
def infra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Infra]:
    """The real Kafka and Redis every integration test talks to."""
    with provide_infra(tmp_path_factory.mktemp("aistack-state")) as provided:
        yield provided


@pytest.fixture
def unique() -> str:
    """A fresh suffix for this test's topics and consumer groups."""
    return uuid.uuid4().hex[:12]
