"""``aistack score``: a Parquet file scored by a model's version in a Spark job (svc_score)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from shared.errors import AistackError


def score(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL[@VERSION]", help="default version: the one served (AISTACK_MODEL_POLICY)"
        ),
    ],
    input: Annotated[
        str,
        typer.Option(
            "--input",
            help="Parquet file or directory to score: a path, or s3://bucket/prefix "
            "(s3a://) on the object store (AISTACK_OBJECT_STORE_*)",
        ),
    ],
    output: Annotated[
        str,
        typer.Option(
            help="a new directory for the predictions: a path, or s3://bucket/prefix "
            "(s3a://) on the object store, complete once it holds _lineage.json"
        ),
    ],
    columns: Annotated[
        str | None,
        typer.Option(
            help="input columns, comma-separated, in the model's input order "
            "(default: the offline store's feature stats, for a model of that width)"
        ),
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            help="score only the rows matching this Spark SQL condition, "
            "e.g. \"metric = 'temperature' AND window = 'tumbling-60s'\""
        ),
    ] = None,
    publish: Annotated[
        bool,
        typer.Option(
            "--publish",
            help="also publish each scored row to aistack.predictions.batch "
            "(AISTACK_SCORE_PREDICTIONS_TOPIC), with its window's sources",
        ),
    ] = False,
    row_sources: Annotated[
        bool,
        typer.Option(
            "--row-sources",
            help="keep each row's sources (its window's clean-event offsets) in the output; "
            "each file's lineage in _lineage.json has them merged either way",
        ),
    ] = False,
) -> int:
    """Score a Parquet file with a model's version in a Spark job."""
    from shared import object_store
    from shared.settings import load_settings
    from svc_score import app
    from svc_score.settings import ScoreSettings

    chosen = tuple(c.strip() for c in columns.split(",") if c.strip()) if columns else ()
    try:
        scored = app.run(
            load_settings(ScoreSettings),
            model,
            input_path=input,
            output=output if object_store.is_object_url(output) else Path(output),
            columns=chosen,
            where=where or "",
            publish=publish,
            row_sources=row_sources,
        )
    except AistackError as exc:
        print(f"aistack score: {exc}", file=sys.stderr)
        return 1
    lineage = scored.lineage
    published = lineage.get("published")
    also = f" and {published['records']} records to {published['topic']}" if published else ""
    print(
        f"scored {scored.rows} rows with {lineage['model']} version {lineage['version']} "
        f"into {scored.output}{also}"
    )
    return 0
