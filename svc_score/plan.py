"""What a scoring job will do, decided before Spark reads a row: which
version of the model, which input columns feed it, what the output holds.

Pure: no Spark, no Kafka, no model loaded. Every refusal is one line naming
what is wrong (``ScoreRefused`` and its subclasses).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.contracts.aistack.v1 import models_pb2
from shared.errors import InvalidArgument, NotFound
from shared.feature_store import FEATURE_STATS
from shared.model_loading import NUMPY_TYPES
from shared.model_registry import Registry
from shared.objective import version_number
from shared.settings import ServingPolicy

#: The columns that say which row a prediction is for, kept where the input
#: has them.
KEY_COLUMNS = ("entity_id", "window_start", "window_end", "window_key")
#: The offline store's clean-event offsets under each window: a row's own
#: lineage, kept in the output only on request (each output file's lineage
#: holds them merged either way).
ROW_SOURCES = "sources"
#: The output's columns naming the model that scored each row.
MODEL_COLUMNS = ("model_name", "model_version")

#: Spark SQL types (``DataType.simpleString``) a model input may be read from.
_NUMERIC = frozenset({"tinyint", "smallint", "int", "bigint", "float", "double"})
#: Spark SQL types of model outputs, by Open Inference Protocol datatype.
_OUTPUT_TYPES = {
    "FP16": "float",
    "FP32": "float",
    "FP64": "double",
    "INT8": "tinyint",
    "INT16": "smallint",
    "INT32": "int",
    "INT64": "bigint",
    "BOOL": "boolean",
}


class UnknownModel(NotFound):
    """The models topic has no such model, or not the version named."""

    reason = "unknown_model"


class BadInput(InvalidArgument):
    """The input cannot feed the model: a column missing, of a wrong type, or
    the model's signature is one batch scoring does not handle."""

    reason = "bad_input"


def parse_model(spec: str) -> tuple[str, str]:
    """``MODEL`` or ``MODEL@VERSION`` as (name, version); version "" for the
    champion. Raises InvalidArgument."""
    name, _, version = spec.partition("@")
    if not name:
        raise InvalidArgument(f"expected MODEL or MODEL@VERSION, got {spec!r}")
    if version:
        version_number(version)
    return name, version


def choose(
    registry: Registry, name: str, version: str, policy: ServingPolicy = "champion"
) -> models_pb2.ModelReady:
    """Version ``version`` of ``name`` (the last event published for it), or,
    for "", the version the model server serves under ``policy``. Raises
    UnknownModel."""
    try:
        return registry.version(name, version, policy)
    except NotFound as exc:
        raise UnknownModel(str(exc)) from exc


@dataclass(frozen=True)
class Plan:
    """How one model version scores one input."""

    event: models_pb2.ModelReady
    columns: tuple[str, ...]  # fed in this order, row-major into the input's shape
    row_shape: tuple[int, ...]  # the input's shape without its batch dimension
    keys: tuple[str, ...]
    outputs: tuple[tuple[str, str, bool], ...]  # (name, Spark type, one value per row)


def plan(
    event: models_pb2.ModelReady,
    input_types: Mapping[str, str],
    columns: Sequence[str] = (),
    *,
    row_sources: bool = False,
) -> Plan:
    """Check that an input with these column types (name → Spark SQL type)
    can feed ``event``'s model, fed from ``columns`` or, when none are named
    and the model takes one row of as many values, the offline store's
    ``FEATURE_STATS``; with ``row_sources``, each row keeps the input's
    ``ROW_SOURCES``. Raises BadInput."""
    model = f"model {event.model_name!r} version {event.version}"
    if len(event.inputs) != 1:
        raise BadInput(f"{model} takes {len(event.inputs)} inputs; batch scoring feeds one")
    spec = event.inputs[0]
    if spec.datatype not in NUMPY_TYPES:
        raise BadInput(f"{model}: input {spec.name!r} is {spec.datatype}, not a number")
    shape = tuple(int(d) for d in spec.shape)
    if len(shape) < 2 or shape[0] != -1 or any(d < 1 for d in shape[1:]):
        raise BadInput(
            f"{model}: input {spec.name!r} has shape {list(shape)}; "
            "batch scoring needs [-1, N, ...] with fixed sizes after the batch"
        )
    width = math.prod(shape[1:])
    if columns:
        if len(columns) != width:
            raise BadInput(
                f"{len(columns)} columns given; {model} input {spec.name!r} "
                f"{list(shape)} takes {width} values per row"
            )
        chosen = tuple(columns)
    elif width == len(FEATURE_STATS):
        chosen = FEATURE_STATS
    else:
        raise BadInput(
            f"{model} input {spec.name!r} {list(shape)} takes {width} values per row; "
            "name the columns with --columns"
        )
    for column in chosen:
        if column not in input_types:
            raise BadInput(f"the input has no column {column!r}")
        if input_types[column] not in _NUMERIC:
            raise BadInput(
                f"column {column!r} is {input_types[column]}, expected a number "
                f"({', '.join(sorted(_NUMERIC))})"
            )
    outputs: list[tuple[str, str, bool]] = []
    for out in event.outputs:
        spark_type = _OUTPUT_TYPES.get(out.datatype)
        out_shape = [int(d) for d in out.shape]
        if spark_type is None or not out_shape or out_shape[0] != -1:
            raise BadInput(
                f"{model}: output {out.name!r} ({out.datatype} {out_shape}) is not a batched number"
            )
        outputs.append((out.name, spark_type, math.prod(out_shape[1:]) == 1))
    taken = {*KEY_COLUMNS, ROW_SOURCES, *MODEL_COLUMNS} & {name for name, _, _ in outputs}
    if taken:
        raise BadInput(f"{model}: output {sorted(taken)[0]!r} has the name of an output column")
    kept = (*KEY_COLUMNS, ROW_SOURCES) if row_sources else KEY_COLUMNS
    keys = tuple(key for key in kept if key in input_types)
    return Plan(event, chosen, shape[1:], keys, tuple(outputs))
