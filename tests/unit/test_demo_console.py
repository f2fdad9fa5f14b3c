"""What the demo and ``aistack study watch`` print: Rich on a terminal (rules,
a study's progress bar, a table), plain lines in a log file, as before."""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import AsyncIterator
from typing import Any

from aistack.cli.study import watch
from aistack.studies import Progress, StudyProgress
from demo.console import Console, Summary
from shared.contracts.aistack.v1 import common_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True

    def text(self) -> str:
        """What was drawn, without the terminal's colour and cursor codes."""
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", self.getvalue())


def trial(number: int, state: int, value: float | None = None) -> api.Trial:
    made = api.Trial(number=number, state=state)
    if value is not None:
        made.value = value
    return made


TRIALS = [
    trial(0, api.TRIAL_STATE_RUNNING),
    trial(0, api.TRIAL_STATE_COMPLETED, 0.25),
    trial(1, api.TRIAL_STATE_RUNNING),
    trial(1, api.TRIAL_STATE_PRUNED),
]


def progressions() -> list[StudyProgress]:
    """The study's progress after each of ``TRIALS``, as a watch sees it."""
    progress = Progress(2, maximize=False)
    seen = []
    for made in TRIALS:
        progress.update(made)
        seen.append(progress.now)
    return seen


def summary() -> Summary:
    made = Summary()
    made.add("clean events", 18400)
    made.add("dead letters", "800: missing_field 75")
    return made


def test_off_a_terminal_every_state_is_one_plain_line() -> None:
    out = io.StringIO()
    console = Console(out)
    console.step(2, "events")
    console.progress("waiting")
    console.progress("waiting")  # the same state again: not written twice
    console.study(progressions()[1])
    console.line("done")
    console.summary(summary())
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("[2/8] events   (t+")
    assert lines[2:5] == [
        "  waiting",
        "  [############............] 1/2  requested 0  running 0  completed 1  pruned 0  "
        "failed 0  quarantined 0  best 0.25 (trial 0)",
        "done",
    ]
    assert lines[-4:] == [
        "-" * 62,
        "clean events  18400",
        "dead letters  800: missing_field 75",
        "-" * 62,
    ]


def test_on_a_terminal_rich_draws_the_steps_the_bar_and_the_table() -> None:
    out = Terminal()
    console = Console(out)
    console.step(3, "tuning")
    for progress in progressions():
        console.study(progress)
    console.line("done")
    console.summary(summary())
    drawn = out.text()
    assert "[3/8] tuning" in drawn and "─" in drawn  # a rule under the step
    assert "2/2" in drawn and "━" in drawn  # the bar, full at the end
    assert "[####" not in drawn  # no bar drawn by hand
    assert "aistack demo: summary" in drawn
    assert "│ clean events │ 18400" in drawn


class Tuner:
    """Stands in for the tuner's stub: one study of two trials, watched."""

    async def GetStudy(self, request: api.GetStudyRequest) -> api.GetStudyResponse:
        spec = tuning_pb2.StudySpec()
        spec.budget.max_trials = 2
        spec.objective.direction = common_pb2.DIRECTION_MINIMIZE
        return api.GetStudyResponse(
            study=api.Study(study_id=request.study_id, spec=spec, state=api.STUDY_STATE_RUNNING)
        )

    async def _updates(self) -> AsyncIterator[api.WatchStudyResponse]:
        for index, made in enumerate(TRIALS):
            last = index == len(TRIALS) - 1
            state = api.STUDY_STATE_COMPLETED if last else api.STUDY_STATE_RUNNING
            yield api.WatchStudyResponse(trial=made, study_state=state)

    def WatchStudy(self, request: api.WatchStudyRequest) -> AsyncIterator[api.WatchStudyResponse]:
        return self._updates()


def test_watch_prints_a_line_per_change_off_a_terminal_and_a_bar_on_one() -> None:
    stub: Any = Tuner()
    plain = io.StringIO()
    assert asyncio.run(watch(stub, "s-1", plain)) == 0
    lines = plain.getvalue().splitlines()
    assert len(lines) == len(TRIALS) + 1
    assert lines[-2].startswith("[########################] 2/2")
    assert lines[-1] == "study s-1: STUDY_STATE_COMPLETED"

    terminal = Terminal()
    assert asyncio.run(watch(stub, "s-1", terminal)) == 0
    drawn = terminal.text()
    assert "2/2" in drawn and "━" in drawn and "[####" not in drawn
    assert drawn.endswith("study s-1: STUDY_STATE_COMPLETED\n")
