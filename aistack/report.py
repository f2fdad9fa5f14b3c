"""A report a person would rather look at: one self-contained HTML file
(``aistack report STUDY``, and the demo's report of its run).

A report is a title and ``Section``s, each a heading over parts: a
``Paragraph``, a ``Table``, a ``Figure`` (a plotly figure) or a ``Tree`` (a
lineage ``Node`` as nested lists). ``render`` writes them into one page with
plotly.js inline once, in the head: the file opens anywhere, offline. Every
text is escaped; plotly escapes its own JSON.

The building blocks, each from what a client of the platform reads:

- ``study_sections``: a study from the tuner's API (``GetStudy``,
  ``ListTrials``) rebuilt in memory as an Optuna study (``optuna_study``,
  the spec's distributions by ``shared.search_space``), drawn by Optuna's own
  plots: the optimisation history, the parameter importances, the
  intermediate values with the pruned trials marked;
- ``kfold_section``: configurations' k-fold errors, each mean with its 95%
  interval;
- ``drift_section``: a ``DriftDetected`` event: per drifted statistic the
  reference (the serving version's training distribution) against the live
  windows, with PSI and KS;
- ``retune_section``, ``flow_section``, ``lineage_section``: a re-tune's
  before and after, a flow's counts, one prediction's lineage.

Needs the ``report`` group (optuna, plotly): imported when a report is built.
"""

from __future__ import annotations

import html
import math
import re
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aistack.lineage import Node
from aistack.studies import describe_trial
from shared import search_space
from shared.contracts.aistack.v1 import common_pb2, monitoring_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api

if TYPE_CHECKING:
    import optuna

#: Where reports go under the state directory.
REPORTS_DIR = "reports"
#: A completed trial's colour and a pruned one's in the intermediate values.
COMPLETED_COLOUR = "#1f77b4"
PRUNED_COLOUR = "#d62728"
LIVE_COLOUR = "#d62728"
REFERENCE_COLOUR = "#1f77b4"


# ---- parts and sections ----


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Table:
    """Rows under ``headers``; all-empty headers: a table of names and values, no head row."""

    headers: Sequence[str]
    rows: Sequence[Sequence[object]]


@dataclass(frozen=True)
class Figure:
    """A plotly figure (``plotly.graph_objects.Figure``) and what to read in it."""

    figure: Any
    caption: str = ""


@dataclass(frozen=True)
class Tree:
    root: Node


Part = Paragraph | Table | Figure | Tree


@dataclass(frozen=True)
class Section:
    title: str
    parts: Sequence[Part] = field(default_factory=tuple)


def render(title: str, sections: Sequence[Section], *, subtitle: str = "") -> str:
    """The whole page: ``title``, ``subtitle``, a contents list and each
    section; plotly.js once, inline."""
    from plotly.offline import get_plotlyjs

    contents = "".join(
        f'<li><a href="#section-{i}">{_text(s.title)}</a></li>' for i, s in enumerate(sections, 1)
    )
    body = "\n".join(_section(i, s) for i, s in enumerate(sections, 1))
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_text(title)}</title>
<style>{_STYLE}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head>
<body>
<header>
<h1>{_text(title)}</h1>
<p class="subtitle">{_text(subtitle)}</p>
<p class="generated">written {_text(generated)} by aistack</p>
<nav><ol>{contents}</ol></nav>
</header>
<main>
{body}
</main>
</body>
</html>
"""


def write(path: Path, title: str, sections: Sequence[Section], *, subtitle: str = "") -> Path:
    """``render`` into ``path`` (its directory made); ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(title, sections, subtitle=subtitle), encoding="utf-8")
    return path


def default_path(state_dir: Path, name: str) -> Path:
    """``STATE_DIR/reports/NAME.html``, the name reduced to safe characters."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "report"
    return state_dir / REPORTS_DIR / f"{safe}.html"


def _section(number: int, section: Section) -> str:
    parts = "\n".join(_part(part) for part in section.parts)
    return f'<section id="section-{number}">\n<h2>{_text(section.title)}</h2>\n{parts}\n</section>'


def _part(part: Part) -> str:
    if isinstance(part, Paragraph):
        return f"<p>{_text(part.text)}</p>"
    if isinstance(part, Table):
        head = "".join(f"<th>{_text(h)}</th>" for h in part.headers)
        rows = "".join(
            "<tr>" + "".join(f"<td>{_text(cell)}</td>" for cell in row) + "</tr>"
            for row in part.rows
        )
        thead = f"<thead><tr>{head}</tr></thead>" if any(part.headers) else ""
        return f"<table>{thead}<tbody>{rows}</tbody></table>"
    if isinstance(part, Figure):
        import plotly.io as pio

        drawn = pio.to_html(
            part.figure,
            include_plotlyjs=False,
            full_html=False,
            default_height="440px",
            config={"displaylogo": False, "responsive": True},
        )
        caption = f"<figcaption>{_text(part.caption)}</figcaption>" if part.caption else ""
        return f'<figure class="plot">{drawn}{caption}</figure>'
    return f'<div class="tree">{_tree(part.root)}</div>'


def _tree(node: Node) -> str:
    """A node and what it came from, as nested lists."""
    children = "".join(f"<li>{_tree(child)}</li>" for child in node.children)
    below = f"<ul>{children}</ul>" if children else ""
    return f"<span>{_text(node.title)}</span>{below}"


def _text(value: object) -> str:
    return html.escape(str(value), quote=True)


# ---- a study, rebuilt from the tuner's API ----

_STATES = {
    api.TRIAL_STATE_COMPLETED: "COMPLETE",
    api.TRIAL_STATE_PRUNED: "PRUNED",
    api.TRIAL_STATE_FAILED: "FAIL",
    api.TRIAL_STATE_QUARANTINED: "FAIL",
    api.TRIAL_STATE_RUNNING: "RUNNING",
    api.TRIAL_STATE_REQUESTED: "RUNNING",
}


def optuna_study(study: api.Study, trials: Iterable[api.Trial]) -> optuna.Study:
    """An in-memory Optuna study holding ``trials`` as the tuner reported
    them: each trial's parameters in the spec's distributions
    (``shared.search_space``), its value, intermediate values and state, and
    Optuna's trial number equal to the tuner's (a number the tuner skipped is
    a failed trial here, which no plot shows). A parameter whose value is not
    in its distribution (a spec changed under a warm start) is left out of
    that trial; a completed trial without a value counts as failed."""
    import optuna
    from optuna.trial import TrialState, create_trial

    space = search_space.distributions(study.spec)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "a new study created"
    try:
        rebuilt = optuna.create_study(
            study_name=study.study_id,
            direction=search_space.direction(study.spec),
            sampler=optuna.samplers.RandomSampler(seed=0),
        )
    finally:
        optuna.logging.set_verbosity(verbosity)
    added = 0  # Optuna numbers the trials it is given 0, 1, 2, ...
    for trial in sorted(trials, key=lambda t: t.number):
        while added < trial.number:
            rebuilt.add_trial(create_trial(state=TrialState.FAIL))
            added += 1
        if added > trial.number:
            continue  # a number reported twice: the first stands
        state = TrialState[_STATES.get(trial.state, "FAIL")]
        if state == TrialState.COMPLETE and not trial.HasField("value"):
            state = TrialState.FAIL
        params, distributions = {}, {}
        for name, message in trial.params.items():
            value = search_space.python_value(message)
            distribution = space.get(name)
            if value is None or distribution is None or not _contains(distribution, value):
                continue
            params[name], distributions[name] = value, distribution
        rebuilt.add_trial(
            create_trial(
                state=state,
                value=trial.value if state == TrialState.COMPLETE else None,
                params=params,
                distributions=distributions,
                intermediate_values={
                    iv.step: iv.value for iv in trial.intermediate_values if math.isfinite(iv.value)
                },
                user_attrs={"tuner_state": api.TrialState.Name(trial.state)},
            )
        )
        added += 1
    return rebuilt


def _contains(distribution: Any, value: object) -> bool:
    try:
        return bool(distribution._contains(distribution.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False


def study_sections(study: api.Study, trials: Sequence[api.Trial]) -> list[Section]:
    """The study in words and Optuna's plots: its summary, the optimisation
    history, the parameter importances, the intermediate values."""
    from optuna import visualization

    rebuilt = optuna_study(study, trials)
    completed = [t for t in trials if t.state == api.TRIAL_STATE_COMPLETED and t.HasField("value")]
    metric = study.spec.objective.metric or "objective"
    sections = [Section(f"Study {study.study_id}", _study_summary(study, trials))]

    if completed:
        history = visualization.plot_optimization_history(rebuilt, target_name=metric)
        history_part: Part = Figure(
            history,
            f"{metric} of each completed trial by trial number, and the best so far "
            f"({'maximised' if _maximize(study) else 'minimised'}).",
        )
    else:
        history_part = Paragraph("No trial has completed: no history to draw.")
    sections.append(Section("Optimisation history", [history_part]))
    sections.append(Section("Parameter importances", [_importances(rebuilt, metric)]))
    sections.append(Section("Intermediate values", [_intermediate(rebuilt, trials)]))
    return sections


def _maximize(study: api.Study) -> bool:
    return study.spec.objective.direction == common_pb2.DIRECTION_MAXIMIZE


def _study_summary(study: api.Study, trials: Sequence[api.Trial]) -> list[Part]:
    spec = study.spec
    counts = ", ".join(f"{k} {v}" for k, v in sorted(study.trial_counts.items())) or "no trials"
    rows: list[tuple[str, str]] = [
        ("state", api.StudyState.Name(study.state).removeprefix("STUDY_STATE_").lower()),
        ("trials", counts),
        (
            "objective",
            f"{spec.objective.metric}, "
            f"{common_pb2.Direction.Name(spec.objective.direction).removeprefix('DIRECTION_')}",
        ),
        ("sampler", tuning_pb2.SamplerKind.Name(spec.sampler.kind).removeprefix("SAMPLER_KIND_")),
        ("pruner", tuning_pb2.PrunerKind.Name(spec.pruner.kind).removeprefix("PRUNER_KIND_")),
        ("parameters", ", ".join(p.name for p in spec.params)),
    ]
    if study.HasField("best_trial"):
        rows.append(("best", describe_trial(study.best_trial)))
    if study.error:
        rows.append(("failed", study.error))
    parts: list[Part] = [Table(("", ""), rows)]
    unfinished = sum(
        t.state in (api.TRIAL_STATE_REQUESTED, api.TRIAL_STATE_RUNNING) for t in trials
    )
    if unfinished:
        parts.append(Paragraph(f"{unfinished} trials were still running when this was written."))
    return parts


def _importances(rebuilt: optuna.Study, metric: str) -> Part:
    from optuna import visualization

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna's experimental-feature notices
            figure = visualization.plot_param_importances(rebuilt, target_name=metric)
    except (ValueError, RuntimeError) as why:
        return Paragraph(f"No parameter importances: {why}")
    if not figure.data:
        return Paragraph(
            "No parameter importances: they need two completed trials and a parameter that varies."
        )
    return Figure(
        figure,
        f"How much of {metric}'s variation each parameter explains over the completed trials "
        "(Optuna's default evaluator, PED-ANOVA), normalised to sum to 1.",
    )


def _intermediate(rebuilt: optuna.Study, trials: Sequence[api.Trial]) -> Part:
    """Optuna's plot of the intermediate values, each trace named and coloured
    by its trial's state: a pruned trial's line ends where it was pruned."""
    from optuna import visualization

    figure = visualization.plot_intermediate_values(rebuilt)
    if not figure.data:
        return Paragraph("No trial reported an intermediate value.")
    states = {t.number: t.state for t in trials}
    pruned = 0
    for trace in figure.data:
        number = int(str(trace.name).removeprefix("Trial"))  # Optuna names them TrialN
        if states.get(number) == api.TRIAL_STATE_PRUNED:
            pruned += 1
            trace.update(
                name=f"trial {number} (pruned)",
                line={"color": PRUNED_COLOUR, "dash": "dot", "width": 1.5},
                marker={"color": PRUNED_COLOUR},
                opacity=0.8,
            )
        else:
            state = api.TrialState.Name(states.get(number, 0)).removeprefix("TRIAL_STATE_")
            trace.update(
                name=f"trial {number} ({state.lower()})",
                line={"color": COMPLETED_COLOUR, "width": 1.5},
                marker={"color": COMPLETED_COLOUR},
                opacity=0.7,
            )
    figure.update_layout(xaxis_title="step (epoch)", yaxis_title="intermediate value")
    return Figure(
        figure,
        f"Each trial's value after each epoch ({len(figure.data)} trials): solid blue "
        f"completed, dotted red pruned ({pruned}), each ending where the pruner stopped it.",
    )


# ---- k-fold cross-validation ----


@dataclass(frozen=True)
class Interval:
    """One configuration's k-fold errors and their mean's 95% interval."""

    name: str
    errors: Sequence[float]
    mean: float
    half_width: float


def kfold_section(
    intervals: Sequence[Interval], notes: Sequence[str] = (), *, title: str = ""
) -> Section:
    """Each configuration's mean error with its 95% interval, over its
    per-fold errors; ``notes`` (the verdicts) under it."""
    import plotly.graph_objects as go

    folds = max((len(i.errors) for i in intervals), default=0)
    figure = go.Figure()
    for interval in intervals:
        figure.add_trace(
            go.Scatter(
                x=[interval.name] * len(interval.errors),
                y=list(interval.errors),
                mode="markers",
                name=f"{interval.name}: each fold",
                marker={"color": "#999999", "size": 7, "opacity": 0.6},
                showlegend=False,
            )
        )
        figure.add_trace(
            go.Scatter(
                x=[interval.name],
                y=[interval.mean],
                mode="markers",
                name=f"{interval.name}: mean ± 95%",
                marker={"size": 13, "symbol": "diamond"},
                error_y={"type": "data", "array": [interval.half_width], "thickness": 2},
            )
        )
    figure.update_layout(
        title=f"{folds}-fold cross-validation error",
        yaxis={"title": "error", "tickformat": ".1%", "rangemode": "tozero"},
        showlegend=False,
    )
    rows = [(i.name, f"{i.mean:.2%}", f"± {i.half_width:.2%}", len(i.errors)) for i in intervals]
    parts: list[Part] = [
        Figure(
            figure,
            "Diamonds: the mean error over the folds with its 95% interval (Student's t); "
            "grey points: each fold's error. The same folds for every configuration.",
        ),
        Table(("configuration", "mean error", "95% interval", "folds"), rows),
    ]
    parts += [Paragraph(note) for note in notes]
    return Section(title or "Default, tuned and SVC by k-fold cross-validation", parts)


# ---- drift ----


def drift_section(
    drift: monitoring_pb2.DriftDetected,
    live: Mapping[str, Sequence[float]],
    *,
    note: str = "",
) -> Section:
    """What the monitor saw: its scores per statistic, and for each drifted
    one the reference (the serving version's training distribution, as
    quantiles) against ``live`` (the statistic over the windows it judged;
    absent: only the reference is drawn)."""
    import plotly.graph_objects as go

    references = {r.statistic: r for r in drift.serving.training_distribution.statistics}
    t = drift.thresholds
    rows = [
        (
            s.statistic,
            f"{s.psi:.3f}",
            f"{s.ks:.3f}",
            f"{max(t.ks, s.ks_critical):.3f}",
            s.windows,
            "drifted" if s.drifted else "steady",
        )
        for s in drift.scores
    ]
    parts: list[Part] = [
        Paragraph(
            f"{drift.model_name} version {drift.model_version} on {drift.feature}: "
            f"{sum(s.drifted for s in drift.scores)} of {len(drift.scores)} statistics drifted "
            f"over the latest {t.horizon_windows} windows (PSI above {t.psi:g} and KS above its "
            f"threshold and critical value at alpha {t.alpha:g}); the version was trained by "
            f"{drift.study_id or 'an unknown study'}."
        ),
        Table(("statistic", "PSI", "KS D", "KS threshold", "windows", "verdict"), rows),
    ]
    if note:
        parts.append(Paragraph(note))
    for score in (s for s in drift.scores if s.drifted):
        figure = go.Figure()
        reference = references.get(score.statistic)
        if reference is not None:
            figure.add_trace(
                go.Scatter(
                    x=list(reference.quantiles),
                    y=list(reference.levels),
                    mode="lines+markers",
                    name=f"reference ({reference.windows} training windows)",
                    line={"color": REFERENCE_COLOUR},
                )
            )
        values = sorted(v for v in live.get(score.statistic, ()) if math.isfinite(v))
        if values:
            figure.add_trace(
                go.Scatter(
                    x=values,
                    y=[(i + 1) / len(values) for i in range(len(values))],
                    mode="lines",
                    line={"shape": "hv", "color": LIVE_COLOUR},
                    name=f"live ({len(values)} windows judged)",
                )
            )
        figure.update_layout(
            title=f"{score.statistic}: PSI {score.psi:.2f}, KS {score.ks:.2f}",
            xaxis_title=f"{score.statistic} of a window",
            yaxis={"title": "share of windows at or below", "range": [0, 1.02]},
            legend={"orientation": "h", "y": -0.2},
        )
        parts.append(
            Figure(
                figure,
                f"The distribution of {score.statistic} over the windows: the training "
                "reference's quantiles against the live windows the monitor judged "
                "(cumulative; KS is the widest vertical gap).",
            )
        )
    return Section("Drift the monitor saw", parts)


# ---- a re-tune, a flow, a lineage ----


@dataclass(frozen=True)
class Retune:
    """A re-tune's before and after on the fresh data."""

    study_id: str
    metric: str
    serving_version: str
    serving_value: float
    best_version: str
    best_value: float
    promoted: bool
    reason: str
    served_version: str


def retune_section(retune: Retune) -> Section:
    import plotly.graph_objects as go

    figure = go.Figure(
        go.Bar(
            x=[
                f"serving version {retune.serving_version}",
                f"re-tuned best version {retune.best_version}",
            ],
            y=[retune.serving_value, retune.best_value],
            marker={"color": [REFERENCE_COLOUR, "#2ca02c" if retune.promoted else "#7f7f7f"]},
            text=[f"{retune.serving_value:.4g}", f"{retune.best_value:.4g}"],
            textposition="auto",
        )
    )
    figure.update_layout(
        title=f"{retune.metric} on the fresh validation windows", yaxis_title=retune.metric
    )
    verdict = "promoted" if retune.promoted else "not promoted"
    rows = [
        ("re-tune", retune.study_id),
        (f"before: serving version {retune.serving_version}", f"{retune.serving_value:.4g}"),
        (f"after: re-tuned best version {retune.best_version}", f"{retune.best_value:.4g}"),
        ("verdict", f"{verdict}: {retune.reason}"),
        ("the model server serves", f"version {retune.served_version}"),
    ]
    return Section(
        "The re-tune: before and after",
        [
            Figure(figure, "Both versions measured on the same fresh windows."),
            Table(("", ""), rows),
        ],
    )


@dataclass(frozen=True)
class Flow:
    """Records through the pipeline."""

    raw: int
    clean: int
    dead_letters: Mapping[str, int]
    windows: int
    published: int = 0


def flow_section(flow: Flow) -> Section:
    import plotly.graph_objects as go

    dead = sum(flow.dead_letters.values())
    rows: list[tuple[str, object]] = []
    if flow.published:
        rows.append(("published", flow.published))
    rows += [
        ("raw records", flow.raw),
        ("clean events", flow.clean),
        ("dead letters", dead),
        ("feature windows", flow.windows),
    ]
    parts: list[Part] = [Table(("", "records"), rows)]
    reasons = sorted(flow.dead_letters.items(), key=lambda kv: (-kv[1], kv[0]))
    if reasons:
        figure = go.Figure(
            go.Bar(
                x=[n for _, n in reasons],
                y=[r for r, _ in reasons],
                orientation="h",
                marker={"color": PRUNED_COLOUR},
            )
        )
        figure.update_layout(
            title="Dead letters by reason",
            xaxis_title="records",
            yaxis={"autorange": "reversed"},
        )
        parts.append(Figure(figure, "Why each malformed record was set aside."))
        parts.append(Table(("reason", "dead letters"), reasons))
    return Section("The flow: raw, clean, dead letters, windows", parts)


def lineage_section(root: Node, *, title: str = "One prediction's lineage") -> Section:
    return Section(
        title,
        [
            Paragraph("Walked back from the prediction log to the raw records (aistack lineage)."),
            Tree(root),
        ],
    )


_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
  color: #1b1f24; background: #fafafa; }
header, main { max-width: 1100px; margin: 0 auto; padding: 0 1.5rem; }
header { padding-top: 1.5rem; }
h1 { margin-bottom: 0.2rem; }
.subtitle { color: #444; margin-top: 0; }
.generated { color: #777; font-size: 0.85rem; }
section { background: #fff; border: 1px solid #e3e3e3; border-radius: 6px;
  padding: 0.5rem 1.5rem 1rem; margin: 1.2rem 0; }
table { border-collapse: collapse; margin: 0.8rem 0; font-size: 0.92rem; }
th, td { border-bottom: 1px solid #e6e6e6; padding: 0.3rem 0.8rem; text-align: left;
  vertical-align: top; }
th { background: #f3f4f6; }
figure.plot { margin: 0.8rem 0; }
figcaption { color: #555; font-size: 0.88rem; margin-top: 0.3rem; }
.tree ul { list-style: none; margin: 0; padding-left: 1.3rem; border-left: 1px dotted #bbb; }
.tree > span { font-weight: 600; }
.tree li { margin: 0.2rem 0; font-family: ui-monospace, monospace; font-size: 0.86rem; }
"""


__all__ = [
    "Figure",
    "Flow",
    "Interval",
    "Paragraph",
    "Retune",
    "Section",
    "Table",
    "Tree",
    "default_path",
    "drift_section",
    "flow_section",
    "kfold_section",
    "lineage_section",
    "optuna_study",
    "render",
    "retune_section",
    "study_sections",
    "write",
]
