"""svc_model's repository: the champion rule, what is kept, what a request gets."""

from __future__ import annotations

import pytest

from shared.contracts.aistack.v1 import models_pb2
from shared.errors import InvalidArgument, NotFound
from svc_model.repository import Repository, Served, wanted
from tests.model_events import decided, ready, retuned

challenger = retuned


def served(event: models_pb2.ModelReady) -> Served:
    return Served(name=event.model_name, version=int(event.version), event=event, executor=None)


def test_install_promotes_only_better_versions_and_keeps_the_champion() -> None:
    repository = Repository("champion", keep_versions=2)
    assert repository.install(served(ready(1, 0.2))).promoted
    assert not repository.install(served(ready(2, 0.3))).promoted
    change = repository.install(served(ready(3, 0.4)))
    # Newest two (2, 3) and the champion (1): nothing evicted yet.
    assert not change.promoted and change.evicted == ()
    change = repository.install(served(ready(4, 0.5)))
    assert [s.version for s in change.evicted] == [2]
    assert repository.loaded_versions("m") == [1, 3, 4]
    assert repository.resolve("m").version == 1
    change = repository.install(served(ready(5, 0.1)))
    assert change.promoted
    assert [s.version for s in change.evicted] == [1, 3]
    assert repository.loaded_versions("m") == [4, 5]


def test_resolve_names_what_is_missing() -> None:
    repository = Repository("champion", keep_versions=2)
    repository.install(served(ready(1, 0.2)))
    assert repository.resolve("m", "1").version == 1
    with pytest.raises(NotFound, match="unknown model 'x'"):
        repository.resolve("x")
    with pytest.raises(NotFound, match="no version 2 loaded"):
        repository.resolve("m", "2")
    with pytest.raises(InvalidArgument, match="positive integer"):
        repository.resolve("m", "v1")
    repository.unload("m")
    with pytest.raises(NotFound, match="unloaded"):
        repository.resolve("m")


def test_replay_loads_the_champion_and_the_newest() -> None:
    events = [ready(1, 0.3), ready(2, 0.1), ready(3, 0.4), ready(4, 0.5)]
    assert wanted(events, "champion", keep=1) == [2, 4]
    assert wanted(events, "champion", keep=3) == [2, 3, 4]
    assert wanted(events, "latest", keep=1) == [4]
    assert wanted([], "champion", keep=1) == []


def test_the_champion_does_not_depend_on_the_order_versions_arrive_in() -> None:
    """Live installs and a restarted server's replay pick the same version:
    the best value, ties to the earlier, a refit never (shared.objective)."""
    events = [ready(1, 0.3), ready(2, 0.1), ready(3, 0.1), ready(4, 0.05, refit=True)]
    for order in (events, events[::-1], [events[2], events[0], events[3], events[1]]):
        repository = Repository("champion", keep_versions=1)
        for event in order:
            repository.install(served(event))
        champion = repository.champion("m")
        assert champion is not None and champion.version == 2
    assert wanted(events, "champion", keep=1) == [2, 4]


def test_the_index_shows_every_known_version_and_why_it_is_not_ready() -> None:
    repository = Repository("champion", keep_versions=1)
    for event in (ready(1, 0.3), ready(2, 0.1), ready(3, 0.2)):
        repository.know(event)
    repository.install(served(ready(2, 0.1)))
    repository.failed("m", "3", "checksum_mismatch")
    states = [(e.version, e.state, e.reason) for e in repository.index()]
    assert states == [
        ("1", "UNAVAILABLE", "not loaded"),
        ("2", "READY", ""),
        ("3", "UNAVAILABLE", "checksum_mismatch"),
    ]
    assert [e.version for e in repository.index(ready_only=True)] == ["2"]


def test_a_challenger_loaded_before_its_baseline_is_judged_again_when_that_loads() -> None:
    repository = Repository("champion", keep_versions=3)
    assert repository.install(served(ready(1, 0.3))).promoted
    # 0.5 on the drifted data against version 2's 0.9 there; 0.3 means
    # nothing to it (version 1 was measured on other data), so it waits.
    assert not repository.install(
        served(challenger(3, 0.5, baseline=2, baseline_value=0.9))
    ).promoted
    assert repository.champion("m").version == 1  # type: ignore[union-attr]
    change = repository.install(served(ready(2, 0.1)))
    assert change.promoted
    assert repository.champion("m").version == 3  # type: ignore[union-attr]


def test_a_retunes_versions_are_judged_against_their_baseline_after_it_is_evicted() -> None:
    """The demo's re-tune, as svc_model saw it: the baseline (version 3) was
    evicted once the re-tune's first version beat it, and the champion was
    then found among the loaded versions alone, where version 4 (judged on
    the old data) beat every re-tune version; the re-tune's best, version 8,
    never served."""
    repository = Repository("champion", keep_versions=2)
    for event in (ready(1, 0.30), ready(2, 0.25), ready(3, 0.21), ready(4, 0.26)):
        repository.install(served(event))
    assert repository.champion("m").version == 3  # type: ignore[union-attr]
    change = repository.install(served(challenger(5, 0.527, baseline=3, baseline_value=0.637)))
    assert change.promoted and 3 in [s.version for s in change.evicted]

    assert not repository.install(
        served(challenger(6, 0.644, baseline=3, baseline_value=0.637))
    ).promoted
    assert repository.champion("m").version == 5  # type: ignore[union-attr]
    assert repository.install(
        served(challenger(7, 0.402, baseline=3, baseline_value=0.637))
    ).promoted
    assert repository.install(
        served(challenger(8, 0.365, baseline=3, baseline_value=0.637))
    ).promoted
    assert repository.champion("m").version == 8  # type: ignore[union-attr]
    # A restarted server's replay picks the same.
    assert 8 in wanted(repository.known("m"), "champion", keep=1)


def test_the_rules_pick_serves_once_loaded_and_a_failed_one_never() -> None:
    repository = Repository("champion", keep_versions=3)
    repository.install(served(ready(1, 0.3)))
    repository.know(ready(2, 0.1))  # seen, still loading
    assert not repository.install(served(ready(3, 0.2))).promoted  # 2 is the pick, not loaded
    assert repository.champion("m").version == 1  # type: ignore[union-attr]
    repository.failed("m", "2", "no such file")
    assert repository.install(served(ready(4, 0.25))).promoted
    assert repository.champion("m").version == 3  # type: ignore[union-attr]


def test_a_loaded_versions_event_with_a_live_decision_makes_it_the_champion_at_once() -> None:
    """A decision on live traffic republishes the chosen version: the same
    bytes, so nothing loads, but the rule is asked again and the champion
    changes; the version it displaced becomes its challenger."""
    repository = Repository("champion", keep_versions=1, challengers=1)
    repository.install(served(ready(1, 0.1)))
    repository.install(served(challenger(2, 0.3, baseline=1, baseline_value=0.2)))
    assert repository.resolve("m").version == 1
    assert [s.version for s in repository.challengers("m")] == [2]
    assert not repository.know(ready(1, 0.1))  # a redelivery changes nothing
    assert repository.know(decided(repository.resolve("m", "2").event, 1, newest=2))
    assert repository.resolve("m").version == 2
    assert [s.version for s in repository.challengers("m")] == [1]
