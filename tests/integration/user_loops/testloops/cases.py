"""A loop that does one thing wrong, the one ``params["case"]`` names."""

from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

import aistack


def train(ctx: aistack.TrialContext) -> None:
    case = ctx.params["case"]
    if case == "ok":
        ctx.report(1, {"val_loss": 0.5})
    elif case == "raise":
        ctx.report(1, {"val_loss": 0.5})
        raise ValueError(f"shapes do not match: {ctx.data.input_shape} vs (7,)")
    elif case == "nan":
        ctx.report(1, {"val_loss": math.nan})
    elif case == "silent_return":
        return
    elif case == "hang":
        time.sleep(3600)
    elif case == "exit":
        sys.exit(3)
    elif case == "abort":
        os.abort()
    elif case == "allocate":
        # A loop that checks in while it hoards: never silent, so the memory
        # limit ends it however slowly the machine hands out pages (400 MB
        # took 1.2 s on the 2-core build machine; the stall limit came first).
        hoard = []
        while True:
            ctx.should_stop()
            hoard.append(np.ones(50_000_000))  # 400 MB a time, touched
            time.sleep(0.05)
