"""svc_tuner.record: the run and result records load as every version stored them."""

from __future__ import annotations

import pytest

from shared.errors import NotFound
from svc_tuner.record import Result, Run, parse_trial_id, trial_id


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ({}, Run()),
        ({"outcome": "skipped"}, Run(outcome="skipped")),
        # What ask() and the refit wrote before the record was typed.
        ({"attempt": 1, "seen": 5.0}, Run(seen=5.0)),
        ({"attempt": 1, "seen": 5.0, "refit": True}, Run(seen=5.0, refit=True)),
        (
            {
                "attempt": 2,
                "seen": 9.0,
                "published": 2,
                "running": False,
                "trainer": "t1",
                "errors": ["attempt 1: no report for 60 s"],
                "outcome": "quarantined",
            },
            Run(2, 2, 9.0, False, "t1", ("attempt 1: no report for 60 s",), "quarantined"),
        ),
    ],
)
def test_stored_runs_load(stored: dict[str, object], expected: Run) -> None:
    assert Run.load(stored) == expected
    assert Run.load(expected.dump()) == expected


def test_a_run_stores_only_what_differs_from_the_defaults() -> None:
    run = Run(seen=5.0).but(published=1, errors=("a",))
    assert run.dump() == {"published": 1, "seen": 5.0, "errors": ["a"]}
    assert not run.unsent and Run(seen=5.0).unsent


def test_a_result_stores_every_field() -> None:
    result = Result({"val_error": 0.1}, "m", "3", "t1")
    assert result.dump() == {
        "metrics": {"val_error": 0.1},
        "model_name": "m",
        "model_version": "3",
        "trainer": "t1",
    }


def test_trial_ids_round_trip_and_bad_ones_are_not_found() -> None:
    assert parse_trial_id(trial_id("digits/a", 7)) == ("digits/a", 7)
    with pytest.raises(NotFound):
        parse_trial_id("no-number")
