"""A prediction from svc_model through the stock Open Inference Protocol
client (tritonclient's gRPC client, the ``client`` extra), as any KServe or
Triton user calls it.

tritonclient registers the protobuf package ``inference``, so this module
never imports ``shared.contracts.inference`` (nor anything that does): a
process that predicts through it must not load aistack's own copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shared.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable

#: The typed contents field of each protocol datatype.
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


@dataclass(frozen=True)
class Prediction:
    """What the server answered: which version served, and each output."""

    model: str
    version: str
    outputs: dict[str, NDArray[Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Server:
    """Where svc_model answers, and how to reach it."""

    target: str = "localhost:8001"
    token: str | None = None
    tls_ca_file: Path | None = None
    # For a server that asks for a client certificate (mutual TLS).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None


def predict(
    server: Server,
    model: str,
    inputs: NDArray[Any] | Mapping[str, NDArray[Any]] | None = None,
    *,
    version: str = "",
    entity: str | None = None,
    feature: str = "",
    open_window: bool = False,
) -> Prediction:
    """Run ``model`` (its champion, or ``version``) on ``inputs`` (one array
    for a one-input model, one example or a batch; or arrays by input name),
    or on an entity's latest features in the online store (``entity``, and
    ``feature`` when the model names none; ``open_window`` for the window
    still open). Raises NotFound, Unavailable, InvalidArgument."""
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException, triton_to_np_dtype

    headers = {"authorization": f"Bearer {server.token}"} if server.token else None
    ca = str(server.tls_ca_file) if server.tls_ca_file else None
    client = triton.InferenceServerClient(
        server.target,
        ssl=bool(ca),
        root_certificates=ca,
        private_key=str(server.tls_key_file) if server.tls_key_file else None,
        certificate_chain=str(server.tls_cert_file) if server.tls_cert_file else None,
    )
    try:
        metadata = client.get_model_metadata(model, version, headers=headers, as_json=True)
        tensors, parameters = [], {}
        if entity is not None:
            parameters["entity_id"] = entity
            if feature:
                parameters["feature"] = feature
            if open_window:
                parameters["window"] = "open"
        else:
            if inputs is None:
                raise InvalidArgument("give inputs, or an entity to predict from")
            arrays = _by_name(inputs, metadata["inputs"], model)
            for spec in metadata["inputs"]:
                array = np.asarray(arrays[spec["name"]]).astype(
                    triton_to_np_dtype(spec["datatype"])
                )
                if len(spec["shape"]) == array.ndim + 1:
                    array = array[np.newaxis]  # one example: add the batch dimension
                tensor = triton.InferInput(spec["name"], list(array.shape), spec["datatype"])
                tensor.set_data_from_numpy(array)
                tensors.append(tensor)
        result = client.infer(
            model,
            tensors,
            model_version=version,
            headers=headers,
            parameters=parameters or None,
        )
    except InferenceServerException as exc:
        status = str(exc.status() or "")
        message = exc.message() or str(exc)
        if "NOT_FOUND" in status:
            raise NotFound(message) from exc
        if "UNAVAILABLE" in status:
            raise Unavailable(f"{server.target}: {message}") from exc
        raise InvalidArgument(f"{status}: {message}") from exc
    finally:
        client.close()
    response = result.get_response()
    outputs = {o["name"]: output_array(result, o["name"]) for o in metadata["outputs"]}
    return Prediction(response.model_name, response.model_version, outputs)


def _by_name(
    inputs: NDArray[Any] | Mapping[str, NDArray[Any]], specs: list[dict[str, Any]], model: str
) -> Mapping[str, NDArray[Any]]:
    if isinstance(inputs, Mapping):
        missing = [s["name"] for s in specs if s["name"] not in inputs]
        if missing:
            raise InvalidArgument(f"model {model} takes inputs {missing} too")
        return inputs
    if len(specs) != 1:
        raise FailedPrecondition(f"model {model} takes {len(specs)} inputs: give them by name")
    return {specs[0]["name"]: np.asarray(inputs)}


def output_array(result: Any, name: str) -> NDArray[Any]:
    """Output ``name`` of a tritonclient result, raw or typed: tritonclient's
    ``as_numpy`` reads raw contents only, and the server answers a request
    without raw inputs (one by entity) with typed contents, as the protocol
    allows."""
    response = result.get_response()
    if response.raw_output_contents:
        return np.asarray(result.as_numpy(name))
    for output in response.outputs:
        if output.name == name:
            values = getattr(output.contents, _CONTENTS[output.datatype])
            return np.asarray(list(values)).reshape(list(output.shape))
    raise FailedPrecondition(f"the response has no output {name!r}")
