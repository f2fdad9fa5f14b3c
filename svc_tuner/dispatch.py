"""Which partition of the trials topic each trial request goes to.

Trainers take whole partitions of ``aistack.tuning.trials`` (one consumer
group), not single records, so where a request lands decides which trainer
trains it. A request spread blindly (round-robin, or by key) can queue
behind a long trial on a busy trainer while another trainer idles. So a
request for a trial that fills a freed slot goes to the partition of the
trial that just ended: that partition's trainer has just become free. The
first requests, and those with no freed slot, go round-robin. With
``max_parallel`` at least the partition count, every partition (so every
trainer that owns one) always has a slot. Kept in memory: a restarted tuner
starts round-robin again, which is only less tidy.
"""

from __future__ import annotations

from collections import deque


class PartitionSlots:
    def __init__(self, partitions: int) -> None:
        self._partitions = max(1, partitions)
        self._next = 0
        self._placed: dict[str, int] = {}
        self._freed: deque[int] = deque()

    def ended(self, trial_id: str) -> None:
        """``trial_id`` ended (completed, pruned, failed): its partition is free."""
        partition = self._placed.pop(trial_id, None)
        if partition is not None:
            self._freed.append(partition)

    def place(self, trial_id: str) -> int:
        """The partition for a request of ``trial_id`` (a new trial or a new attempt)."""
        self._placed.pop(trial_id, None)
        if self._freed:
            partition = self._freed.popleft()
        else:
            partition = self._next % self._partitions
            self._next += 1
        self._placed[trial_id] = partition
        return partition

    def forget_freed(self) -> None:
        """No request took the freed slots (the studies were full or over)."""
        self._freed.clear()
