"""The demo's report (``demo.report``): the parts a run hands in, the ones it
missed said so, the k-fold intervals by ``demo.kfold``, and the windows a
drift event judged read back from their positions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from aistack import report
from demo import kfold
from demo import report as demo_report
from shared.contracts.aistack.v1 import features_pb2
from shared.settings import KafkaSettings
from tests.reports import DEFAULT, TUNED, drift, figures, full_demo_report, headings

pytest.importorskip("plotly")
pytest.importorskip("optuna")


def test_a_full_run_writes_every_section_into_the_state_directory(tmp_path: Path) -> None:
    path = full_demo_report(tmp_path)
    assert path == tmp_path / "reports" / "demo-0101-120000.html"
    page = path.read_text()
    assert headings(page).headings == [
        "Study digits",
        "Optimisation history",
        "Parameter importances",
        "Intermediate values",
        demo_report.KFOLD,
        demo_report.FLOW,
        demo_report.DRIFT,
        demo_report.RETUNE,
        demo_report.LINEAGE,
    ]
    # history, importances, intermediate values, k-fold, dead letters, drift, re-tune
    assert len(figures(page)) == 7
    assert "Not in this report" not in page


def test_the_kfold_intervals_are_demo_kfolds_estimates() -> None:
    section = demo_report.kfold_section({"default CNN": DEFAULT, "tuned CNN": TUNED}, [])
    [(data, _)] = figures(report.render("k", [section]))
    means = [t for t in data if t.get("error_y")]
    for trace, errors in zip(means, (DEFAULT, TUNED), strict=True):
        estimate = kfold.estimate(errors)
        assert trace["y"] == [pytest.approx(estimate.mean)]
        assert trace["error_y"]["array"] == [pytest.approx(estimate.half_width)]


def test_a_part_the_run_did_not_reach_says_why() -> None:
    collected = demo_report.DemoReport("r")
    collected.missing[demo_report.LINEAGE] = "step 6 made no prediction by entity"
    page = report.render("demo", collected.sections())
    assert "Not in this report: step 6 made no prediction by entity." in page
    assert "Not in this report: this run did not reach it." in page
    assert figures(page) == []


def window(key: str, minute: int, mean: float, **fields: Any) -> features_pb2.FeatureWindow:
    message = features_pb2.FeatureWindow(window_key=key, metric="temperature", mean=mean, **fields)
    message.window_start.FromSeconds(1_800_000_000 + 60 * minute)
    message.window_size.FromSeconds(60)
    message.window_slide.FromSeconds(60)
    return message


class Record:
    def __init__(self, value: bytes) -> None:
        self._value = value

    def value(self) -> bytes:
        return self._value


class FakePositions:
    """aistack.lineage.Positions over a list of records per (topic, partition)."""

    records: ClassVar[dict[tuple[str, int], list[bytes]]] = {}
    asked: ClassVar[list[tuple[str, int, int, int]]] = []

    def __init__(self, kafka: KafkaSettings) -> None:
        pass

    def __enter__(self) -> FakePositions:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self, topic: str, partition: int, first: int, last: int) -> Iterator[Record]:
        self.asked.append((topic, partition, first, last))
        for value in self.records[(topic, partition)][first : last + 1]:
            yield Record(value)


def test_the_windows_judged_are_the_features_latest_at_the_events_positions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import aistack.lineage

    event = drift()
    event.thresholds.horizon_windows = 3
    event.first_window_start.FromSeconds(1_800_000_000 + 60)
    event.last_window_start.FromSeconds(1_800_000_000 + 60 * 5)
    event.windows.add(topic="w", partition=0, min_offset=0, max_offset=8)
    other = window("o", 3, 99.0)
    other.window_slide.FromSeconds(30)  # another feature: sliding-60s-every-30s
    FakePositions.records = {
        ("w", 0): [
            window("a", 0, 10.0).SerializeToString(),  # before the first start judged
            window("b", 1, 11.0).SerializeToString(),  # older than the horizon's three
            window("c", 2, 12.0).SerializeToString(),
            b"\xff not a window",
            other.SerializeToString(),
            window("c", 2, 12.0).SerializeToString(),  # at least once: a repeat
            window("d", 4, 14.0).SerializeToString(),
            window("e", 5, 15.0, open=True).SerializeToString(),  # still open
            window("f", 5, 15.5).SerializeToString(),
        ]
    }
    monkeypatch.setattr(aistack.lineage, "Positions", FakePositions)
    judged = demo_report.judged_windows(KafkaSettings(), event)
    assert [w.window_key for w in judged] == ["c", "d", "f"]
    assert FakePositions.asked == [("w", 0, 0, 8)]
    assert demo_report.statistics(judged, ["mean", "nosuch"]) == {"mean": [12.0, 14.0, 15.5]}
    section = demo_report.drift_section(KafkaSettings(), event)
    [(data, _)] = figures(report.render("d", [section]))
    assert data[1]["y"] == [1 / 3, 2 / 3, 1.0] and data[1]["x"] == [12.0, 14.0, 15.5]


def test_windows_that_cannot_be_read_leave_the_reference_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import aistack.lineage
    from shared.errors import Unavailable

    class Away(FakePositions):
        def read(self, topic: str, partition: int, first: int, last: int) -> Iterator[Record]:
            raise Unavailable("broker away")

    event = drift()
    event.windows.add(topic="w", partition=0, min_offset=0, max_offset=1)
    monkeypatch.setattr(aistack.lineage, "Positions", Away)
    page = report.render("d", [demo_report.drift_section(KafkaSettings(), event)])
    assert "could not be read back (broker away)" in page
    [(data, _)] = figures(page)
    assert len(data) == 1
