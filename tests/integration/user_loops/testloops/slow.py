"""A loop that takes its time: one report a step, each with a checkpoint, a
pause between steps (``params["pause"]`` seconds). Trial 0 converges, any
other trial stays high: the pruner's median rule prunes those."""

from __future__ import annotations

import time

import aistack


def train(ctx: aistack.TrialContext) -> None:
    start = 1
    saved = ctx.restore()
    if saved is not None:
        start = saved.step + 1
    pause = float(ctx.params.get("pause", 1.0))
    for step in range(start, ctx.epochs + 1):
        time.sleep(pause)
        value = 1.0 / step if ctx.trial_number == 0 else 5.0
        ctx.report(step, {"val_loss": value}, checkpoint={"step": step, "resumed_from": start})
