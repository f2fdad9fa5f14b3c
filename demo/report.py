"""The demo's report: what its run saw, collected step by step
(``DemoReport``) and written at its end as one HTML page by
``aistack.report`` into the state directory.

Each step hands in its part: the digits study (its trials from the tuner's
API), the k-fold errors, the flow's counts, the drift event with the live
windows it judged (read back from ``aistack.features.windows`` at the
positions the event names), the re-tune's before and after, and one
prediction's lineage. A part a run did not reach, or could not read, is a
section that says why: the report is written all the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aistack import report
from aistack.lineage import Node

if TYPE_CHECKING:
    from shared.contracts.aistack.v1 import monitoring_pb2
    from shared.settings import KafkaSettings

STUDY = "The digits study"
KFOLD = "Default, tuned and SVC by k-fold cross-validation"
FLOW = "The flow: raw, clean, dead letters, windows"
DRIFT = "Drift the monitor saw"
RETUNE = "The re-tune: before and after"
LINEAGE = "One prediction's lineage"


@dataclass
class DemoReport:
    run_id: str
    #: The digits study as the tuner's API returns it: (Study, [Trial]).
    study: tuple[Any, Sequence[Any]] | None = None
    kfold: report.Section | None = None
    flow: report.Flow | None = None
    drift: report.Section | None = None
    retune: report.Retune | None = None
    lineage: Node | None = None
    #: Why a part is missing, by its section's title.
    missing: dict[str, str] = field(default_factory=dict)

    def sections(self) -> list[report.Section]:
        """Every part in the demo's order; a missing one says why."""
        sections: list[report.Section] = []
        if self.study is not None:
            sections += report.study_sections(*self.study)
        else:
            sections.append(self._missing(STUDY))
        sections.append(self.kfold or self._missing(KFOLD))
        sections.append(report.flow_section(self.flow) if self.flow else self._missing(FLOW))
        sections.append(self.drift or self._missing(DRIFT))
        sections.append(
            report.retune_section(self.retune) if self.retune else self._missing(RETUNE)
        )
        sections.append(
            report.lineage_section(self.lineage, title=LINEAGE)
            if self.lineage
            else self._missing(LINEAGE)
        )
        return sections

    def write(self, state_dir: Path) -> Path:
        """The report, into ``STATE_DIR/reports/demo-RUN.html``; its path."""
        return report.write(
            report.default_path(state_dir, f"demo-{self.run_id}"),
            f"aistack demo {self.run_id}",
            self.sections(),
            subtitle="events → features → tuning → serving → drift → re-tune, as this run saw it",
        )

    def _missing(self, title: str) -> report.Section:
        why = self.missing.get(title, "this run did not reach it")
        return report.Section(title, [report.Paragraph(f"Not in this report: {why}.")])


def kfold_section(errors: Mapping[str, Sequence[float]], verdicts: Sequence[str]) -> report.Section:
    """Each configuration's fold errors with the mean's 95% interval
    (``demo.kfold.estimate``)."""
    from demo import kfold

    intervals = []
    for name, fold_errors in errors.items():
        estimate = kfold.estimate(fold_errors)
        intervals.append(
            report.Interval(name, list(fold_errors), estimate.mean, estimate.half_width)
        )
    return report.kfold_section(intervals, verdicts, title=KFOLD)


def drift_section(kafka: KafkaSettings, drift: monitoring_pb2.DriftDetected) -> report.Section:
    """The drift event's section, with the live windows it judged when they
    can be read back."""
    from shared.errors import AistackError

    try:
        live = judged_windows(kafka, drift)
    except (AistackError, OSError, RuntimeError) as error:
        note = f"The windows judged could not be read back ({error}): the reference alone is drawn."
        return report.drift_section(drift, {}, note=note)
    if not live:
        note = "None of the windows judged is still on the topic: the reference alone is drawn."
        return report.drift_section(drift, {}, note=note)
    return report.drift_section(drift, statistics(live, [s.statistic for s in drift.scores]))


def judged_windows(kafka: KafkaSettings, drift: monitoring_pb2.DriftDetected) -> list[Any]:
    """The feature's windows the monitor judged: those at the positions the
    event names (``DriftDetected.windows``) that belong to its feature and
    start between its first and last window's start, each key once, the
    latest ``horizon_windows`` of them by start (the monitor's horizon)."""
    from google.protobuf.message import DecodeError

    from aistack.lineage import Positions
    from shared.contracts.aistack.v1 import features_pb2
    from shared.feature_store import window_fields

    first = drift.first_window_start.ToMicroseconds()
    last = drift.last_window_start.ToMicroseconds()
    found: dict[str, Any] = {}
    with Positions(kafka) as bus:
        for span in drift.windows:
            for record in bus.read(span.topic, span.partition, span.min_offset, span.max_offset):
                try:
                    window = features_pb2.FeatureWindow.FromString(record.value())
                except DecodeError:  # not a window: the monitor passed it over too
                    continue
                start = window.window_start.ToMicroseconds()
                if (
                    not window.open
                    and drift.feature in window_fields(window)
                    and first <= start <= last
                ):
                    found.setdefault(window.window_key, window)
    ordered = sorted(found.values(), key=lambda w: (w.window_start.ToMicroseconds(), w.window_key))
    horizon = drift.thresholds.horizon_windows
    return ordered[-horizon:] if horizon else ordered


def statistics(windows: Sequence[Any], names: Sequence[str]) -> dict[str, list[float]]:
    """Each named statistic's values over ``windows`` (those a window carries)."""
    return {
        name: [float(getattr(w, name)) for w in windows]
        for name in names
        if windows and hasattr(windows[0], name)
    }


def retune(
    study_id: str, metric: str, result: Any, serving: float, best: float, served: str
) -> report.Retune:
    """A re-tune's before and after from its ``StudyResult``: promoted when
    the version it made is the one ``served`` (by validation, or under the
    live policy by a decision on live traffic)."""
    outcome = result.retune
    return report.Retune(
        study_id=study_id,
        metric=metric,
        serving_version=outcome.serving_version,
        serving_value=serving,
        best_version=result.best_model_version,
        best_value=best,
        promoted=served == result.best_model_version,
        reason=outcome.reason,
        served_version=served,
    )


__all__ = ["DemoReport", "drift_section", "judged_windows", "kfold_section", "retune"]
