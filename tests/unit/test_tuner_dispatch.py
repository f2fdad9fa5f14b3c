"""Where trial requests go: a freed trainer's partition first."""

from __future__ import annotations

from svc_tuner.dispatch import PartitionSlots


def test_first_requests_go_round_robin() -> None:
    slots = PartitionSlots(3)
    assert [slots.place(f"s/{n}") for n in range(5)] == [0, 1, 2, 0, 1]


def test_a_request_takes_the_partition_of_the_trial_that_ended() -> None:
    slots = PartitionSlots(3)
    for n in range(4):
        slots.place(f"s/{n}")  # partitions 0, 1, 2, 0
    slots.ended("s/1")
    slots.ended("s/3")
    assert slots.place("s/4") == 1  # the first freed, first
    assert slots.place("s/5") == 0
    assert slots.place("s/6") == 1  # none freed: round-robin goes on (0, 1, 2, 0, then 1)


def test_an_unknown_or_repeated_end_frees_nothing_and_leftovers_are_forgotten() -> None:
    slots = PartitionSlots(2)
    slots.place("s/0")
    slots.ended("s/0")
    slots.ended("s/0")  # a repeated report
    slots.ended("other/9")  # requested by a tuner before a restart
    assert slots.place("s/1") == 0
    slots.ended("s/1")
    slots.forget_freed()  # no request took the slot
    assert slots.place("s/2") == 1  # round-robin goes on where it was
    assert slots.place("s/3") == 0


def test_a_new_attempt_is_placed_afresh() -> None:
    slots = PartitionSlots(4)
    assert slots.place("s/0") == 0
    assert slots.place("s/0") == 1  # requested again (lost): not bound to its old place
    slots.ended("s/0")
    assert slots.place("s/1") == 1


def test_requests_go_to_the_trainer_with_the_fewest_trials_once_owners_are_reported() -> None:
    """Three partitions, two trainers: "a" owns 0 and 1, "b" owns 2. Blind
    round-robin gives "a" three of every four trials."""
    slots = PartitionSlots(3)
    first = [slots.place(f"s/{n}") for n in range(4)]
    assert first == [0, 1, 2, 0]  # nothing reported yet
    for n, partition in enumerate(first):
        slots.reported(f"s/{n}", "a" if partition in (0, 1) else "b")
    slots.ended("s/0")  # "a" finishes one: it still has two in flight, "b" one
    assert slots.place("s/4") == 2
    slots.ended("s/2")  # "b" is down to one (s/4) against two on "a"
    assert slots.place("s/5") == 2
    slots.ended("s/1")  # "a" is down to one: of its freed partitions, the first freed
    assert slots.place("s/6") == 0


def test_a_rebalance_is_learned_from_the_next_report() -> None:
    slots = PartitionSlots(2)
    assert [slots.place(f"s/{n}") for n in range(2)] == [0, 1]
    slots.reported("s/0", "a")
    slots.reported("s/1", "a")  # "a" holds both partitions
    assert slots.place("s/2") == 0  # every partition is a's: round-robin among them
    slots.reported("s/2", "b")  # partition 0 moved to "b"
    slots.ended("s/0")
    # "b" has s/2; "a" has s/1: a tie, and partition 0 was just freed.
    assert slots.place("s/3") == 0
    # A report for a trial not in flight teaches nothing.
    slots.reported("other/1", "c")
    assert slots.place("s/4") == 1


def test_with_the_groups_assignment_the_first_requests_go_one_to_each_trainer() -> None:
    """As many in flight as trainers: without the group's word both first
    requests went to "a" (partitions 0 and 1) and "b" idled until reports
    came back."""
    slots = PartitionSlots(3)
    slots.assigned({0: "a", 1: "a", 2: "b"})
    first = [slots.place(f"s/{n}") for n in range(2)]
    assert sorted(first) == [0, 2]
    slots.reported("s/0", "a")
    slots.ended("s/0")
    assert slots.place("s/2") == 0  # "a" is free again: its freed partition


def test_a_later_assignment_replaces_what_was_known_and_a_report_overrides_it() -> None:
    slots = PartitionSlots(2)
    slots.assigned({0: "a", 1: "a"})
    assert slots.place("s/0") == 0
    assert slots.place("s/1") == 1  # all a's: round-robin among them
    slots.assigned({0: "a", 1: "b"})  # "b" joined and took partition 1
    slots.ended("s/1")
    assert slots.place("s/2") == 1  # "b" has none in flight, "a" one
    slots.reported("s/2", "a")  # partition 1 went back to "a" since
    assert slots.place("s/3") == 0  # every partition is a's again: round-robin
