"""svc_transform's choice of generated or interpreted projections per
micro-batch, with no Spark running (a real query's is in
tests/integration/test_transform_functions.py)."""

from __future__ import annotations

from typing import Any

import pytest

from svc_transform.codegen import (
    CODEGEN_FACTORY_MODE,
    GENERATED,
    INTERPRETED,
    BatchSizes,
    ByBatchSize,
)


class _Conf:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class _Session:
    def __init__(self) -> None:
        self.conf = _Conf()


class _Batch:
    def __init__(self) -> None:
        self.sparkSession = _Session()


@pytest.mark.parametrize(
    ("last_rows", "behind", "max_rows", "mode"),
    [
        (None, None, 20_000, GENERATED),  # no report yet: perhaps a backlog
        (1_000, 0, 20_000, INTERPRETED),
        (20_000, 5, 20_000, INTERPRETED),
        (20_001, 0, 20_000, GENERATED),
        (1_000, 150_000, 20_000, GENERATED),  # a backlog waits
        (0, 0, 20_000, INTERPRETED),
        (1_000, 0, 0, GENERATED),  # 0: never interpreted
    ],
)
def test_a_batch_runs_interpreted_only_when_expected_small(
    last_rows: int | None, behind: int | None, max_rows: int, mode: str
) -> None:
    sizes = BatchSizes()
    if last_rows is not None and behind is not None:
        sizes.record("windows", last_rows, behind)
    handed: list[tuple[Any, int]] = []
    run = ByBatchSize(lambda b, i: handed.append((b, i)), "windows", sizes, max_rows)
    batch = _Batch()
    run(batch, 7)  # type: ignore[arg-type]
    assert batch.sparkSession.conf.values == {CODEGEN_FACTORY_MODE: mode}
    assert handed == [(batch, 7)]


def test_each_query_is_sized_by_its_own_reports() -> None:
    sizes = BatchSizes()
    sizes.record("windows", 200_000, 0)
    sizes.record("open-windows", 500, 0)
    assert ByBatchSize(print, "windows", sizes, 20_000).mode() == GENERATED
    assert ByBatchSize(print, "open-windows", sizes, 20_000).mode() == INTERPRETED
