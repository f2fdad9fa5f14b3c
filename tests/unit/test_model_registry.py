"""The model registry every reader of ``aistack.models.ready`` answers from
(``shared.model_registry``): which events it takes, which version serves
under each policy, and its follower on the in-memory bus."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from shared import model_registry
from shared.bus.consumer import Record
from shared.bus.loop import DeadLetters
from shared.bus.testing import MemoryPublisher, MemorySource, record
from shared.contracts.aistack.v1 import common_pb2, models_pb2
from shared.errors import NotFound, Unavailable
from shared.model_registry import Follower, Registry, serving
from tests.model_events import ready, retuned

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("new", "current", "policy", "expected"),
    [
        (ready(2, 0.1), ready(1, 0.2), "champion", True),
        (ready(2, 0.3), ready(1, 0.2), "champion", False),
        (ready(2, 0.2), ready(1, 0.2), "champion", False),  # a tie: the earlier version
        (ready(1, 0.2), ready(2, 0.2), "champion", True),  # whichever arrived first
        (ready(2, 0.3), ready(1, 0.2), "latest", True),
        (ready(1, 0.1), ready(2, 0.2), "latest", False),
        (ready(2, None), ready(1, 0.2), "champion", False),  # no value: never beats one
        (ready(2, 0.9), ready(1, None), "champion", True),
        (ready(2, None), ready(1, None), "champion", True),  # neither: the newer
        # A refit's validation metrics are on data it trained on: not judged by them.
        (ready(2, 0.01, refit=True), ready(1, 0.2), "champion", False),
        (ready(2, 0.3), ready(1, 0.01, refit=True), "champion", True),
        (ready(2, 0.01, refit=True), ready(1, 0.2), "latest", True),
        (
            ready(2, 0.9, direction=common_pb2.DIRECTION_MAXIMIZE),
            ready(1, 0.8, direction=common_pb2.DIRECTION_MAXIMIZE),
            "champion",
            True,
        ),
    ],
)
def test_which_of_two_versions_serves_under_each_policy(
    new: models_pb2.ModelReady, current: models_pb2.ModelReady, policy: str, expected: bool
) -> None:
    """``expected``: whether ``new`` takes ``current``'s place."""
    assert (serving([current, new], policy) is new) is expected  # type: ignore[arg-type]
    assert (serving([new, current], policy) is new) is expected  # type: ignore[arg-type]


def test_the_last_event_of_a_version_wins_and_versions_come_oldest_first() -> None:
    first, again = ready(1, 0.3), ready(1, 0.2)
    registry = Registry.of([ready(10, 0.5), first, ready(2, 0.4), again, ready(1, 0.9, name="x")])
    assert [e.version for e in registry.versions("m")] == ["1", "2", "10"]
    assert registry.version("m", "1") is again
    assert registry.names() == ["m", "x"]
    assert registry.next_version("m") == "11"
    assert registry.next_version("new") == "1"


def test_an_event_without_a_model_or_with_a_bad_version_is_skipped_with_why() -> None:
    registry = Registry()
    assert registry.add(ready("v1", 0.1)) == "model version must be a positive integer, got 'v1'"
    assert registry.add(ready(0, 0.1)) == "model version must be a positive integer, got '0'"
    assert registry.add(ready(1, 0.1, name="")) == "the event names no model"
    assert registry.add(ready(2, 0.5)) == ""
    assert [reason for _, reason in registry.skipped] == [
        "model version must be a positive integer, got 'v1'",
        "model version must be a positive integer, got '0'",
        "the event names no model",
    ]
    assert [e.version for e in registry.versions("m")] == ["2"]


def test_a_model_named_without_a_version_is_the_one_the_policy_serves() -> None:
    registry = Registry.of([ready(1, 0.1), ready(2, 0.3), ready(3, 0.2)])
    assert registry.version("m").version == "1"
    assert registry.version("m", "", "champion").version == "1"
    assert registry.version("m", "", "latest").version == "3"
    assert registry.serving("m", "latest") is registry.version("m", "3")
    assert registry.serving("unknown", "champion") is None


def test_unknown_models_and_versions_say_what_there_is() -> None:
    registry = Registry.of([ready(1, 0.3), ready(2, None), ready(1, None, name="other")])
    with pytest.raises(NotFound, match=r"^unknown model 'nope' \(models: m, other\)$"):
        registry.version("nope")
    with pytest.raises(NotFound, match=r"^model 'm' has no version 9 \(versions: 1, 2\)$"):
        registry.version("m", "9")
    with pytest.raises(NotFound, match=r"^model 'm' has no version x \(versions: 1, 2\)$"):
        registry.version("m", "x")
    with pytest.raises(NotFound, match=r"^unknown model 'm' \(models: none\)$"):
        Registry().versions("m")


# ---- the follower ----

DLQ = "dlq"


def records(*values: models_pb2.ModelReady | bytes | None) -> list[Record[models_pb2.ModelReady]]:
    return [
        record(models_pb2.ModelReady, value, topic="models", offset=offset)
        for offset, value in enumerate(values)
    ]


def follower(source: MemorySource[models_pb2.ModelReady]) -> tuple[Follower, MemoryPublisher]:
    publisher = MemoryPublisher()
    dead_letters = DeadLetters(publisher, topic=DLQ, service="test")
    following = Follower(source, topic="models", publisher=publisher, dead_letters=dead_letters)
    return following, publisher


def test_the_replay_gives_the_last_event_of_each_version_and_every_skipped_one() -> None:
    again, other = ready(1, 0.2), ready(1, 0.5, name="x")
    source = MemorySource(
        records(ready(1, 0.3), ready("v2", 0.1), ready(2, 0.4), None, b"not a model", again, other)
    )
    following, publisher = follower(source)

    updates = following.replay(timeout=5)

    assert [(u.event.model_name, u.event.version, u.record.offset) for u in updates] == [
        ("m", "v2", 1),
        ("m", "2", 2),
        ("m", "1", 5),
        ("x", "1", 6),
    ]
    assert updates[0].skipped == "model version must be a positive integer, got 'v2'"
    assert [u.skipped for u in updates[1:]] == ["", "", ""]
    assert following.registry.version("m", "1") == again
    assert following.registry.serving("m", "champion") == again
    # The record that is not a ModelReady is dead-lettered; the tombstone passed over.
    [letter] = publisher.dead_letters(DLQ)
    assert (letter.source.offset, letter.reason) == (4, "invalid_protobuf")


def test_after_the_replay_each_step_gives_what_it_read_in_order() -> None:
    source = MemorySource(records(ready(1, 0.3)))
    following, _ = follower(source)
    following.replay(timeout=5)
    assert following.step() == []

    source.pending = records(ready(2, 0.1), ready(2, 0.2), ready(0, 0.1))
    updates = following.step()

    assert [(u.event.version, u.skipped != "") for u in updates] == [
        ("2", False),
        ("2", False),
        ("0", True),
    ]
    assert following.registry.serving("m", "champion") == ready(2, 0.2)
    assert following.registry.serving("m", "latest") == ready(2, 0.2)


class Endless(MemorySource[models_pb2.ModelReady]):
    """A log that is never read to its end."""

    def caught_up(self) -> bool:
        return False


def test_a_replay_not_done_in_time_is_unavailable_and_one_told_to_stop_stops() -> None:
    following, _ = follower(Endless())
    with pytest.raises(Unavailable, match=r"^the models topic models was not replayed within"):
        following.replay(timeout=0.05)
    assert follower(Endless())[0].replay(timeout=5, stop=lambda: True) == []


def test_closing_the_follower_closes_its_source() -> None:
    source: MemorySource[models_pb2.ModelReady] = MemorySource()
    follower(source)[0].close()
    assert source.closed


#: The packages whose modules must ask the registry which version serves.
_PACKAGES = (
    "aistack",
    "compose",
    "svc_ingest",
    "svc_model",
    "svc_monitor",
    "svc_score",
    "svc_trainer",
    "svc_transform",
    "svc_tuner",
    "bench",
)
#: The rule's parts: only shared/ (the registry and the objective) composes them.
_RULE = {"champion", "supersedes"}


def test_only_the_shared_registry_decides_which_version_serves() -> None:
    """No service, command or benchmark applies the champion rule itself:
    each asks ``shared.model_registry`` (which honours the serving policy)."""
    offenders = []
    for package in _PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == "shared.objective":
                    taken = _RULE & {alias.name for alias in node.names}
                    if taken:
                        offenders.append(f"{path.relative_to(ROOT)}: {sorted(taken)}")
    assert offenders == []


def marked(version: int, value: float) -> models_pb2.ModelReady:
    event = ready(version, value)
    event.labels[model_registry.CHALLENGER_LABEL] = "true"
    return event


def test_the_challengers_are_the_newest_marked_or_retuned_and_the_previous_champion() -> None:
    serving_one = ready(2, 0.10)
    lost = retuned(4, 0.30, baseline=2, baseline_value=0.20)  # worse than 2 on its own data
    lost.lineage.study_id = "retune-2"
    older_lost = retuned(3, 0.30, baseline=2, baseline_value=0.20)
    older_lost.lineage.study_id = "retune-1"
    events = [ready(1, 0.5), serving_one, older_lost, lost, ready(5, 0.9), marked(6, 0.4)]
    registry = model_registry.Registry.of(events)
    assert registry.serving("m", "champion").version == "2"
    picked = registry.challengers("m", "champion", 8)
    # Newest first; 5 is none of them; 1 is the previous champion.
    assert [e.version for e in picked] == ["6", "4", "3", "1"]
    assert [e.version for e in registry.challengers("m", "champion", 1)] == ["6"]
    assert registry.challengers("m", "champion", 0) == []
    # Marked, the serving version is still not its own challenger; a re-tune
    # that lost to it is one; under "latest" the re-tune serves and the
    # version before it shadows.
    pair = [marked(1, 0.1), retuned(2, 0.3, 1, 0.2)]
    assert [e.version for e in model_registry.challengers(pair, "champion", 8)] == ["2"]
    assert [e.version for e in model_registry.challengers(pair, "latest", 8)] == ["1"]
    # The version a champion displaced shadows it, whether it lost by
    # validation values or on live traffic; an older one displaced before is none.
    displaced = [ready(1, 0.5), ready(2, 0.3), ready(3, 0.1)]
    assert [e.version for e in model_registry.challengers(displaced, "champion", 8)] == ["2"]
    assert [e.version for e in model_registry.challengers([ready(1, 0.1)], "champion", 8)] == []
    assert model_registry.challengers([], "champion", 1) == []
    assert registry.challengers("nothing", "champion", 1) == []


def test_under_the_live_policy_a_retuned_winner_shadows_until_a_decision_promotes_it() -> None:
    from tests.model_events import decided

    winner = retuned(2, 0.10, baseline=1, baseline_value=0.30)  # beat 1 on its own data
    events = [ready(1, 0.2), winner]
    assert model_registry.serving(events, "champion").version == "2"
    assert model_registry.serving(events, "live").version == "1"
    assert [e.version for e in model_registry.challengers(events, "live", 1)] == ["2"]
    promoted = [ready(1, 0.2), decided(winner, 1, newest=2)]
    assert model_registry.serving(promoted, "live").version == "2"
    assert [e.version for e in model_registry.challengers(promoted, "live", 1)] == ["1"]


def test_of_a_retunes_versions_its_best_challenges() -> None:
    trials = [retuned(v, value, 1, 0.05) for v, value in ((2, 0.3), (3, 0.2), (4, 0.4))]
    for trial in trials:
        trial.lineage.study_id = "forecast-retune-1"
    events = [ready(1, 0.1), *trials]
    assert model_registry.serving(events, "champion").version == "1"
    assert [e.version for e in model_registry.challengers(events, "champion", 8)] == ["3"]
