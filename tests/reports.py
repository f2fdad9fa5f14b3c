"""Synthetic inputs for the report (a study's API messages, a drift event)
and readers of a report page (its figures as plotly embedded them, its
headings): shared by the report's unit tests, its integration test and the
browser test."""

from __future__ import annotations

import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from aistack import report
from aistack.lineage import Node
from shared import search_space
from shared.contracts.aistack.v1 import common_pb2, models_pb2, monitoring_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api


def spec(name: str = "digits") -> tuning_pb2.StudySpec:
    message = tuning_pb2.StudySpec(name=name)
    message.objective.metric = "val_loss"
    message.objective.direction = common_pb2.DIRECTION_MINIMIZE
    lr = message.params.add(name="lr").float_range
    lr.low, lr.high, lr.log = 1e-4, 1e-1, True
    layers = message.params.add(name="layers").int_range
    layers.low, layers.high = 1, 4
    optimizer = message.params.add(name="optimizer").categorical
    for choice in ("adam", "sgd"):
        optimizer.choices.add(string_value=choice)
    message.sampler.kind = tuning_pb2.SAMPLER_KIND_TPE
    message.pruner.kind = tuning_pb2.PRUNER_KIND_SUCCESSIVE_HALVING
    return message


def trial(
    number: int,
    state: int,
    *,
    epochs: int = 4,
    value: float | None = None,
    study_id: str = "digits",
) -> api.Trial:
    lr = 10 ** (-4 + 3 * ((number * 7) % 10) / 10)
    message = api.Trial(
        trial_id=f"{study_id}-{number}", study_id=study_id, number=number, state=state
    )
    message.params["lr"].CopyFrom(search_space.param_value(lr))
    message.params["layers"].CopyFrom(search_space.param_value(1 + number % 4))
    message.params["optimizer"].CopyFrom(search_space.param_value(("adam", "sgd")[number % 2]))
    loss = 0.5 + abs(math.log10(lr) + 2.5) / 3 + 0.05 * (number % 4)
    for step in range(1, epochs + 1):
        message.intermediate_values.add(step=step, value=loss + 1.0 / step)
    if value is not None:
        message.value = value
    elif state == api.TRIAL_STATE_COMPLETED:
        message.value = loss + 1.0 / epochs
    return message


def study(name: str = "digits") -> tuple[api.Study, list[api.Trial]]:
    trials = [trial(n, api.TRIAL_STATE_COMPLETED, study_id=name) for n in range(10)]
    trials += [trial(n, api.TRIAL_STATE_PRUNED, epochs=2, study_id=name) for n in (10, 11, 12)]
    trials.append(trial(13, api.TRIAL_STATE_FAILED, epochs=0, study_id=name))
    trials.append(trial(14, api.TRIAL_STATE_RUNNING, epochs=1, study_id=name))
    message = api.Study(study_id=name, spec=spec(name), state=api.STUDY_STATE_RUNNING)
    message.trial_counts.update({"completed": 10, "pruned": 3, "failed": 1, "running": 1})
    message.best_trial.CopyFrom(min(trials[:10], key=lambda t: t.value))
    return message, trials


def figures(page: str) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """Every figure's data and layout, as plotly embedded them."""
    decoder = json.JSONDecoder()
    found = []
    for match in re.finditer(r"Plotly\.newPlot\(\s*", page):
        at = match.end()
        _, at = decoder.raw_decode(page, at)  # the div's id
        at = page.index(",", at) + 1
        data, at = decoder.raw_decode(page, _skip(page, at))
        at = page.index(",", at) + 1
        layout, _ = decoder.raw_decode(page, _skip(page, at))
        found.append((data, layout))
    return found


def _skip(text: str, at: int) -> int:
    while text[at].isspace():
        at += 1
    return at


def points(trace: dict[str, Any]) -> int:
    y = trace.get("y")
    if isinstance(y, dict):  # plotly's typed arrays: {"dtype": ..., "bdata": ...}
        return int(y.get("shape", "0").split(",")[0]) if "shape" in y else len(y["bdata"])
    return len(y or [])


def title_of(layout: dict[str, Any]) -> str:
    title = layout.get("title", "")
    return str(title.get("text", "") if isinstance(title, dict) else title)


class Headings(HTMLParser):
    """The page's h2 headings and its scripts' sources."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.sources: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_h2 = tag == "h2"
        if tag == "script" and dict(attrs).get("src"):
            self.sources.append(str(dict(attrs)["src"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2":
            self._in_h2 = False

    def handle_data(self, data: str) -> None:
        if self._in_h2:
            self.headings.append(data)


def headings(page: str) -> Headings:
    parsed = Headings()
    parsed.feed(page)
    return parsed


def drift() -> monitoring_pb2.DriftDetected:
    event = monitoring_pb2.DriftDetected(
        drift_id="d1",
        model_name="forecast",
        model_version="3",
        feature="temperature@tumbling-60s",
        study_id="forecast-1",
    )
    event.thresholds.psi, event.thresholds.ks, event.thresholds.alpha = 0.25, 0.2, 0.05
    event.thresholds.horizon_windows = 30
    event.scores.add(statistic="mean", psi=3.1, ks=0.9, ks_critical=0.3, windows=30, drifted=True)
    event.scores.add(statistic="count", psi=0.02, ks=0.1, ks_critical=0.3, windows=30)
    distribution = event.serving.training_distribution
    for name, centre in (("mean", 21.0), ("count", 10.0)):
        levels = [i / 20 for i in range(21)]
        distribution.statistics.append(
            models_pb2.StatisticReference(
                statistic=name,
                levels=levels,
                quantiles=[centre - 2 + 4 * level for level in levels],
                windows=120,
            )
        )
    return event


#: Each fold's error of two configurations (5 folds).
DEFAULT = [0.05, 0.06, 0.04, 0.05, 0.07]
TUNED = [0.02, 0.03, 0.02, 0.025, 0.03]


def full_demo_report(state_dir: Path) -> Path:
    """A demo run's report with every section, written under ``state_dir``."""
    from demo import report as demo_report

    collected = demo_report.DemoReport("0101-120000")
    collected.study = study()
    collected.kfold = demo_report.kfold_section(
        {"default CNN": DEFAULT, "tuned CNN": TUNED}, ["the tuned CNN beats the default"]
    )
    collected.flow = report.Flow(raw=100, clean=90, dead_letters={"not_json": 4}, windows=12)
    collected.drift = report.drift_section(drift(), {"mean": [30.0, 31.0]})
    collected.retune = report.Retune("r", "val_mae", "1", 2.0, "2", 1.0, True, "better", "2")
    collected.lineage = Node("prediction p", children=[Node("model m@1")])
    return collected.write(state_dir)
