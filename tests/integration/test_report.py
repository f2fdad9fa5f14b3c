"""``aistack report`` against a real svc_tuner (on a real broker and Redis)
with a finished study, some of whose trials were pruned: one HTML file with
Optuna's plots drawn from the API's trials; a study that is not there is one
line and exit status 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from aistack import cli
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from tests.infra import Infra
from tests.integration import test_tuner_service
from tests.integration.test_tuner_service import run_pruned_study
from tests.integration.tuner_service import TunerProcess, TunerTopics
from tests.reports import figures, headings, points

pytest.importorskip("plotly")

# The same tuner on the same kind of topics as test_tuner_service's tests.
topics = test_tuner_service.topics
tuner = test_tuner_service.tuner


def test_aistack_report_draws_a_finished_study_with_its_pruned_trials(
    infra: Infra,
    topics: TunerTopics,
    tuner: TunerProcess,
    unique: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec, trials = run_pruned_study(
        infra, topics, tuner, unique, "{kind: PRUNER_KIND_MEDIAN, startup_trials: 2}"
    )
    pruned = {t.number for t in trials if t.state == api.TRIAL_STATE_PRUNED}
    assert pruned == {3, 4}

    # The default place: the state directory's reports/.
    monkeypatch.setenv("AISTACK_STATE_DIR", str(tmp_path / "state"))
    assert cli.main(["report", spec.name, "--tuner", tuner.target]) == 0
    written = Path(capsys.readouterr().out.strip())
    assert written == tmp_path / "state" / "reports" / f"{spec.name}.html"

    page = written.read_text()
    assert headings(page).headings == [
        f"Study {spec.name}",
        "Optimisation history",
        "Parameter importances",
        "Intermediate values",
    ]
    assert page.count("* plotly.js v") == 1 and headings(page).sources == []
    history, importances, intermediate = figures(page)
    assert points(history[0][0]) == 3  # the completed trials' values
    assert {t["type"] for t in importances[0]} == {"bar"} and points(importances[0][0]) == 2
    lines = {t["name"]: t for t in intermediate[0]}
    assert set(lines) == {f"trial {n} (completed)" for n in range(3)} | {
        f"trial {n} (pruned)" for n in pruned
    }
    assert all(points(lines[f"trial {n} (completed)"]) == 3 for n in range(3))

    out = tmp_path / "elsewhere" / "study.html"
    assert cli.main(["report", spec.name, "--tuner", tuner.target, "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out) and out.is_file()

    assert cli.main(["report", "no-such-study", "--tuner", tuner.target]) == 1
    out_text, err = capsys.readouterr()
    assert out_text == "" and err == "aistack: no study 'no-such-study'\n"
