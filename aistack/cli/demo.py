"""``aistack demo`` (``make demo``): the whole stack end to end, run by the ``demo`` package."""

from __future__ import annotations

from typing import Annotated

import typer

from aistack.cli.stack import Secure


def demo(
    keep: Annotated[
        bool, typer.Option("--keep", help="leave the stack running at the end")
    ] = False,
    secure: Secure = False,
    sensor_events: Annotated[int, typer.Option(min=0, help="sensor readings to send")] = 16_000,
    weblog_events: Annotated[int, typer.Option(min=0, help="web log lines to send")] = 4_000,
    trials: Annotated[int, typer.Option(min=1, help="trials of the digits study")] = 64,
    folds: Annotated[int, typer.Option(min=2, help="folds of the cross-validated comparison")] = 10,
) -> int:
    """Run the whole stack end to end (events → features → tuning → serving)."""
    from demo.run import DemoOptions, run

    return run(DemoOptions(keep, secure, sensor_events, weblog_events, trials, folds))
