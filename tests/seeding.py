"""Whether code draws from the random module's global generator: what it
draws twice, each time right after the same ``random.seed``. Shared by the
tests that hold the bus's ids and svc_model's sampling to generators of
their own."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def after_the_same_seed(draw: Callable[[], T], seed: int = 7) -> tuple[T, T]:
    """``draw()`` twice, each right after ``random.seed(seed)``; the random
    module's state is put back afterwards."""
    state = random.getstate()
    try:
        random.seed(seed)
        first = draw()
        random.seed(seed)
        return first, draw()
    finally:
        random.setstate(state)
