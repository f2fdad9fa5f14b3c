"""``aistack lineage``: a prediction or a model version, walked back to the raw
records under it (``aistack.lineage``)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from aistack.cli import terminal
from shared.errors import AistackError


def lineage(
    target: Annotated[
        str,
        typer.Argument(
            metavar="REQUEST_ID|MODEL@VERSION",
            help="a logged prediction's request id, or a model's version",
        ),
    ],
    json: Annotated[bool, typer.Option("--json", help="the tree as JSON")] = False,
) -> int:
    """Walk a prediction or a model version back to the raw records under it."""
    import json as json_text

    from aistack import lineage as walk
    from aistack.settings import LineageSettings
    from shared.settings import load_settings

    try:
        tree = walk.trace(load_settings(LineageSettings), target)
    except AistackError as exc:
        print(f"aistack lineage: {exc}", file=sys.stderr)
        return 1
    if json:
        print(json_text.dumps(tree.to_json(), indent=2, default=str))
    else:
        terminal.tree(tree)
    return 0
