"""``aistack produce``: synthetic raw events (good, bad, repeated) onto Kafka (``loadgen``)."""

from __future__ import annotations

from typing import Annotated

import typer


# Values are strings here and checked by loadgen, so a bad one is one line.
def produce(
    kind: Annotated[str, typer.Argument(metavar="{sensors,weblogs}")],
    rate: Annotated[
        str | None, typer.Option(help="events per second; 0 = as fast as possible")
    ] = None,
    count: Annotated[str | None, typer.Option(help="how many records in all")] = None,
    bad_fraction: Annotated[str, typer.Option(help="share of malformed records")] = "0",
    duplicate_fraction: Annotated[
        str, typer.Option(help="share of exact re-sends of good records")
    ] = "0",
    format: Annotated[
        str, typer.Option("--format", metavar="{json,protobuf,log,mixed}", help="payload format")
    ] = "mixed",
    seed: Annotated[
        str | None, typer.Option(help="random seed (default: random, printed at the end)")
    ] = None,
    topic: Annotated[
        str | None, typer.Option(help="target topic (default: aistack.events.raw)")
    ] = None,
) -> int:
    """Publish synthetic raw events (good, bad, duplicate) to Kafka."""
    from loadgen.publish import Given as Flags
    from loadgen.publish import run

    return run(Flags(kind, rate, count, bad_fraction, duplicate_fraction, format, seed, topic))
