"""The operations board (compose/grafana/dashboards/aistack.json) against the
code: every metric a panel's query names is a series a service exports, as
prometheus_client writes it on /metrics (a counter's ``_total``, a histogram's
``_bucket``, ``_sum``, ``_count``), read the way its type asks, and every
topic the board is for has its panel."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from shared.bus.lag import CONSUMER_LAG
from svc_ingest.metrics import IngestMetrics
from svc_model.metrics import ModelMetrics
from svc_monitor.metrics import MonitorMetrics
from svc_trainer.metrics import TrainerMetrics
from svc_transform.metrics import TransformMetrics
from svc_tuner.metrics import TunerMetrics

ROOT = Path(__file__).resolve().parents[2]
BOARD = ROOT / "compose" / "grafana" / "dashboards" / "aistack.json"

SERVICE_METRICS: dict[str, Callable[[CollectorRegistry], Any]] = {
    "svc_ingest": IngestMetrics.create,
    "svc_transform": TransformMetrics.create,
    "svc_tuner": TunerMetrics.create,
    "svc_trainer": TrainerMetrics.create,
    "svc_model": ModelMetrics.create,
    "svc_monitor": MonitorMetrics.create,
}

#: The issue's topics: each has a panel of this title that names this metric.
TOPICS = {
    "ingest rate": ("Ingest rate", "aistack_ingest_records_in_total"),
    "dead letters by reason": (
        "Ingest dead letters by reason",
        "aistack_ingest_dead_letters_total",
    ),
    "consumer lag per group": ("Consumer lag per group", "aistack_consumer_lag"),
    "window output": ("Window output", "aistack_transform_windows_out_total"),
    "trials by state": ("Trials by state", "aistack_trainer_trials_total"),
    "trainer samples/s": ("Trainer samples/s", "aistack_trainer_samples_per_second"),
    "serving requests": ("Serving requests", "aistack_model_requests_total"),
    "latency percentiles": ("Latency percentiles", "aistack_model_request_seconds_bucket"),
    "batch sizes": ("Batch sizes", "aistack_model_batch_size_bucket"),
    "drift events": ("Drift events", "aistack_monitor_drift_events_total"),
}


def exposed(registry: CollectorRegistry) -> dict[str, str]:
    """Each sample name on the registry's /metrics, with its metric's type."""
    kinds: dict[str, str] = {}
    kind = ""
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("# TYPE "):
            kind = line.split()[3]
        elif line and not line.startswith("#"):
            kinds[re.split(r"[{ ]", line, maxsplit=1)[0]] = kind
    return kinds


def with_a_series(metric: MetricWrapperBase) -> None:
    """One series of a labelled metric: without one it shows no sample at all."""
    names = getattr(metric, "_labelnames", ())
    if names:
        metric.labels(*("x" for _ in names))


@cache
def exported() -> dict[str, str]:
    """Every sample name a service exports, with its type: each service's
    metrics built on a registry of their own, and the consumer-lag gauge
    every service shares (shared.bus.lag)."""
    kinds: dict[str, str] = {}
    for create in SERVICE_METRICS.values():
        registry = CollectorRegistry()
        metrics = create(registry)
        for field in dataclasses.fields(metrics):
            with_a_series(getattr(metrics, field.name))
        kinds.update(exposed(registry))
    # The gauge lives in the process's registry: lend it one series and take it back.
    registry = CollectorRegistry()
    registry.register(CONSUMER_LAG)
    labels = ("test_grafana_board", "topic", "0")
    CONSUMER_LAG.labels(*labels).set(0)
    try:
        kinds.update(exposed(registry))
    finally:
        CONSUMER_LAG.remove(*labels)
    return kinds


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_NAME = re.compile(r"(?<![\w.:$])[A-Za-z_:][\w:]*")
#: Words of PromQL that are not metrics: aggregations (``sum by (x) (...)``
#: puts a grouping between the word and its parenthesis), binary operators,
#: modifiers, and the literals Inf and NaN.
_KEYWORDS = frozenset(
    {
        "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
        "bottomk", "topk", "quantile", "limitk", "limit_ratio",
        "and", "or", "unless", "atan2", "bool", "offset",
        "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan",
    }
)  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metrics a PromQL expression names: what is left once strings,
    label matchers, ranges, groupings, Grafana's variables, numbers,
    keywords and function calls are taken out."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _VARIABLE.sub(" ", text)
    names = set()
    for match in _NAME.finditer(text):
        called = text[match.end() :].lstrip().startswith("(")
        if not called and match.group().lower() not in _KEYWORDS:
            names.add(match.group())
    return names


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too; rows themselves not."""
    for panel in board["panels"]:
        if panel["type"] == "row":
            yield from panels(panel)
        else:
            yield panel


def queries(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in panels(board):
        for target in panel["targets"]:
            yield panel["title"], target["expr"]


_RATE = r"\b(?:rate|irate|increase)\(\s*{name}(?![\w:])"


def problems(board: dict[str, Any]) -> list[str]:
    """What is wrong with the board's queries; empty when nothing is."""
    kinds = exported()
    found = []
    for title, expr in queries(board):
        if "__name__" in expr:
            found.append(f"{title}: names a metric by a matcher, which no check can follow")
        for name in sorted(metric_names(expr)):
            if name not in kinds:
                found.append(f"{title}: {name} is exported by no service")
                continue
            uses = len(re.findall(rf"(?<![\w:]){name}(?![\w:])", expr))
            rated = len(re.findall(_RATE.format(name=name), expr))
            if kinds[name] == "gauge" and rated:
                found.append(f"{title}: {name} is a gauge, read with rate or increase")
            elif kinds[name] != "gauge" and rated != uses:
                found.append(f"{title}: {name} only goes up, read without rate or increase")
    return found


@cache
def board() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(BOARD.read_text())
    return loaded


def test_every_query_names_metrics_the_services_export_and_reads_them_by_their_type() -> None:
    assert problems(board()) == []


def test_the_services_export_what_the_check_reads() -> None:
    kinds = exported()
    # A counter shows as _total (the bare name is no series), a histogram as
    # its buckets, sum and count: the names a query must use.
    assert kinds["aistack_ingest_records_in_total"] == "counter"
    assert "aistack_ingest_records_in" not in kinds
    assert {f"aistack_model_request_seconds_{s}" for s in ("bucket", "sum", "count")} <= set(kinds)
    assert kinds["aistack_consumer_lag"] == "gauge"
    assert kinds["aistack_trainer_samples_per_second"] == "gauge"


@pytest.mark.parametrize(
    ("metric", "doctored", "problem"),
    [
        # misspelled
        (
            "aistack_model_batch_size_bucket",
            "aistack_model_batch_sizes_bucket",
            "aistack_model_batch_sizes_bucket is exported by no service",
        ),
        # the counter's registered name, which /metrics never shows
        (
            "aistack_ingest_records_in_total",
            "aistack_ingest_records_in",
            "aistack_ingest_records_in is exported by no service",
        ),
        # a gauge under rate()
        (
            "rate(aistack_transform_windows_out_total",
            "rate(aistack_transform_batch_seconds",
            "aistack_transform_batch_seconds is a gauge",
        ),
        # a counter without rate()
        (
            "sum by (reader) (aistack_consumer_lag)",
            "sum by (reader) (aistack_monitor_drift_events_total)",
            "aistack_monitor_drift_events_total only goes up",
        ),
    ],
)
def test_a_doctored_board_fails(metric: str, doctored: str, problem: str) -> None:
    spoiled = copy.deepcopy(board())
    changed = 0
    for panel in panels(spoiled):
        for target in panel["targets"]:
            if metric in target["expr"] and not changed:
                target["expr"] = target["expr"].replace(metric, doctored)
                changed += 1
    assert changed == 1, f"the board has no query with {metric} to doctor"
    assert any(problem in found for found in problems(spoiled)), problems(spoiled)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'histogram_quantile(0.95, sum by (le, model) (rate(m_bucket{model=~"a|b"}[5m] '
            "offset 1h)))",
            {"m_bucket"},
        ),
        ("sum(rate(a_total[$__rate_interval])) / on (job) group_left b", {"a_total", "b"}),
        ("x > bool 3 and y unless z or 1e3 * Inf", {"x", "y", "z"}),
        ("topk (3, foo) or vector(0)", {"foo"}),
        ("max_over_time(g[1h:5m]) @ end() - label_replace(h, 'd', '$1', 's', '(.*)')", {"g", "h"}),
        ("sum without (instance) (c:recorded:rate5m)", {"c:recorded:rate5m"}),
    ],
)
def test_metric_names_finds_the_metrics_of_an_expression_and_nothing_else(
    expr: str, names: set[str]
) -> None:
    assert metric_names(expr) == names


def test_every_topic_has_its_panel() -> None:
    by_title = {panel["title"]: panel for panel in panels(board())}
    for topic, (title, metric) in TOPICS.items():
        assert title in by_title, f"no panel for {topic}"
        named = set().union(*(metric_names(t["expr"]) for t in by_title[title]["targets"]))
        assert metric in named, f"{title} does not show {metric}"


def test_percentiles_come_from_the_histograms_buckets() -> None:
    by_title = {panel["title"]: panel for panel in panels(board())}
    for title in ("Latency percentiles", "Batch sizes"):
        exprs = [target["expr"] for target in by_title[title]["targets"]]
        quantiles = [expr for expr in exprs if "histogram_quantile" in expr]
        assert quantiles, title
        for expr in quantiles:
            # Buckets summed over instances and replicas must keep their bounds.
            assert re.search(r"\bby \([^)]*\ble\b", expr), expr
            assert all(name.endswith("_bucket") for name in metric_names(expr)), expr


def test_the_board_is_well_formed() -> None:
    loaded = board()
    ids = [panel["id"] for panel in loaded["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(loaded):
        assert panel["targets"], f"{panel['title']} has no query"
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, f"{panel['title']} runs off the board"
