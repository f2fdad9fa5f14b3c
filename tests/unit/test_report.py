"""The report (``aistack.report``): from the tuner's API messages and the
demo's numbers to one self-contained HTML page: each section, plotly.js once
inline, a figure per plot with data in it, the pruned trials in the
intermediate values, the lineage as nested lists, every name escaped."""

from __future__ import annotations

from pathlib import Path

import pytest

from aistack import report
from aistack.lineage import Node
from shared import search_space
from tests.reports import drift, figures, headings, points, study, title_of

pytest.importorskip("plotly")
pytest.importorskip("optuna")

NASTY = "<script>alert('x')</script>"


def test_a_study_rebuilt_keeps_the_tuners_numbers_states_and_values() -> None:
    message, trials = study()
    del trials[5]  # a number the tuner skipped
    rebuilt = report.optuna_study(message, trials)
    by_number = {t.number: t for t in rebuilt.trials}
    assert sorted(by_number) == list(range(15))
    assert by_number[5].state.name == "FAIL"  # the gap: shown by no plot
    assert by_number[4].state.name == "COMPLETE" and by_number[4].value == trials[4].value
    assert by_number[10].state.name == "PRUNED"
    pruned = next(t for t in trials if t.number == 10)
    assert by_number[10].intermediate_values == {
        iv.step: iv.value for iv in pruned.intermediate_values
    }
    assert by_number[13].state.name == "FAIL"
    assert by_number[14].state.name == "RUNNING"
    assert by_number[3].params["optimizer"] == "sgd" and by_number[3].params["layers"] == 4
    assert rebuilt.direction.name == "MINIMIZE"


def test_a_value_outside_its_distribution_is_left_out_of_that_trial() -> None:
    message, trials = study()
    trials[0].params["layers"].CopyFrom(search_space.param_value(9))
    rebuilt = report.optuna_study(message, trials)
    assert "layers" not in rebuilt.trials[0].params and "lr" in rebuilt.trials[0].params


def test_the_study_sections_hold_optunas_plots_with_data(tmp_path: Path) -> None:
    message, trials = study()
    page = report.render("study digits", report.study_sections(message, trials))
    assert headings(page).headings == [
        "Study digits",
        "Optimisation history",
        "Parameter importances",
        "Intermediate values",
    ]
    drawn = figures(page)
    assert len(drawn) == 3
    for data, _ in drawn:
        assert data and any(points(trace) for trace in data)
    history, importances, intermediate = drawn
    assert "Optimization History" in title_of(history[1])
    assert {t.get("type") for t in importances[0]} == {"bar"}
    # One line per trial with intermediate values, the pruned ones marked
    # and ending after their two epochs.
    names = {t["name"]: t for t in intermediate[0]}
    pruned = {n for n in names if n.endswith("(pruned)")}
    assert pruned == {f"trial {n} (pruned)" for n in (10, 11, 12)}
    assert all(points(names[n]) == 2 for n in pruned)
    assert "dash" not in names["trial 0 (completed)"]["line"]
    assert names["trial 10 (pruned)"]["line"]["dash"] == "dot"
    assert "trial 13 (failed)" not in names  # no intermediate values
    assert "1 trials were still running" in page


def test_the_page_is_self_contained_with_plotly_js_inline_once(tmp_path: Path) -> None:
    message, trials = study()
    sections = [*report.study_sections(message, trials), kfold()]
    path = report.write(tmp_path / "reports" / "r.html", "study digits", sections)
    page = path.read_text()
    assert page.count("* plotly.js v") == 1  # the library's banner, in the head
    assert page.index("* plotly.js v") < page.index("<body>")
    assert headings(page).sources == []  # nothing fetched: no CDN, no file beside it
    assert 'src="https://cdn.plot.ly' not in page
    assert len(figures(page)) == 4


def kfold() -> report.Section:
    intervals = [
        report.Interval("default CNN", [0.05, 0.06, 0.04, 0.05], 0.05, 0.012),
        report.Interval("tuned CNN", [0.02, 0.03, 0.02, 0.025], 0.024, 0.006),
        report.Interval("SVC (scikit-learn)", [0.01, 0.02, 0.015, 0.01], 0.014, 0.007),
    ]
    return report.kfold_section(intervals, ["the tuned CNN beats the default configuration"])


def test_the_kfold_section_shows_each_mean_with_its_interval_and_each_fold() -> None:
    page = report.render("k-fold", [kfold()])
    [(data, layout)] = figures(page)
    means = [t for t in data if t.get("error_y")]
    assert [t["x"] for t in means] == [["default CNN"], ["tuned CNN"], ["SVC (scikit-learn)"]]
    assert [t["error_y"]["array"] for t in means] == [[0.012], [0.006], [0.007]]
    folds = [t for t in data if not t.get("error_y")]
    assert [points(t) for t in folds] == [4, 4, 4]
    assert "4-fold" in title_of(layout)
    assert "2.40%" in page and "± 0.60%" in page
    assert "the tuned CNN beats the default configuration" in page


def test_the_drift_section_draws_reference_against_live_for_each_drifted_statistic() -> None:
    live = {"mean": [35.0 + i / 10 for i in range(30)], "count": [10.0] * 30}
    section = report.drift_section(drift(), live)
    page = report.render("drift", [section])
    [(data, layout)] = figures(page)  # one figure: only mean drifted
    assert "mean: PSI 3.10, KS 0.90" in title_of(layout)
    reference, observed = data
    assert points(reference) == 21 and "120 training windows" in reference["name"]
    assert points(observed) == 30 and "30 windows judged" in observed["name"]
    assert "temperature@tumbling-60s" in page and "3.100" in page and "steady" in page


def test_without_the_live_windows_the_reference_is_drawn_alone() -> None:
    page = report.render("drift", [report.drift_section(drift(), {}, note="not read")])
    [(data, _)] = figures(page)
    assert len(data) == 1 and "not read" in page


def test_the_retune_flow_and_lineage_sections() -> None:
    retune = report.Retune("forecast-retune-1", "val_mae", "3", 2.5, "4", 0.8, True, "better", "4")
    flow = report.Flow(
        raw=20_000, clean=18_500, dead_letters={"bad_json": 300, "bad_unit": 500}, windows=900
    )
    root = Node("prediction r1", children=[Node("model m@4", children=[Node("study s")])])
    root.children.append(Node("feature window w", children=[Node("raw record 0@12")]))
    page = report.render(
        "demo",
        [report.retune_section(retune), report.flow_section(flow), report.lineage_section(root)],
    )
    retune_figure, dead_letters = figures(page)
    assert retune_figure[0][0]["y"] == [2.5, 0.8]
    assert dead_letters[0][0]["x"] == [500, 300]  # most first
    assert "18500" in page and "promoted: better" in page
    tree = page[page.index('<div class="tree">') :]
    assert tree.startswith(
        '<div class="tree"><span>prediction r1</span><ul><li><span>model m@4</span><ul><li>'
        "<span>study s</span></li></ul></li><li><span>feature window w</span>"
    )


def test_every_name_is_escaped() -> None:
    message, trials = study(NASTY)
    root = Node(NASTY, children=[Node(f"child {NASTY}")])
    page = report.render(
        f"study {NASTY}",
        [*report.study_sections(message, trials), report.lineage_section(root)],
        subtitle=NASTY,
    )
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert f"Study {NASTY}" in headings(page).headings


def test_a_study_without_completed_trials_says_so() -> None:
    message, trials = study()
    page = report.render("s", report.study_sections(message, trials[10:13]))
    assert "No trial has completed" in page
    assert "No parameter importances" in page
    [(data, _)] = figures(page)  # the pruned trials' intermediate values
    assert len(data) == 3


def test_the_default_path_is_in_the_state_directory(tmp_path: Path) -> None:
    assert report.default_path(tmp_path, "digits-0101") == tmp_path / "reports/digits-0101.html"
    assert report.default_path(tmp_path, "../a b/<c>") == tmp_path / "reports/a_b_c.html"


def test_aistack_report_on_an_unreachable_tuner_is_one_line_and_exit_status_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from aistack import cli
    from shared.ports import free_port

    argv = ["report", "s", "--tuner", f"127.0.0.1:{free_port()}", "-o", str(tmp_path / "r.html")]
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("aistack: ") and err.count("\n") == 1
    assert not (tmp_path / "r.html").exists()
