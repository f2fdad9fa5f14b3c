"""svc_score's decisions before Spark reads a row: which version, which
columns, what the output holds."""

from __future__ import annotations

import pytest

from shared.contracts.aistack.v1 import common_pb2, models_pb2
from shared.errors import InvalidArgument
from shared.feature_store import FEATURE_STATS
from shared.model_registry import Registry
from svc_model.repository import wanted
from svc_score.plan import BadInput, UnknownModel, choose, parse_model, plan


def ready(
    name: str,
    version: str,
    error: float | None = None,
    *,
    refit: bool = False,
    shape: tuple[int, ...] = (-1, 7),
    datatype: str = "FP32",
    outputs: tuple[tuple[str, tuple[int, ...]], ...] = (("prediction", (-1, 1)),),
) -> models_pb2.ModelReady:
    event = models_pb2.ModelReady(
        model_name=name,
        version=version,
        objective=common_pb2.Objective(metric="val_error", direction=common_pb2.DIRECTION_MINIMIZE),
        labels={"refit": "true"} if refit else {},
    )
    if error is not None:
        event.metrics["val_error"] = error
    event.inputs.add(name="input", datatype=datatype, shape=list(shape))
    for out, out_shape in outputs:
        event.outputs.add(name=out, datatype="FP32", shape=list(out_shape))
    return event


def test_a_model_is_named_with_or_without_its_version() -> None:
    assert parse_model("digits") == ("digits", "")
    assert parse_model("digits@3") == ("digits", "3")
    for bad in ("@3", "digits@0", "digits@x"):
        with pytest.raises(InvalidArgument):
            parse_model(bad)


def test_without_a_version_the_champion_scores_as_svc_model_would_serve_it() -> None:
    events = [
        ready("m", "1", 0.3),
        ready("m", "2", 0.1),
        ready("m", "3", 0.05, refit=True),  # a refit is not judged by its metric
        ready("m", "4", 0.2),
        ready("other", "1", 0.01),
    ]
    chosen = choose(Registry.of(events), "m", "")
    assert chosen.version == "2"
    # The same version the model server's champion policy keeps loaded.
    assert int(chosen.version) in wanted(events[:4], "champion", keep=1)
    assert wanted(events[:4], "champion", keep=1) == [2, 4]
    # Under the latest policy, the newest: what the server then serves.
    assert choose(Registry.of(events), "m", "", "latest").version == "4"


def test_a_named_version_is_the_last_event_published_for_it() -> None:
    first, again = ready("m", "1", 0.3), ready("m", "1", 0.2)
    assert choose(Registry.of([first, again, ready("m", "2", 0.1)]), "m", "1") is again


def test_unknown_models_and_versions_say_what_there_is() -> None:
    registry = Registry.of([ready("m", "1", 0.3), ready("m", "2"), ready("other", "1")])
    with pytest.raises(UnknownModel, match=r"unknown model 'nope' \(models: m, other\)"):
        choose(registry, "nope", "")
    with pytest.raises(UnknownModel, match=r"model 'm' has no version 9 \(versions: 1, 2\)"):
        choose(registry, "m", "9")


def test_an_event_with_a_bad_version_is_skipped_as_svc_model_dead_letters_it() -> None:
    with pytest.raises(UnknownModel):
        choose(Registry.of([ready("m", "v1")]), "m", "")
    assert choose(Registry.of([ready("m", "v1"), ready("m", "2")]), "m", "").version == "2"


TYPES = {
    "entity_id": "string",
    "window_start": "timestamp",
    "metric": "string",
    **{stat: "double" for stat in FEATURE_STATS},
    "count": "bigint",
}


def test_a_seven_wide_model_reads_the_offline_stores_feature_stats() -> None:
    chosen = plan(ready("m", "1"), TYPES)
    assert chosen.columns == FEATURE_STATS
    assert chosen.keys == ("entity_id", "window_start")
    assert chosen.row_shape == (7,)


def test_a_rows_sources_stay_out_of_the_output_unless_asked_for() -> None:
    types = {**TYPES, "sources": "array<struct<topic:string,partition:int>>"}
    assert plan(ready("m", "1"), types).keys == ("entity_id", "window_start")
    kept = plan(ready("m", "1"), types, row_sources=True)
    assert kept.keys == ("entity_id", "window_start", "sources")
    # Asked for where the input has none: nothing to keep.
    assert plan(ready("m", "1"), TYPES, row_sources=True).keys == ("entity_id", "window_start")


def test_named_columns_fill_the_input_row_major_and_a_wide_output_is_an_array() -> None:
    columns = [f"x{i}" for i in range(6)]
    event = ready("m", "1", shape=(-1, 2, 3), outputs=(("probabilities", (-1, 10)),))
    chosen = plan(event, {c: "float" for c in columns}, columns)
    assert chosen.columns == tuple(columns)
    assert chosen.row_shape == (2, 3)
    assert chosen.keys == ()
    assert chosen.outputs == (("probabilities", "float", False),)


@pytest.mark.parametrize(
    ("event", "columns", "message"),
    [
        (ready("m", "1"), ("mean", "nope", *FEATURE_STATS[2:]), "no column 'nope'"),
        (ready("m", "1"), ("mean", "entity_id", *FEATURE_STATS[2:]),
         "column 'entity_id' is string, expected a number"),
        (ready("m", "1"), ("mean",), "1 columns given; model 'm' version 1 input 'input' "
         r"\[-1, 7\] takes 7 values per row"),
        (ready("m", "1", shape=(-1, 8, 8)), (), "takes 64 values per row; name the columns"),
        (ready("m", "1", shape=(-1, -1)), (), "batch scoring needs"),
        (ready("m", "1", datatype="BYTES"), (), "is BYTES, not a number"),
        (ready("m", "1", outputs=(("entity_id", (-1, 1)),)), (), "has the name of an output"),
        (ready("m", "1", outputs=(("sources", (-1, 1)),)), (), "has the name of an output"),
    ],
)  # fmt: skip
def test_an_input_that_cannot_feed_the_model_is_refused_naming_why(
    event: models_pb2.ModelReady, columns: tuple[str, ...], message: str
) -> None:
    with pytest.raises(BadInput, match=message):
        plan(event, TYPES, columns)
