"""Which partition of the trials topic each trial request goes to.

Trainers take whole partitions of ``aistack.tuning.trials`` (one consumer
group), not single records, so where a request lands decides which trainer
trains it, and a trainer that owns more partitions than another (three
partitions, two trainers) gets more of a blind round-robin. So the slots
know which trainer owns each partition and a request goes to a partition
of the trainer with the fewest trials in flight (placed and not ended,
queued ones included). On a tie, a partition freed by a trial that just
ended comes first (its trainer has just become free), then round-robin.

The owners come from two places, the latest word winning: the trainers'
consumer group as its coordinator describes it (``assigned``; the tuner
asks before it places requests, at most every few seconds), and the
reports (a report names its trainer, so a rebalance between two
descriptions is learned as trials run). A partition whose owner is known
from neither counts as a trainer of its own. Without the group's word, the
first requests of a study with as many in flight as trainers could all
land on one trainer while the other idled until reports came back. Kept in
memory: a restarted tuner asks again.
"""

from __future__ import annotations

from collections import Counter


class PartitionSlots:
    def __init__(self, partitions: int) -> None:
        self._partitions = max(1, partitions)
        self._next = 0
        self._placed: dict[str, int] = {}  # trial id → partition, while in flight
        self._freed: list[int] = []  # in the order trials ended
        self._owners: dict[int, str] = {}  # partition → trainer id, as reported

    def reported(self, trial_id: str, trainer_id: str) -> None:
        """``trainer_id`` reported on ``trial_id``: it owns the trial's partition."""
        partition = self._placed.get(trial_id)
        if partition is not None and trainer_id:
            self._owners[partition] = trainer_id

    def assigned(self, owners: dict[int, str]) -> None:
        """The group's assignment now: partition → trainer id. Partitions
        it does not name are held by nobody (unknown until reported)."""
        self._owners = dict(owners)

    def ended(self, trial_id: str) -> None:
        """``trial_id`` ended (completed, pruned, failed): its partition is free."""
        partition = self._placed.pop(trial_id, None)
        if partition is not None:
            self._freed.append(partition)

    def place(self, trial_id: str) -> int:
        """The partition for a request of ``trial_id`` (a new trial or a new attempt)."""
        self._placed.pop(trial_id, None)
        loads = Counter(self._owner(p) for p in self._placed.values())
        order = [(self._next + step) % self._partitions for step in range(self._partitions)]
        freed = self._freed
        partition = min(
            order,
            key=lambda p: (
                loads[self._owner(p)],
                (0, freed.index(p)) if p in freed else (1, order.index(p)),
            ),
        )
        if partition in freed:
            self._freed.remove(partition)
        else:
            self._next = partition + 1
        self._placed[trial_id] = partition
        return partition

    def forget_freed(self) -> None:
        """No request took the freed slots (the studies were full or over)."""
        self._freed.clear()

    def _owner(self, partition: int) -> str:
        return self._owners.get(partition) or f"partition {partition}"
