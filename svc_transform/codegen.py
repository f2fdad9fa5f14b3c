"""Generated or interpreted projections, chosen for each micro-batch by its size.

The windows' aggregations carry sketches and offset ranges, which makes each
an object-hash aggregation, and Spark writes, formats and compiles the Java
source of its projections again in every task (only the compiled class is
cached). A batch of a second's readings spends more on that than on its rows;
a backlog's batch spends far more on its rows, where generated code is
faster. Spark reads its choice (``spark.sql.codegen.factoryMode``) as each
task builds its projections, from the settings of the session the batch runs
in: each streaming query's own clone of the session, set here from the
``foreachBatch`` function before the batch's action runs.

A batch's size is not known before it runs; the one before it is a close
guess, and the progress report says how far behind the source the query
was when it ended (``expected_rows``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Spark's (internal) setting for generated or interpreted projections.
CODEGEN_FACTORY_MODE = "spark.sql.codegen.factoryMode"
#: Interpreted projections: no source written or compiled.
INTERPRETED = "NO_CODEGEN"
#: Spark's default: generated code, interpreted only where it fails to compile.
GENERATED = "FALLBACK"


@dataclass
class BatchSizes:
    """Each query's expected next micro-batch, in rows, by query name, from
    its progress reports (``record``). Written by the listener's thread,
    read by each query's: one dict item, replaced whole."""

    _expected: dict[str, int] = field(default_factory=dict)

    def record(self, query: str, rows_in: int, rows_behind: int) -> None:
        """After a batch of ``rows_in`` rows that ended ``rows_behind`` the
        source's latest offsets."""
        self._expected[query] = max(rows_in, rows_behind)

    def expected_rows(self, query: str) -> int | None:
        """None before the query's first report (a start after downtime
        reads a backlog: the default, generated code, suits it)."""
        return self._expected.get(query)


@dataclass
class ByBatchSize:
    """A ``foreachBatch`` function that sets the batch's projections to
    interpreted when the batch is expected to hold at most
    ``interpreted_max_rows`` rows (0: never), generated otherwise, then hands
    it to ``sink``."""

    sink: Callable[[DataFrame, int], None]
    query: str
    sizes: BatchSizes
    interpreted_max_rows: int

    def mode(self) -> str:
        expected = self.sizes.expected_rows(self.query)
        small = (
            self.interpreted_max_rows > 0
            and expected is not None
            and expected <= self.interpreted_max_rows
        )
        return INTERPRETED if small else GENERATED

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        batch.sparkSession.conf.set(CODEGEN_FACTORY_MODE, self.mode())
        self.sink(batch, batch_id)
