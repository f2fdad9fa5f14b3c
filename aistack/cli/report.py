"""``aistack report STUDY``: a study as one self-contained HTML page
(``aistack.report``): its trials in words, Optuna's optimisation history,
parameter importances and intermediate values with the pruned trials."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aistack.cli.study import TunerOption


def report(
    study_id: Annotated[str, typer.Argument(metavar="STUDY_ID", help="the study to report on")],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            metavar="FILE",
            help="where to write it (default: $AISTACK_STATE_DIR/reports/STUDY_ID.html)",
        ),
    ] = None,
    tuner: TunerOption = None,
) -> int:
    """Write a study's report: one HTML file with Optuna's plots, openable offline."""
    from aistack import report as reports
    from aistack.client import Client

    with Client(tuner) as client:
        study = client.study(study_id)
        trials = client.trials(study_id)
        state_dir = client.settings.lineage.common.state_dir
    path = output or reports.default_path(state_dir, study_id)
    reports.write(
        path,
        f"aistack study {study_id}",
        reports.study_sections(study, trials),
        subtitle=f"{len(trials)} trials, as svc_tuner holds them",
    )
    print(path)
    return 0
