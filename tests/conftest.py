from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.infra import Infra, provide_infra
from tests.object_store import LocalObjectStore

# TensorFlow and Triton (torch.export's compiler) each carry an LLVM; loaded
# in that order into one process they abort ("Option ... registered more than
# once"). A trial's process loads one framework, but the tests load both, so
# Triton goes first.
with contextlib.suppress(ImportError):
    import triton  # noqa: F401


@pytest.fixture(scope="session")
def infra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Infra]:
    """The real Kafka and Redis every integration test talks to."""
    with provide_infra(tmp_path_factory.mktemp("aistack-state")) as provided:
        yield provided


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalObjectStore]:
    """The real S3-compatible object store (S3Proxy over HTTP) the tests
    share; each test writes under its own keys (``unique``)."""
    store = LocalObjectStore(tmp_path_factory.mktemp("object-store"))
    store.start()
    yield store
    store.stop()


@pytest.fixture(scope="module", autouse=True)
def no_spark_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """A module that leaves a SparkContext running fails here, and the
    context is stopped: a process has one, and a later module's session
    would join it, or be refused where it asks for other jars."""
    yield
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    running = SparkContext._active_spark_context
    if running is not None:
        running.stop()
        pytest.fail(f"{request.module.__name__} left a SparkContext running")


@pytest.fixture
def unique() -> str:
    """A fresh suffix for this test's topics and consumer groups."""
    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real local Spark (2 cores) for a module's Spark tests: start-up
    costs seconds. Not one for the session: a process has one SparkContext,
    and the modules that start Spark sessions of their own (on a cluster,
    through the trainer) must find none running."""
    from shared.settings import CommonSettings, SparkSettings
    from svc_transform.spark import session

    started = session(
        SparkSettings(master="local[2]"),
        "aistack-tests",
        cache_dir=CommonSettings().cache_dir,
        work_dir=tmp_path_factory.mktemp("spark-driver"),
    )
    yield started
    started.stop()
